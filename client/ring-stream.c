/* Stream-ordered rings, the control plane's part (ring-stream-data.c hands the frames over): each
 * seat's small cuda-vmm buffer of two counters made and registered, a member's attached, a seat's
 * counters renewed when its membership ends (the member that left keeps its mapping and could move
 * them for the next one), and the old ones freed once no wait or write queued on them can be left.
 * Allocating and freeing are requests to the broker, so all of this runs under the connection's
 * lock; what the data plane also touches (a seat's counters, the retired list) changes under
 * r->lock. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "macro.h"
#include "ring-internal.h"

static int side_stream(gpuipc_ring_t *r)
{
        GcuResult cr;

        if (r->side)
                return 0;
        cr = CU(cuStreamCreate, &r->side, GCU_STREAM_NON_BLOCKING);
        if (cr != GCU_SUCCESS) {
                r->side = NULL;
                return cuda_error(r->conn, "cuStreamCreate", cr);
        }
        return 0;
}

static int counters_zero(gpuipc_ring_t *r, gpuipc_buffer_t *b)
{
        int e = ring_stream_counter_set(r, ring_counter_at(b, RING_COUNTER_READY), 0);

        return e == 0 ? ring_stream_counter_set(r, ring_counter_at(b, RING_COUNTER_DONE), 0) : e;
}

static int alloc_in_ctx(gpuipc_ring_t *r)
{
        int e = side_stream(r);

        for (uint32_t k = 0; e == 0 && k < r->n_slots; k++) {
                GcuResult cr = CU(cuEventCreate, &r->done[k], GCU_EVENT_DISABLE_TIMING);

                if (cr != GCU_SUCCESS)
                        e = cuda_error(r->conn, "cuEventCreate", cr);
        }
        for (uint32_t i = 0; e == 0 && i < r->n_members; i++)
                e = counters_zero(r, r->counter_buf[i]);
        return e;
}

int ring_stream_alloc(gpuipc_ring_t *r, int device)
{
        int e = 0;

        r->ordinal = r->slot[0]->ordinal;
        /* One allocation per seat (a granule, 2 MiB on current GPUs): a member may write its own. */
        for (uint32_t i = 0; e == 0 && i < r->n_members; i++)
                e = gpuipc_buffer_alloc(r->conn, GPUIPC_KIND_CUDA_VMM, RING_COUNTER_BYTES, device, &r->counter_buf[i]);
        if (e == 0)
                e = IN_CTX(r, alloc_in_ctx(r));
        return e;
}

int ring_stream_join(gpuipc_ring_t *r)
{
        return IN_CTX(r, side_stream(r));
}

static void reap_in_ctx(gpuipc_ring_t *r, bool all)
{
        gpuipc_buffer_t *gone[RING_MAX_MEMBERS];
        uint32_t kept = 0, n_gone = 0;

        pthread_mutex_lock(&r->lock);
        for (uint32_t j = 0; j < r->n_retired; j++) {
                RetiredCounter *old = &r->retired[j];

                if (all || (old->recorded && CU(cuEventQuery, old->past) == GCU_SUCCESS)) {
                        (void)CU(cuEventDestroy, old->past);
                        gone[n_gone++] = old->buf;
                } else {
                        r->retired[kept++] = *old;
                }
        }
        r->n_retired = kept;
        pthread_mutex_unlock(&r->lock);
        /* A request each: outside r->lock, so that the data plane goes on meanwhile. */
        for (uint32_t j = 0; j < n_gone; j++)
                (void)gpuipc_buffer_free(r->conn, gone[j]);
}

void ring_stream_reap(gpuipc_ring_t *r, bool all)
{
        if (r->n_retired && cuda_ctx_push(r->conn, r->ordinal) == 0) {
                reap_in_ctx(r, all);
                cuda_ctx_pop(r->conn, 0);
        }
}

/* Waits for everything queued in the ring's context: what bounds the retired counters when too
 * many are waiting (as many as there are seats, within K frames: members that come and go without
 * the producer publishing). */
static int ctx_drain(gpuipc_ring_t *r)
{
        GcuResult cr = CU(cuCtxSynchronize);

        return cr == GCU_SUCCESS ? 0 : cuda_error(r->conn, "cuCtxSynchronize", cr);
}

/* The member that left keeps its mapping of the old counters and could move them for the next
 * member; so the seat gets new ones. Waits and writes the producer's stream queued on the old
 * ones may still be pending: they stay allocated until the event the next publish records behind
 * them has completed (ring_stream_reap). */
static int seat_renew_in_ctx(gpuipc_ring_t *r, uint32_t i)
{
        gpuipc_buffer_t *fresh = NULL;
        GcuEvent past;
        GcuResult cr;
        int e;

        if (r->n_retired == RING_MAX_MEMBERS) {
                e = ctx_drain(r);
                if (e < 0)
                        return e;
                reap_in_ctx(r, true);
        }
        cr = CU(cuEventCreate, &past, GCU_EVENT_DISABLE_TIMING);
        if (cr != GCU_SUCCESS)
                return cuda_error(r->conn, "cuEventCreate", cr);
        e = gpuipc_buffer_alloc(r->conn, GPUIPC_KIND_CUDA_VMM, RING_COUNTER_BYTES, r->ordinal, &fresh);
        if (e == 0)
                e = counters_zero(r, fresh);
        if (e < 0) {
                (void)CU(cuEventDestroy, past);
                if (fresh)
                        (void)gpuipc_buffer_free(r->conn, fresh);
                return e;
        }
        /* The seat is inactive (its membership ended): the data plane reads no counter of it, but it
         * may be recording the retired ones. */
        pthread_mutex_lock(&r->lock);
        r->retired[r->n_retired++] = (RetiredCounter){ .buf = r->counter_buf[i], .past = past };
        r->counter_buf[i] = fresh;
        pthread_mutex_unlock(&r->lock);
        return 0;
}

int ring_stream_seat_renew(gpuipc_ring_t *r, uint32_t i)
{
        return IN_CTX(r, seat_renew_in_ctx(r, i));
}

void ring_stream_close(gpuipc_ring_t *r)
{
        if (!r->side && !r->done[0])
                return;
        /* A member whose producer is gone must not leave its streams waiting for frames that never come. */
        if (!r->producer && r->ctl && r->counter_part && ring_member_gone(r))
                (void)IN_CTX(r, ring_stream_counter_set(r, ring_counter_at(r->counter_part, RING_COUNTER_READY),
                                                        RING_UNBLOCKED));
        if (cuda_ctx_push(r->conn, r->ordinal) < 0)
                return;
        for (uint32_t k = 0; k < r->n_slots; k++)
                if (r->done[k])
                        (void)CU(cuEventDestroy, r->done[k]);
        if (r->side)
                (void)CU(cuStreamDestroy, r->side);
        r->side = NULL;
        cuda_ctx_pop(r->conn, 0);
}
