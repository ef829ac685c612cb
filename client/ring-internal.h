/* Internals shared by the ring's files, which split into two planes:
 *
 *   - the control plane (ring.c: create, join, membership events, seat renewal, evictions the
 *     broker must hear of, reconnect, close; ring-thread.c: the connection's ring thread;
 *     ring-stream.c: a stream ring's counters made, reset, renewed and freed): it talks to the
 *     broker, allocates, and runs under the connection's lock, in the caller's thread or in the
 *     ring thread;
 *   - the data plane (ring-data.c: acquire, publish, take, release of host rings; ring-stream-data.c:
 *     the same in CUDA streams): shared memory, futexes and stream operations only. It never reads
 *     the socket, never allocates, never waits for the broker, and never takes the connection's lock
 *     (tests/unit/ring-data-symbols.sh checks its undefined symbols).
 *
 * The planes meet in a few fields of the ring. A producer's seat table (which seats are active,
 * from which frame) and r->next change under r->lock, which the data plane holds only for short
 * sections, never while it sleeps or spins; the control plane activates and deactivates seats
 * under it as the broker's news arrives. What the data plane leaves for the control plane
 * (a member to evict, counters to reap) it marks in the ring and wakes the ring thread for
 * (ring_control_kick). A member's data plane reads `gone`, which the control plane sets, and sets
 * only `hostile`, its own verdict on a control page no producer could have written. Nothing here
 * is exported. */
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
        uint64_t evict_epoch;    /* the data plane evicted this membership; the broker is not told yet */
        /* The broker let go of this seat's page (and counters) when its last membership ended: the
         * member that left may still have them mapped, so the next member gets new ones. */
        bool renew;
        bool replaced; /* renew: the new ones are made, not yet all registered */
} Seat;

/* Counters of a seat that was renewed, kept until no wait or write queued on them can be left:
 * an event recorded by the next publish, behind everything queued before it. */
typedef struct RetiredCounter {
        gpuipc_buffer_t *buf;
        GcuEvent past;
        bool recorded;
} RetiredCounter;

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
        pthread_mutex_t lock; /* the producer's seat table and next, between the planes */

        /* producer */
        gpuipc_buffer_t *page_buf[RING_MAX_MEMBERS];
        /* A renewed seat's previous page, freed at the seat's next renewal or at close: the data
         * plane may still be about to sleep on its wake word (it sleeps without r->lock). */
        gpuipc_buffer_t *old_page[RING_MAX_MEMBERS];
        Seat seat[RING_MAX_MEMBERS];
        uint64_t max_epoch; /* the highest epoch the broker gave a seat (declared again after a restart) */
        uint64_t next;      /* the frame the next publish makes */
        int writing;        /* the slot acquired for it, or -1 */
        bool evict_pending; /* some seat's evict_epoch is set */
        bool renew_pending; /* some seat wants renewing (Seat.renew) */
        bool renewing;      /* renewing now: not again from within */
        uint64_t renew_retry_ms; /* after a failed renewal, not before this */

        /* stream rings (ring-stream.c): per seat a small cuda-vmm buffer of two counters, "frame n is
         * ready" (the producer writes it) and "frame n is done" (the member writes it) */
        gpuipc_buffer_t *counter_buf[RING_MAX_MEMBERS]; /* producer: its own, one per seat */
        gpuipc_buffer_t *counter_part;                  /* member: its seat's, attached writable */
        GcuStream side;          /* a non-blocking stream of our own: reads and resets that must not wait
                                  * behind the caller's streams */
        RetiredCounter retired[RING_MAX_MEMBERS];
        uint32_t n_retired;
        GcuEvent done[RING_MAX_SLOTS]; /* producer: recorded when each slot's frame went out */
        bool done_used[RING_MAX_SLOTS];
        int ordinal;             /* the ring's device */
        GcuStream checked;       /* the caller's stream last found to be of the ring's device */

        /* member */
        uint32_t index;
        uint64_t epoch;
        gpuipc_buffer_t *page_part; /* attached writable */
        volatile RingMember *page;
        bool seated;        /* the producer has let us in (our epoch is in our seat) */
        uint64_t cursor;    /* backpressure: the next frame to take; latest: the last one taken */
        int taken;          /* the slot of the frame held, or -1 */
        uint64_t taken_frame;
        int gone;           /* evicted, or the ring closed or lost its producer (atomic; gone_why first) */
        char gone_why[256];
        /* The data plane's own verdict: the control page said what no producer can (a frame past
         * RING_FRAME_MAX). Atomic: 0, 1 while hostile_why is written, 2 once it is. */
        int hostile;
        char hostile_why[160];
        uint64_t stuck_head; /* latest, during a take: a head whose frame was not there (0: none) */
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
#define RING_SLEEP_SLICE_MS 10 /* a producer waiting for a member never sleeps longer than this at once */

/* Runs expr in the ring device's context. */
#define IN_CTX(r, expr)                                                                                     \
        ({                                                                                                  \
                int e_ = cuda_ctx_push((r)->conn, (r)->ordinal);                                            \
                e_ < 0 ? e_ : cuda_ctx_pop((r)->conn, (expr));                                              \
        })

int ring_min_timeout(int a, int b);

/* ---- ring.c, ring-thread.c: the control plane ---- */

/* Wakes the connection's ring thread: the data plane left work for it (an eviction to tell the
 * broker, retired counters to free). Writes an eventfd; never blocks. */
void ring_control_kick(gpuipc_ring_t *r);
/* The same for the connection's ring thread (when the control plane's work is not the calling
 * thread's to do). */
void ring_thread_kick(gpuipc_t *c);
/* Whether the calling thread is c's ring thread (the one that renews seats and tells evictions). */
bool ring_thread_is_self(gpuipc_t *c);
/* Starts the connection's ring thread if it does not run yet (a ring was made or joined). */
int ring_thread_start(gpuipc_t *c);
/* How long the ring thread may sleep before the control plane has something to retry (-1: until
 * news or a kick). */
int ring_control_timeout(gpuipc_t *c);
/* Member: it may take nothing any more (why: a sentence); wakes whoever waits for its frames. */
void ring_mark_gone(gpuipc_ring_t *r, const char *why);

/* ---- ring-data.c: the data plane's shared pieces ---- */

/* Producer, under r->lock: seat i starts with frame r->next, or stops counting. */
void ring_seat_activate(gpuipc_ring_t *r, uint32_t i, uint64_t epoch);
void ring_seat_deactivate(gpuipc_ring_t *r, uint32_t i);
/* Producer, under r->lock: gives up seat i (its member held the ring up past the lease): at once
 * in shared memory (and its counters), the broker is told by the control plane. */
void ring_evict(gpuipc_ring_t *r, uint32_t i);
/* Member: whether the producer has let it in yet (and then sets it up to take frames). */
bool ring_check_seated(gpuipc_ring_t *r);
bool ring_member_evicted(gpuipc_ring_t *r);
/* Member, at the top of a take: GPUIPC_E_STATE (and why) while it holds a frame, else 0. */
int ring_member_may_take(gpuipc_ring_t *r);
/* A take succeeded: one more frame on this member's page (what operators count; see RingMember). */
void ring_count_take(gpuipc_ring_t *r);
/* Member: GPUIPC_E_REVOKED (and why) once it may take nothing any more, else 0. */
int ring_member_alive(gpuipc_ring_t *r);
/* Member: why it may take nothing any more, or NULL. */
const char *ring_member_gone(gpuipc_ring_t *r);
/* Member: the control page's head, checked: GPUIPC_E_REVOKED (and why) when it is past any frame a
 * ring reaches, which ends the membership for the data plane (ring_member_gone says why). */
int ring_member_head(gpuipc_ring_t *r, uint64_t *ret_head);
/* Member: sleeps on the control page's doorbell while it reads `seen` (at most timeout_ms). */
void ring_doorbell_sleep(gpuipc_ring_t *r, uint32_t seen, int timeout_ms);
/* Producer: after head moved, wakes members that said they sleep. */
void ring_wake_sleepers(gpuipc_ring_t *r, uint64_t head);
void ring_cpu_relax(void);

/* ---- ring-stream.c: a stream ring's counters (control plane) ---- */

/* A producer's counters made and registered (after the member pages), a member's counter attached,
 * and the cleanup of either side. */
int ring_stream_alloc(gpuipc_ring_t *r, int device);
int ring_stream_join(gpuipc_ring_t *r);
/* Seat i's counters set to start - 1 (under r->lock, before its member sees the seat). */
int ring_stream_seat_reset(gpuipc_ring_t *r, uint32_t i, uint64_t start);
/* Seat i gets new counters (takes r->lock to swap them in); the old ones are freed once the
 * producer's stream is past them. */
int ring_stream_seat_renew(gpuipc_ring_t *r, uint32_t i);
/* Frees the retired counters the producer's stream is past (all: every one, at close). */
void ring_stream_reap(gpuipc_ring_t *r, bool all);
/* Lets every wait on seat i's "done" through (under r->lock). */
void ring_stream_seat_unblock(gpuipc_ring_t *r, uint32_t i);
void ring_stream_close(gpuipc_ring_t *r);

/* ---- ring-stream-data.c ---- */

/* Reads a counter through the ring's side stream (the producer's lease check). */
int ring_stream_counter_get(gpuipc_ring_t *r, GcuDevicePtr where, uint64_t *ret);
GcuDevicePtr ring_counter_at(const gpuipc_buffer_t *b, size_t offset);
/* Sets a counter from the host through the side stream, and waits for it. */
int ring_stream_counter_set(gpuipc_ring_t *r, GcuDevicePtr where, uint64_t value);
