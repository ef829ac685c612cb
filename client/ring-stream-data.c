/* The data plane of stream-ordered rings (gpuipc.h, docs/design.md "Rings"): acquire, publish,
 * take and release queue their hand-over into the caller's CUDA stream. Each seat has a small
 * cuda-vmm buffer of two counters: "frame n is ready", which the producer's stream writes after the
 * work that filled slot (n - 1) mod K, and "frame n is done", which the member's stream writes after
 * the work that read it. The producer's stream waits until every seated member's "done" has reached
 * n - K before it overwrites that slot; a member's stream waits until its "ready" has reached n.
 * cuStreamWriteValue64 puts a memory barrier before its write (the default flags), so whoever sees
 * the new value sees the work before it. cuda-vmm memory crosses PID namespaces, where CUDA IPC
 * events do not.
 *
 * The host never waits for a frame, only for what bounds it: a producer does not run more than K
 * frames ahead of its own stream (an event per slot), a member not more than K frames ahead of what
 * the producer has published. That is also where the lease is kept: when the producer's stream has
 * not got past a frame for longer than the lease, the members whose "done" is behind are evicted,
 * and their "done" counter set so high that no wait on it blocks again. The same happens when a
 * member leaves or dies, and a member unblocks its own "ready" when its producer is gone: a stream
 * never stays stuck on a peer that left.
 *
 * Like ring-data.c this is the data plane: CUDA stream operations, shared memory and futexes, never
 * the socket, an allocation or the connection's lock.
 *
 * Trust: a member can write only its own counters (and its page); a value there can hold up its own
 * frames, and the producer's stream only until the lease, never another member's. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "futex.h"
#include "macro.h"
#include "ring-internal.h"

/* How long a producer at its run-ahead bound polls its stream's event before it sleeps between
 * looks (a look is a cheap driver call; the frame it waits for is usually tens of us away). */
#define STREAM_POLL_SPIN_NS 20000
#define STREAM_POLL_SLEEP_NS 10000

GcuDevicePtr ring_counter_at(const gpuipc_buffer_t *b, size_t offset)
{
        return (GcuDevicePtr)(uintptr_t)b->ptr + offset;
}

/* Writes a counter from the host through our side stream: it must not queue behind the caller's
 * streams, which may be waiting on exactly this counter. */
int ring_stream_counter_set(gpuipc_ring_t *r, GcuDevicePtr where, uint64_t value)
{
        GcuResult cr = CU(cuStreamWriteValue64, r->side, where, value, GCU_STREAM_WRITE_VALUE_DEFAULT);

        if (cr == GCU_SUCCESS)
                cr = CU(cuStreamSynchronize, r->side);
        return cr == GCU_SUCCESS ? 0 : cuda_error(r->conn, "cuStreamWriteValue64", cr);
}

int ring_stream_counter_get(gpuipc_ring_t *r, GcuDevicePtr where, uint64_t *ret)
{
        GcuResult cr = CU(cuMemcpyDtoHAsync, ret, where, sizeof(*ret), r->side);

        if (cr == GCU_SUCCESS)
                cr = CU(cuStreamSynchronize, r->side);
        return cr == GCU_SUCCESS ? 0 : cuda_error(r->conn, "cuMemcpyDtoHAsync", cr);
}

int ring_stream_seat_reset(gpuipc_ring_t *r, uint32_t i, uint64_t start)
{
        /* Waits still queued for the seat's last member asked for frames before start: start - 1
         * lets them through, and the new member's first wait (start) holds. */
        uint64_t v = start ? start - 1 : 0;
        int e = IN_CTX(r, ring_stream_counter_set(r, ring_counter_at(r->counter_buf[i], RING_COUNTER_DONE), v));

        return e == 0 ? IN_CTX(r, ring_stream_counter_set(r, ring_counter_at(r->counter_buf[i], RING_COUNTER_READY), v))
                      : e;
}

void ring_stream_seat_unblock(gpuipc_ring_t *r, uint32_t i)
{
        (void)IN_CTX(r, ring_stream_counter_set(r, ring_counter_at(r->counter_buf[i], RING_COUNTER_DONE),
                                                RING_UNBLOCKED));
}

/* Member: lets every wait our streams queued on "ready" through (the producer is gone, or we are). */
static void member_unblock(gpuipc_ring_t *r)
{
        if (r->counter_part && r->side)
                (void)IN_CTX(r, ring_stream_counter_set(r, ring_counter_at(r->counter_part, RING_COUNTER_READY),
                                                        RING_UNBLOCKED));
}

static int check_call(gpuipc_ring_t *r, bool producer, GcuStream s)
{
        int e;

        if (!r || r->producer != producer)
                return GPUIPC_E_INVALID;
        if (r->mode != RING_STREAM) {
                client_errmsg(r->conn, "ring '%s' is not stream-ordered: use gpuipc_ring_%s", r->name,
                              producer ? "acquire/publish" : "take/release");
                return GPUIPC_E_STATE;
        }
        /* A loop passes the same stream every frame: its device is checked once. */
        if (s && s == r->checked)
                return 0;
        e = cuda_check_stream(r->conn, r->ordinal, s, "the ring lives on");
        if (e == 0)
                r->checked = s;
        return e;
}

/* ---- producer ---- */

/* Past the lease at slot s: the members whose "done" is behind the frame the wait needs. */
static void evict_laggards(gpuipc_ring_t *r)
{
        /* The wait queued for frame r->next - K needed frame r->next - 2K released. */
        uint64_t need = r->next > 2 * (uint64_t)r->n_slots ? r->next - 2 * (uint64_t)r->n_slots : 0;

        for (uint32_t i = 0; i < r->n_members; i++) {
                uint64_t done = 0;

                if (!r->seat[i].active || r->seat[i].start > need)
                        continue;
                if (ring_stream_counter_get(r, ring_counter_at(r->counter_buf[i], RING_COUNTER_DONE), &done) == 0 &&
                    done < need)
                        ring_evict(r, i); /* unblocks its counter too */
        }
}

/* Waits (host) until the producer's own stream has got past the frame that last used slot s: then
 * at most K frames are queued. Past the lease, evicts the members holding it up. Under r->lock,
 * which it lets go of while it sleeps. */
static int wait_slot_done(gpuipc_ring_t *r, uint32_t s, uint64_t deadline)
{
        uint64_t since = monotonic_ms(), t0 = monotonic_ns();
        uint64_t spin_ns = r->spin_us ? (uint64_t)r->spin_us * 1000 : STREAM_POLL_SPIN_NS;

        for (;;) {
                GcuResult cr;
                int left;

                if (!r->done_used[s])
                        return 0;
                cr = CU(cuEventQuery, r->done[s]);
                if (cr == GCU_SUCCESS)
                        return 0;
                if (cr != GCU_ERROR_NOT_READY)
                        return cuda_error(r->conn, "cuEventQuery", cr);
                if (monotonic_ms() - since >= r->lease_ms) {
                        evict_laggards(r);
                        since = monotonic_ms();
                }
                left = client_remaining_ms(deadline);
                if (left == 0) {
                        client_errmsg(r->conn, "ring '%s': the producer's stream has not got past frame %llu", r->name,
                                      (unsigned long long)(r->next - r->n_slots));
                        return GPUIPC_E_TIMEOUT;
                }
                /* Look again soon: the stream is usually about to get there. First busily, then in
                 * short sleeps, without r->lock (the control plane may seat or unseat members). */
                pthread_mutex_unlock(&r->lock);
                if (monotonic_ns() - t0 < spin_ns) {
                        ring_cpu_relax();
                } else {
                        struct timespec ts = { 0, STREAM_POLL_SLEEP_NS };
                        nanosleep(&ts, NULL);
                }
                pthread_mutex_lock(&r->lock);
        }
}

static int acquire_in_ctx(gpuipc_ring_t *r, GcuStream st, uint64_t deadline, uint32_t s)
{
        int e = wait_slot_done(r, s, deadline);
        uint64_t n = r->next;

        if (e < 0 || n <= r->n_slots)
                return e;
        for (uint32_t i = 0; i < r->n_members; i++) {
                GcuResult cr;

                /* A member that joined after frame n - K never had it. */
                if (!r->seat[i].active || r->seat[i].start > n - r->n_slots)
                        continue;
                cr = CU(cuStreamWaitValue64, st, ring_counter_at(r->counter_buf[i], RING_COUNTER_DONE),
                        n - r->n_slots, GCU_STREAM_WAIT_VALUE_GEQ);
                if (cr != GCU_SUCCESS)
                        return cuda_error(r->conn, "cuStreamWaitValue64", cr);
        }
        return 0;
}

_public_ int gpuipc_ring_stream_acquire(gpuipc_ring_t *r, void *cu_stream, int timeout_ms, gpuipc_buffer_t **ret_slot)
{
        uint32_t s;
        int e;

        if (!ret_slot)
                return GPUIPC_E_INVALID;
        e = check_call(r, true, cu_stream);
        if (e < 0)
                return e;
        pthread_mutex_lock(&r->lock);
        if (r->writing < 0) {
                s = (uint32_t)((r->next - 1) % r->n_slots);
                e = IN_CTX(r, acquire_in_ctx(r, cu_stream, client_deadline(timeout_ms), s));
                if (e == 0)
                        r->writing = (int)s;
        }
        if (e == 0)
                *ret_slot = r->slot[r->writing];
        pthread_mutex_unlock(&r->lock);
        return e;
}

/* Publish: the retired counters' events go behind this frame's work (and so behind every wait and
 * write queued on them before); the control plane frees them once they completed. */
static int retired_record(gpuipc_ring_t *r, GcuStream st)
{
        bool recorded = false;

        for (uint32_t j = 0; j < r->n_retired; j++) {
                GcuResult cr;

                if (r->retired[j].recorded)
                        continue;
                cr = CU(cuEventRecord, r->retired[j].past, st);
                if (cr != GCU_SUCCESS)
                        return cuda_error(r->conn, "cuEventRecord", cr);
                r->retired[j].recorded = recorded = true;
        }
        if (recorded)
                ring_control_kick(r);
        return 0;
}

static int publish_in_ctx(gpuipc_ring_t *r, GcuStream st, uint32_t s, uint64_t n)
{
        GcuResult cr;

        for (uint32_t i = 0; i < r->n_members; i++) {
                if (!r->seat[i].active || r->seat[i].start > n)
                        continue;
                cr = CU(cuStreamWriteValue64, st, ring_counter_at(r->counter_buf[i], RING_COUNTER_READY), n,
                        GCU_STREAM_WRITE_VALUE_DEFAULT);
                if (cr != GCU_SUCCESS)
                        return cuda_error(r->conn, "cuStreamWriteValue64", cr);
        }
        cr = CU(cuEventRecord, r->done[s], st);
        if (cr != GCU_SUCCESS)
                return cuda_error(r->conn, "cuEventRecord", cr);
        r->done_used[s] = true;
        return retired_record(r, st);
}

static int stream_publish_locked(gpuipc_ring_t *r, void *cu_stream, uint64_t *ret_frame)
{
        uint64_t n = r->next;
        int s = r->writing, e;

        if (s < 0) {
                client_errmsg(r->conn, "ring '%s': acquire a slot before publishing", r->name);
                return GPUIPC_E_STATE;
        }
        e = IN_CTX(r, publish_in_ctx(r, cu_stream, (uint32_t)s, n));
        if (e < 0)
                return e;
        /* The host's view (what members bound their run-ahead by, and where new members start):
         * frame n is queued. */
        __atomic_store_n(&r->ctl->slot_seq[s], n, __ATOMIC_RELEASE);
        __atomic_store_n(&r->ctl->head_slot, (uint32_t)s, __ATOMIC_RELAXED);
        __atomic_store_n(&r->ctl->head, n, __ATOMIC_RELEASE);
        __atomic_fetch_add(&r->ctl->doorbell, 1, __ATOMIC_RELEASE);
        ring_wake_sleepers(r, n);
        r->writing = -1;
        r->next++;
        if (ret_frame)
                *ret_frame = n;
        return 0;
}

_public_ int gpuipc_ring_stream_publish(gpuipc_ring_t *r, void *cu_stream, uint64_t *ret_frame)
{
        int e = check_call(r, true, cu_stream);

        if (e < 0)
                return e;
        pthread_mutex_lock(&r->lock);
        e = stream_publish_locked(r, cu_stream, ret_frame);
        pthread_mutex_unlock(&r->lock);
        return e;
}

/* ---- member ---- */

/* Seated, and not more than K frames ahead of what the producer has queued: 0, or why not. */
static int await_room(gpuipc_ring_t *r, int timeout_ms)
{
        uint64_t deadline = UINT64_MAX;
        bool timed = false;

        for (;;) {
                uint32_t seen = __atomic_load_n(&r->ctl->doorbell, __ATOMIC_ACQUIRE);
                int e = ring_member_alive(r), left;

                if (e < 0) {
                        member_unblock(r);
                        return e;
                }
                if (ring_check_seated(r)) {
                        uint64_t head;

                        e = ring_member_head(r, &head);
                        if (e < 0) {
                                member_unblock(r);
                                return e;
                        }
                        if (r->cursor <= head + r->n_slots)
                                return 0;
                }
                if (!timed) {
                        deadline = client_deadline(timeout_ms);
                        timed = true;
                }
                left = client_remaining_ms(deadline);
                if (left == 0) {
                        client_errmsg(r->conn, "ring '%s': %s", r->name,
                                      r->seated ? "this member runs too far ahead of its producer"
                                                : "its producer did not let this member in yet");
                        return GPUIPC_E_TIMEOUT;
                }
                ring_doorbell_sleep(r, seen, ring_min_timeout(left, 100));
        }
}

_public_ int gpuipc_ring_stream_take(gpuipc_ring_t *r, void *cu_stream, int timeout_ms, gpuipc_buffer_t **ret_slot,
                                     uint64_t *ret_frame)
{
        uint64_t n;
        GcuResult cr;
        int e;

        if (!ret_slot)
                return GPUIPC_E_INVALID;
        e = check_call(r, false, cu_stream);
        if (e == 0)
                e = ring_member_may_take(r);
        if (e == 0)
                e = await_room(r, timeout_ms);
        if (e < 0)
                return e;
        n = r->cursor;
        e = cuda_ctx_push(r->conn, r->ordinal);
        if (e < 0)
                return e;
        cr = CU(cuStreamWaitValue64, cu_stream, ring_counter_at(r->counter_part, RING_COUNTER_READY), n,
                GCU_STREAM_WAIT_VALUE_GEQ);
        e = cuda_ctx_pop(r->conn, cr == GCU_SUCCESS ? 0 : cuda_error(r->conn, "cuStreamWaitValue64", cr));
        if (e < 0)
                return e;
        r->taken = (int)((n - 1) % r->n_slots);
        r->taken_frame = n;
        ring_count_take(r);
        *ret_slot = r->slot[r->taken];
        if (ret_frame)
                *ret_frame = n;
        return 0;
}

_public_ int gpuipc_ring_stream_release(gpuipc_ring_t *r, void *cu_stream)
{
        GcuResult cr;
        int e;

        e = check_call(r, false, cu_stream);
        if (e < 0)
                return e;
        if (r->taken < 0) {
                client_errmsg(r->conn, "ring '%s': no frame is taken", r->name);
                return GPUIPC_E_STATE;
        }
        e = cuda_ctx_push(r->conn, r->ordinal);
        if (e < 0)
                return e;
        cr = CU(cuStreamWriteValue64, cu_stream, ring_counter_at(r->counter_part, RING_COUNTER_DONE), r->taken_frame,
                GCU_STREAM_WRITE_VALUE_DEFAULT);
        e = cuda_ctx_pop(r->conn, cr == GCU_SUCCESS ? 0 : cuda_error(r->conn, "cuStreamWriteValue64", cr));
        if (e < 0)
                return e;
        /* The host side knows the frame as released once it is queued (the stream does the rest). */
        __atomic_store_n(&r->page->released, r->taken_frame, __ATOMIC_RELEASE);
        r->cursor = r->taken_frame + 1;
        r->taken = -1;
        /* Evicted while it held the frame: the producer no longer waited for it, so the work on it
         * may have read a newer frame. (An eviction after this point, while the stream still reads,
         * is reported by the next take: the stream cannot be asked.) */
        if (ring_member_evicted(r)) {
                client_errmsg(r->conn, "ring '%s': frame %llu may have been overwritten while held (%s)", r->name,
                              (unsigned long long)(r->cursor - 1), ring_member_gone(r));
                return GPUIPC_E_REVOKED;
        }
        return 0;
}
