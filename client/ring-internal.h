/* Internals shared by the ring's files: ring.c (setup, membership, host doorbells) and ring-stream.c
 * (stream-ordered rings on GPU counters). Nothing here is exported. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cuda.h"
#include "internal.h"
#include "ring.h"

/* What the producer knows of seat i (the control page says the same to members). */
typedef struct Seat {
        bool active;
        uint64_t epoch, start;
        uint64_t blocking_since; /* when it started to hold the producer up (0: it does not) */
} Seat;

struct gpuipc_ring {
        gpuipc_t *conn;
        List link; /* gpuipc.rings */
        char name[PROTO_MAX_NAME + 1];
        bool producer;
        RingMode mode;
        uint32_t n_slots, n_members, lease_ms, spin_us;
        size_t slot_size;
        gpuipc_kind_t kind;
        gpuipc_buffer_t *ctl_buf; /* producer: its own; member: attached read-only */
        volatile RingCtl *ctl;
        gpuipc_buffer_t *slot[RING_MAX_SLOTS];

        /* producer */
        gpuipc_buffer_t *page_buf[RING_MAX_MEMBERS];
        Seat seat[RING_MAX_MEMBERS];
        uint64_t max_epoch; /* the highest epoch the broker gave a seat (declared again after a restart) */
        uint64_t next;      /* the frame the next publish makes */
        int writing;        /* the slot acquired for it, or -1 */
        uint64_t last_pump_ms;

        /* stream rings (ring-stream.c): per seat a small cuda-vmm buffer of two counters, "frame n is
         * ready" (the producer writes it) and "frame n is done" (the member writes it) */
        gpuipc_buffer_t *counter_buf[RING_MAX_MEMBERS]; /* producer: its own, one per seat */
        gpuipc_buffer_t *counter_part;                  /* member: its seat's, attached writable */
        GcuStream side;          /* a non-blocking stream of our own: reads and resets that must not wait
                                  * behind the caller's streams */
        GcuEvent done[RING_MAX_SLOTS]; /* producer: recorded when each slot's frame went out */
        bool done_used[RING_MAX_SLOTS];
        int ordinal;             /* the ring's device */

        /* member */
        uint32_t index;
        uint64_t epoch;
        gpuipc_buffer_t *page_part; /* attached writable */
        volatile RingMember *page;
        bool seated;        /* the producer has let us in (our epoch is in our seat) */
        uint64_t cursor;    /* backpressure: the next frame to take; latest: the last one taken */
        int taken;          /* the slot of the frame held, or -1 */
        uint64_t taken_frame;
        bool gone;          /* evicted, or the ring closed or lost its producer */
        char gone_why[256];
        int efd;            /* gpuipc_ring_fd, and its helper thread */
        uint64_t notified_head; /* the head the fd last said something about */
        pthread_t notifier;
        bool notifier_on;
        volatile bool stop;
};


/* Counters of a stream ring's seat, each on its own cache line. */
#define RING_COUNTER_READY 0   /* "frame n is ready": the producer's stream writes n */
#define RING_COUNTER_DONE 64   /* "frame n is done": the member's stream writes n */
#define RING_COUNTER_BYTES 128
#define RING_UNBLOCKED (UINT64_MAX >> 1) /* what a counter is set to so that no wait on it blocks */

int ring_remaining_ms(uint64_t deadline);
uint64_t ring_deadline_of(int timeout_ms);
int ring_min_timeout(int a, int b);
/* Producer: reads the socket at most once a millisecond (membership news), or now. */
void ring_maybe_pump(gpuipc_ring_t *r, bool now);
/* Producer: gives up seat i (its member held the ring up past the lease). */
void ring_evict(gpuipc_ring_t *r, uint32_t i);
/* Member: whether the producer has let it in yet (and then sets it up to take frames). */
bool ring_check_seated(gpuipc_ring_t *r);
bool ring_member_evicted(gpuipc_ring_t *r);
/* Member, at the top of a take: GPUIPC_E_STATE (and why) while it holds a frame, else 0. */
int ring_member_may_take(gpuipc_ring_t *r);
/* Member, in a take's wait: reads the socket now and then; GPUIPC_E_REVOKED (and why) once it may
 * take nothing any more, else 0. */
int ring_member_alive(gpuipc_ring_t *r);
/* Member: why it may take nothing any more, or NULL. */
const char *ring_member_gone(gpuipc_ring_t *r);
/* Member: sleeps on the control page's doorbell while it reads `seen` (at most timeout_ms). */
void ring_doorbell_sleep(gpuipc_ring_t *r, uint32_t seen, int timeout_ms);

/* ring-stream.c: a producer's counters made and registered (after the member pages), seats reset or
 * let go of, a member's counter attached, and the cleanup of either side. */
int ring_stream_alloc(gpuipc_ring_t *r, int device);
int ring_stream_join(gpuipc_ring_t *r);
int ring_stream_seat_reset(gpuipc_ring_t *r, uint32_t i, uint64_t start);
void ring_stream_seat_unblock(gpuipc_ring_t *r, uint32_t i);
void ring_stream_close(gpuipc_ring_t *r);
