/* The data plane of host rings (gpuipc.h, docs/design.md "Rings"): acquire and publish, take and
 * release, in shared memory with futex doorbells. Nothing here reads the socket, allocates, waits
 * for the broker or takes the connection's lock (ring-internal.h says how it meets the control
 * plane; tests/unit/ring-data-symbols.sh checks it).
 *
 * Who writes what (proto/ring.h): the producer writes the control page and the slots, member i its
 * page. Each side reads the other's memory as untrusted input: the producer through
 * ring_member_view, a member checking every index and sequence number before use. So a member that
 * scribbles over its own page can stall its own frames (and the producer up to the lease), never
 * another member's, and a member never returns a frame it cannot vouch for.
 *
 * Every hand-over is a store, a sequentially consistent fence, and a load on each side:
 *   - a held frame: the producer marks the slot it is about to write (slot_seq = 0), fences, then
 *     looks at what members hold; a member says what it holds (held / released), fences, then checks
 *     the slot still holds that frame. One of the two sees the other, so no frame is overwritten
 *     while a member holds it, or the member learns it did not get it;
 *   - a doorbell: a member says it sleeps, fences, looks at head once more, then futex-waits on the
 *     doorbell value it read before; the producer moves head and the doorbell, fences, then wakes
 *     whoever said it sleeps. Nobody sleeps through a publish. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "futex.h"
#include "macro.h"
#include "ring-internal.h"

/* Latest mode: how many newer heads one attempt at a take follows before it lets the take's loop
 * look at its deadline and the ring's end (a producer faster than the member's look, or one that
 * moves head without publishing). */
#define LATEST_TRIES 16

int ring_min_timeout(int a, int b)
{
        if (a < 0)
                return b;
        if (b < 0)
                return a;
        return a < b ? a : b;
}

void ring_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
}

/* ---- the producer's seats ---- */

/* The first frame a member seated now takes. Backpressure: while the ring is young (no slot has
 * been written twice: the frame being made goes into a fresh slot), its first frame, since every
 * frame since is still in its slot and none is being written over; so a member that was waiting
 * for the ring, and joined as soon as it appeared, misses none of the frames published before the
 * broker's news of it reached us. Later (and in the other modes): the next publish. */
static uint64_t seat_start(const gpuipc_ring_t *r)
{
        return r->mode == RING_BACKPRESSURE && r->next <= r->n_slots ? 1 : r->next;
}

void ring_seat_activate(gpuipc_ring_t *r, uint32_t i, uint64_t epoch)
{
        volatile RingMemberSlot *s = &r->ctl->member[i];
        uint64_t start = seat_start(r);

        /* A stream ring's counters are reset before the member can see its seat. Should that fail
         * (a CUDA error), the seat is not handed out: the member's take then times out. */
        if (r->mode == RING_STREAM && ring_stream_seat_reset(r, i, r->next) < 0)
                return;
        /* start and epoch are stored before the state (release): a member that reads its epoch
         * there also reads its start. */
        r->seat[i] = (Seat){ .active = true, .epoch = epoch, .start = start, .renew = r->seat[i].renew,
                             .replaced = r->seat[i].replaced };
        s->start = start;
        __atomic_store_n(&s->epoch, epoch, __ATOMIC_RELEASE);
        __atomic_store_n(&s->state, RING_MEMBER_ACTIVE, __ATOMIC_RELEASE);
}

void ring_seat_deactivate(gpuipc_ring_t *r, uint32_t i)
{
        if (!r->seat[i].active)
                return;
        r->seat[i].active = false;
        __atomic_store_n(&r->ctl->member[i].state, RING_MEMBER_FREE, __ATOMIC_RELEASE);
        /* Our stream must not stay queued behind a member that left. */
        if (r->mode == RING_STREAM)
                ring_stream_seat_unblock(r, i);
}

void ring_evict(gpuipc_ring_t *r, uint32_t i)
{
        /* The member counts as gone for us at once; the broker only keeps its books, so the control
         * plane tells it when it can make a request. */
        r->seat[i].evict_epoch = r->seat[i].epoch;
        r->evict_pending = true;
        ring_seat_deactivate(r, i);
        ring_control_kick(r);
}

/* ---- producer ---- */

/* Backpressure: which active member still holds the frame that frame r->next overwrites, or -1. */
static int ring_blocker(gpuipc_ring_t *r, uint64_t head)
{
        for (uint32_t i = 0; i < r->n_members; i++) {
                Seat *s = &r->seat[i];
                RingMemberView v;

                if (!s->active)
                        continue;
                v = ring_member_view(gpuipc_buffer_ptr(r->page_buf[i]), s->epoch, s->start, head);
                if (!ring_member_lets(&v, s->start, r->next, r->n_slots))
                        return (int)i;
                s->blocking_since = 0;
        }
        return -1;
}

/* How long a busy-wait may spin, in ns: the ring's spin_us, but never past the caller's deadline
 * (limit_ms left of it; <0: none), so a short timeout is not overrun by the spin. */
static uint64_t spin_budget_ns(const gpuipc_ring_t *r, int limit_ms)
{
        uint64_t spin_ns = (uint64_t)r->spin_us * 1000;

        return limit_ms >= 0 && (uint64_t)limit_ms * 1000000 < spin_ns ? (uint64_t)limit_ms * 1000000 : spin_ns;
}

/* Busy-waits up to spin_us (and limit_ms) for the member of page m (seat `s`) to let frame
 * r->next through; without r->lock, so reading only that page (mapped until the seat's next
 * renewal but one). */
static bool spin_until_free(gpuipc_ring_t *r, const volatile RingMember *m, Seat s, uint64_t head, int limit_ms)
{
        uint64_t t0 = monotonic_ns(), spin_ns = spin_budget_ns(r, limit_ms);

        for (unsigned k = 0;; k++) {
                RingMemberView v = ring_member_view(m, s.epoch, s.start, head);

                if (ring_member_lets(&v, s.start, r->next, r->n_slots))
                        return true;
                ring_cpu_relax();
                /* The clock costs more than a look at the page: read it every 64 looks. */
                if (k % 64 == 63 && monotonic_ns() - t0 >= spin_ns)
                        return false;
        }
}

/* Backpressure, under r->lock (released while it waits): waits until the slot of frame r->next is
 * free. */
static int wait_for_members(gpuipc_ring_t *r, uint64_t deadline)
{
        unsigned fruitless = 0;

        for (;;) {
                uint64_t head = __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE), now;
                int b = ring_blocker(r, head), left, slice;
                volatile RingMember *page;
                Seat seat;
                uint32_t word;

                if (b < 0)
                        return 0;
                now = monotonic_ms();
                if (!r->seat[b].blocking_since)
                        r->seat[b].blocking_since = now;
                if (now - r->seat[b].blocking_since >= r->lease_ms) {
                        ring_evict(r, (uint32_t)b);
                        continue;
                }
                left = client_remaining_ms(deadline);
                if (left == 0) {
                        client_errmsg(r->conn, "ring '%s': member %d still holds frame %llu", r->name, b,
                                      (unsigned long long)(r->next - r->n_slots));
                        return GPUIPC_E_TIMEOUT;
                }
                page = gpuipc_buffer_ptr(r->page_buf[b]);
                seat = r->seat[b];
                slice = ring_min_timeout(left, RING_SLEEP_SLICE_MS);
                slice = ring_min_timeout(slice, (int)(r->seat[b].blocking_since + r->lease_ms - now));
                /* The control plane may change seats meanwhile (a member left, another joined). */
                pthread_mutex_unlock(&r->lock);
                if (!r->spin_us || !spin_until_free(r, page, seat, head, left)) {
                        /* Sleep on its release word: say so, fence, look once more, then wait. */
                        word = __atomic_load_n(&page->wake, __ATOMIC_ACQUIRE);
                        __atomic_store_n(&r->ctl->producer_waiting, 1, __ATOMIC_RELAXED);
                        __atomic_thread_fence(__ATOMIC_SEQ_CST);
                        RingMemberView v = ring_member_view(page, seat.epoch, seat.start, head);
                        if (!ring_member_lets(&v, seat.start, r->next, r->n_slots) &&
                            futex_wait(&page->wake, word, slice) == 0 && ++fruitless % 64 == 0)
                                usleep(1000); /* a member that bumps its word for nothing costs us little */
                        __atomic_store_n(&r->ctl->producer_waiting, 0, __ATOMIC_RELAXED);
                }
                pthread_mutex_lock(&r->lock);
        }
}

/* Latest mode: a slot nobody holds, not the newest frame's; marked as being written. The producer
 * says it means to write a slot (intent), fences, then looks at what members hold; a member says
 * what it holds, fences, then checks nobody means to write it. slot_seq itself changes only once
 * the producer is sure, so a member's check on release is exact. */
static int pick_free_slot(gpuipc_ring_t *r)
{
        uint64_t head = __atomic_load_n(&r->ctl->head, __ATOMIC_RELAXED);
        uint32_t head_slot = r->ctl->head_slot;
        bool tried[RING_MAX_SLOTS] = { false };

        for (uint32_t round = 0; round < r->n_slots; round++) {
                int best = -1;
                uint64_t old;
                bool pinned = false;

                /* The oldest frame first (never-written slots have 0). */
                for (uint32_t s = 0; s < r->n_slots; s++)
                        if (!tried[s] && !(head && s == head_slot) &&
                            (best < 0 || r->ctl->slot_seq[s] < r->ctl->slot_seq[best]))
                                best = (int)s;
                if (best < 0)
                        break;
                tried[best] = true;
                old = r->ctl->slot_seq[best];
                __atomic_store_n(&r->ctl->intent[best], 1, __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                for (uint32_t i = 0; old && i < r->n_members && !pinned; i++) {
                        RingMemberView v;

                        if (!r->seat[i].active)
                                continue;
                        v = ring_member_view(gpuipc_buffer_ptr(r->page_buf[i]), r->seat[i].epoch, r->seat[i].start,
                                             head);
                        pinned = v.valid && v.held == old;
                }
                if (!pinned) {
                        __atomic_store_n(&r->ctl->slot_seq[best], 0, __ATOMIC_RELAXED);
                        __atomic_thread_fence(__ATOMIC_SEQ_CST);
                        return best;
                }
                __atomic_store_n(&r->ctl->intent[best], 0, __ATOMIC_RELEASE); /* still theirs */
        }
        client_errmsg(r->conn, "ring '%s': every slot is held by a member", r->name);
        return GPUIPC_E_BUSY;
}

/* The host calls (acquire/publish, take/release): r on the right side, and not stream-ordered. */
static int host_call(gpuipc_ring_t *r, bool producer)
{
        if (!r || r->producer != producer)
                return GPUIPC_E_INVALID;
        if (r->mode == RING_STREAM) {
                client_errmsg(r->conn, "ring '%s' is stream-ordered: use gpuipc_ring_stream_%s", r->name,
                              producer ? "acquire/publish" : "take/release");
                return GPUIPC_E_STATE;
        }
        return 0;
}

static int acquire_locked(gpuipc_ring_t *r, int timeout_ms)
{
        int s, e;

        if (r->writing >= 0)
                return 0;
        if (r->mode == RING_BACKPRESSURE) {
                e = wait_for_members(r, client_deadline(timeout_ms));
                if (e < 0)
                        return e;
                s = (int)((r->next - 1) % r->n_slots);
                /* Mark it: a member that took the old frame learns it was overwritten. */
                __atomic_store_n(&r->ctl->slot_seq[s], 0, __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
        } else {
                s = pick_free_slot(r);
                if (s < 0)
                        return s;
        }
        r->writing = s;
        return 0;
}

_public_ int gpuipc_ring_acquire(gpuipc_ring_t *r, int timeout_ms, gpuipc_buffer_t **ret_slot)
{
        int e;

        e = host_call(r, true);
        if (e < 0 || !ret_slot)
                return e < 0 ? e : GPUIPC_E_INVALID;
        pthread_mutex_lock(&r->lock);
        e = acquire_locked(r, timeout_ms);
        if (e == 0)
                *ret_slot = r->slot[r->writing];
        pthread_mutex_unlock(&r->lock);
        return e;
}

void ring_wake_sleepers(gpuipc_ring_t *r, uint64_t head)
{
        /* Against a member that is about to sleep: it said so (sleeping), then looks at head. */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        for (uint32_t i = 0; i < r->n_members; i++) {
                RingMemberView v;

                if (!r->seat[i].active)
                        continue;
                v = ring_member_view(gpuipc_buffer_ptr(r->page_buf[i]), r->seat[i].epoch, r->seat[i].start, head);
                if (v.sleeping) {
                        futex_wake(&r->ctl->doorbell, INT_MAX);
                        return;
                }
        }
}

static int publish_locked(gpuipc_ring_t *r, uint64_t *ret_frame)
{
        volatile RingCtl *ctl = r->ctl;
        uint64_t n = r->next;
        int s = r->writing, e;

        if (s < 0) {
                client_errmsg(r->conn, "ring '%s': acquire a slot before publishing", r->name);
                return GPUIPC_E_STATE;
        }
        if (kind_ops(r->slot[s]->kind)->sync) {
                e = kind_ops(r->slot[s]->kind)->sync(r->conn, r->slot[s]);
                if (e < 0)
                        return e;
        }
        __atomic_store_n(&ctl->slot_seq[s], n, __ATOMIC_RELEASE);
        __atomic_store_n(&ctl->intent[s], 0, __ATOMIC_RELEASE);
        __atomic_store_n(&ctl->head_slot, (uint32_t)s, __ATOMIC_RELAXED);
        __atomic_store_n(&ctl->head, n, __ATOMIC_RELEASE);
        __atomic_fetch_add(&ctl->doorbell, 1, __ATOMIC_RELEASE);
        ring_wake_sleepers(r, n);
        r->writing = -1;
        r->next++;
        if (ret_frame)
                *ret_frame = n;
        return 0;
}

_public_ int gpuipc_ring_publish(gpuipc_ring_t *r, uint64_t *ret_frame)
{
        int e = host_call(r, true);

        if (e < 0)
                return e;
        pthread_mutex_lock(&r->lock);
        e = publish_locked(r, ret_frame);
        pthread_mutex_unlock(&r->lock);
        return e;
}

/* ---- member ---- */

/* The control page said what no producer can (`what` is `value`): this member takes nothing more
 * from it. Set once (a take that races another for it leaves the first reason). */
static void member_distrust(gpuipc_ring_t *r, const char *what, uint64_t value)
{
        int none = 0;

        if (!__atomic_compare_exchange_n(&r->hostile, &none, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return;
        snprintf(r->hostile_why, sizeof(r->hostile_why),
                 "its producer is hostile: the control page says %s is %llu, past any frame a ring reaches", what,
                 (unsigned long long)value);
        __atomic_store_n(&r->hostile, 2, __ATOMIC_RELEASE);
}

/* Has the producer let us in yet (our epoch in our seat of the control page)? It does so as soon as
 * the broker told it we joined; we take frames from then on. Our page then says that everything
 * before our first frame counts as released; the epoch last, so that the producer believes the
 * page only once it is ours. */
bool ring_check_seated(gpuipc_ring_t *r)
{
        volatile RingMemberSlot *s = &r->ctl->member[r->index];
        uint64_t start;

        if (r->seated)
                return true;
        if (__atomic_load_n(&s->epoch, __ATOMIC_ACQUIRE) != r->epoch)
                return false;
        start = s->start;
        if (r->mode != RING_LATEST && start > RING_FRAME_MAX) {
                member_distrust(r, "this member's first frame", start);
                return false;
        }
        r->cursor = r->mode != RING_LATEST ? start : 0;
        r->page->released = r->mode != RING_LATEST && r->cursor ? r->cursor - 1 : 0;
        r->page->held = 0;
        r->page->taken = 0;
        __atomic_store_n(&r->page->epoch, r->epoch, __ATOMIC_RELEASE);
        __atomic_store_n(&r->seated, true, __ATOMIC_RELEASE);
        return true;
}

void ring_count_take(gpuipc_ring_t *r)
{
        /* We are the page's only writer; the broker reads it whenever, once, and clamps it. */
        uint64_t n = __atomic_load_n(&r->page->taken, __ATOMIC_RELAXED);

        __atomic_store_n(&r->page->taken, n + 1, __ATOMIC_RELAXED);
}

/* Was this member evicted (its seat given up by the producer)? */
bool ring_member_evicted(gpuipc_ring_t *r)
{
        volatile RingMemberSlot *s = &r->ctl->member[r->index];

        return r->seated && (__atomic_load_n(&s->epoch, __ATOMIC_ACQUIRE) != r->epoch ||
                             __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != RING_MEMBER_ACTIVE);
}

const char *ring_member_gone(gpuipc_ring_t *r)
{
        /* The producer's own word first: a ring it closed and then left (its parts revoked with it)
         * was closed, not lost. */
        if (r->ctl && __atomic_load_n(&r->ctl->closed, __ATOMIC_ACQUIRE))
                return "the producer closed the ring";
        if (__atomic_load_n(&r->gone, __ATOMIC_ACQUIRE))
                return r->gone_why;
        if (__atomic_load_n(&r->hostile, __ATOMIC_ACQUIRE) == 2)
                return r->hostile_why;
        if (ring_member_evicted(r))
                return "this member lost its seat (its producer evicted it: it held the ring up past its lease, "
                       "or did not take its seat back within a broker restart's grace)";
        return NULL;
}

/* The producer's own word, as a yes or no: bindings tell a closed ring from a lost one by it, never by
 * the text of gpuipc_errmsg (which is for people and may change). */
_public_ int gpuipc_ring_closed(gpuipc_ring_t *r)
{
        return r && !r->producer && r->ctl && __atomic_load_n(&r->ctl->closed, __ATOMIC_ACQUIRE) ? 1 : 0;
}

int ring_member_may_take(gpuipc_ring_t *r)
{
        if (r->taken < 0)
                return 0;
        client_errmsg(r->conn, "ring '%s': release frame %llu first", r->name, (unsigned long long)r->taken_frame);
        return GPUIPC_E_STATE;
}

int ring_member_alive(gpuipc_ring_t *r)
{
        /* The broker's news (an eviction, a dead producer, a restart) is read by the control plane,
         * which says so in r->gone. */
        const char *why = ring_member_gone(r);

        if (!why)
                return 0;
        client_errmsg(r->conn, "ring '%s': %s", r->name, why);
        return GPUIPC_E_REVOKED;
}

int ring_member_head(gpuipc_ring_t *r, uint64_t *ret_head)
{
        uint64_t head = __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE);
        int e;

        if (head <= RING_FRAME_MAX) {
                *ret_head = head;
                return 0;
        }
        member_distrust(r, "the newest frame", head);
        e = ring_member_alive(r);
        return e < 0 ? e : GPUIPC_E_REVOKED;
}

/* Backpressure: frame r->cursor, whose slot is s, as of now. Its slot is rewritten only for frame
 * cursor + K, which the producer acquires after publishing cursor + K - 1: with head below that the
 * frame is there (the release check covers the time it is held), so only a member that fell that
 * far behind reads slot_seq, a line the producer writes at every frame. */
static bool backpressure_frame_there(gpuipc_ring_t *r, uint64_t head, uint32_t s)
{
        if (head + 1 < r->cursor + r->n_slots)
                return true;
        return __atomic_load_n(&r->ctl->slot_seq[s], __ATOMIC_ACQUIRE) == r->cursor;
}

/* One attempt: 1 with the frame taken, 0 when there is none yet, or an error. Bounded whatever the
 * control page says: the caller's loop keeps the deadline and looks at the ring's end. */
static int try_take(gpuipc_ring_t *r)
{
        volatile RingCtl *ctl = r->ctl;
        uint64_t head, seen;
        uint32_t s;
        int e;

        if (!ring_check_seated(r))
                return 0;
        e = ring_member_head(r, &head);
        if (e < 0)
                return e;
        if (r->mode == RING_BACKPRESSURE) {
                if (head < r->cursor)
                        return 0;
                s = (uint32_t)((r->cursor - 1) % r->n_slots);
                if (!backpressure_frame_there(r, head, s)) {
                        client_errmsg(r->conn, "ring '%s': frame %llu was overwritten before this member took it",
                                      r->name, (unsigned long long)r->cursor);
                        return GPUIPC_E_REVOKED;
                }
                r->taken = (int)s;
                r->taken_frame = r->cursor;
                return 1;
        }
        for (unsigned tries = 1;; tries++) {
                if (head == 0 || head <= r->cursor)
                        return 0;
                s = __atomic_load_n(&ctl->head_slot, __ATOMIC_RELAXED);
                if (s >= r->n_slots) {
                        client_errmsg(r->conn, "ring '%s': its control page names slot %u of %u", r->name, s,
                                      r->n_slots);
                        return GPUIPC_E_BAD_REPLY;
                }
                /* Say what we hold, fence, then check nobody means to overwrite it and it is still
                 * there (the producer does the reverse: intent, fence, what members hold). */
                __atomic_store_n(&r->page->held, head, __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                if (!__atomic_load_n(&ctl->intent[s], __ATOMIC_ACQUIRE) &&
                    __atomic_load_n(&ctl->slot_seq[s], __ATOMIC_ACQUIRE) == head) {
                        r->taken = (int)s;
                        r->taken_frame = head;
                        return 1;
                }
                __atomic_store_n(&r->page->held, 0, __ATOMIC_RELEASE);
                /* Not there. The producer published again meanwhile: its newest frame, then. Or head
                 * stays: a producer in the middle of a publish, stopped there, or hostile; the
                 * caller then sleeps on the doorbell (the publish rings it) rather than looking
                 * again at once. So it does after a few frames that all moved on too fast. */
                seen = head;
                e = ring_member_head(r, &head);
                if (e < 0)
                        return e;
                if (head == seen || tries == LATEST_TRIES) {
                        r->stuck_head = seen;
                        return 0;
                }
        }
}

/* Whether head may bring a frame to take: past what this member took, and not the head whose frame
 * this take found missing. */
static bool frame_may_be_there(const gpuipc_ring_t *r, uint64_t head)
{
        return head >= (r->mode != RING_LATEST ? r->cursor : r->cursor + 1) && head != r->stuck_head;
}

/* Sleeps until the doorbell moves from `seen` (or timeout_ms), unless a frame is there already. Not
 * seated yet, we cannot say we sleep (the producer reads our page only once we are): its publish
 * rings the doorbell then anyway, but nobody wakes us for it, so we sleep in short slices. */
void ring_doorbell_sleep(gpuipc_ring_t *r, uint32_t seen, int timeout_ms)
{
        if (!r->seated) {
                (void)futex_wait(&r->ctl->doorbell, seen, ring_min_timeout(timeout_ms, 1));
                return;
        }
        __atomic_fetch_add(&r->page->sleeping, 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (!frame_may_be_there(r, __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE)) && !ring_member_gone(r))
                (void)futex_wait(&r->ctl->doorbell, seen, timeout_ms);
        __atomic_fetch_sub(&r->page->sleeping, 1, __ATOMIC_RELEASE);
}

/* Busy-waits up to spin_us (and limit_ms) for head to reach the next frame: true when it did. */
static bool spin_for_frame(gpuipc_ring_t *r, int limit_ms)
{
        uint64_t t0 = monotonic_ns(), spin_ns = spin_budget_ns(r, limit_ms);

        if (!r->seated)
                return false;
        for (unsigned k = 0;; k++) {
                if (frame_may_be_there(r, __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE)))
                        return true;
                ring_cpu_relax();
                /* The clock costs more than a look at head: read it every 64 looks. */
                if (k % 64 == 63 && (monotonic_ns() - t0 >= spin_ns || ring_member_gone(r)))
                        return false;
        }
}

static void drain_fd(gpuipc_ring_t *r)
{
        uint64_t v;

        if (r->efd >= 0)
                (void)!read(r->efd, &v, sizeof(v));
}

_public_ int gpuipc_ring_take(gpuipc_ring_t *r, int timeout_ms, gpuipc_buffer_t **ret_slot, uint64_t *ret_frame)
{
        uint64_t deadline = UINT64_MAX;
        bool drained = false, timed = false;
        int e;

        e = host_call(r, false);
        if (e < 0 || !ret_slot)
                return e < 0 ? e : GPUIPC_E_INVALID;
        e = ring_member_may_take(r);
        if (e < 0)
                return e;
        r->stuck_head = 0;
        for (;;) {
                uint32_t seen = __atomic_load_n(&r->ctl->doorbell, __ATOMIC_ACQUIRE);
                int left;

                e = ring_member_alive(r);
                if (e < 0)
                        return e;
                e = try_take(r);
                if (e < 0)
                        return e;
                if (e == 1)
                        break;
                /* The clock only once the frame is not there at once. */
                if (!timed) {
                        deadline = client_deadline(timeout_ms);
                        timed = true;
                }
                left = client_remaining_ms(deadline);
                if (left == 0) {
                        /* Event-loop users: reset the fd, then look once more (a frame that came
                         * meanwhile would otherwise wait for the next publish). */
                        if (r->efd >= 0 && !drained) {
                                drain_fd(r);
                                drained = true;
                                continue;
                        }
                        return GPUIPC_E_TIMEOUT;
                }
                if (r->spin_us && spin_for_frame(r, left))
                        continue;
                ring_doorbell_sleep(r, seen, ring_min_timeout(left, 100));
        }
        ring_count_take(r);
        *ret_slot = r->slot[r->taken];
        if (ret_frame)
                *ret_frame = r->taken_frame;
        return 0;
}

_public_ int gpuipc_ring_release(gpuipc_ring_t *r)
{
        uint64_t n;
        bool intact;
        int s, e;

        e = host_call(r, false);
        if (e < 0)
                return e;
        if (r->taken < 0) {
                client_errmsg(r->conn, "ring '%s': no frame is taken", r->name);
                return GPUIPC_E_STATE;
        }
        s = r->taken;
        n = r->taken_frame;
        /* Still ours when we let go? Then it did not change while we held it (a closed ring or a dead
         * producer writes nothing; only an evicted member may have lost its frame). */
        intact = __atomic_load_n(&r->ctl->slot_seq[s], __ATOMIC_ACQUIRE) == n && !ring_member_evicted(r);
        if (r->mode == RING_BACKPRESSURE) {
                __atomic_store_n(&r->page->released, n, __ATOMIC_RELEASE);
                r->cursor = n + 1;
        } else {
                __atomic_store_n(&r->page->held, 0, __ATOMIC_RELEASE);
                r->cursor = n;
        }
        __atomic_fetch_add(&r->page->wake, 1, __ATOMIC_RELEASE);
        /* Against the producer that is about to sleep on our word: it said so, then looks. */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(&r->ctl->producer_waiting, __ATOMIC_ACQUIRE))
                futex_wake(&r->page->wake, 1);
        r->taken = -1;
        if (!intact) {
                client_errmsg(r->conn, "ring '%s': frame %llu was overwritten while held (%s)", r->name,
                              (unsigned long long)n, ring_member_evicted(r) ? ring_member_gone(r) : "the slot changed");
                return GPUIPC_E_REVOKED;
        }
        return 0;
}

_public_ void gpuipc_ring_set_spin(gpuipc_ring_t *r, unsigned spin_us)
{
        if (r)
                r->spin_us = spin_us;
}
