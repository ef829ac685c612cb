/* The shared memory of a ring (docs/design.md "Rings"): its layout, which side writes what, and the
 * pure functions that read what an untrusted side wrote. Like frames, this is a format between
 * processes, so it lives in proto/ and knows nothing of sockets or CUDA.
 *
 * A ring has three kinds of memory, each a separate memfd so that the kernel enforces who writes it:
 *   - the control page (RingCtl): written by the producer only; members map it read-only (the memfd
 *     is sealed against new writable mappings);
 *   - one member page (RingMember) per member slot: written by that member only; the producer (and
 *     the broker, to show lag) map it read-only and treat what they read as untrusted input;
 *   - the slots: K buffers of one kind and size, written by the producer;
 *   - stream rings only: one small cuda-vmm buffer per member slot with two counters, "frame n is
 *     ready" (the producer's stream writes it) and "frame n is done" (the member's stream writes it).
 *
 * Frames are numbered 1, 2, 3, ...; a slot holds frame n when slot_seq says so (slot_seq changes
 * only when the producer really rewrites the slot, so a member can tell whether the frame it held
 * stayed intact). Every cross-process
 * handshake is a store, a sequentially consistent fence, and a load on each side (Dekker's pattern),
 * so that of two sides racing, at least one sees the other: that is what makes "never overwrite a
 * held frame" and "never sleep through a wake-up" hold. The fences are explained where they are. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RING_MAGIC 0x474e5252u /* "RRNG" */
#define RING_LAYOUT_VERSION 1
#define RING_MAX_SLOTS 64
#define RING_MAX_MEMBERS 64
#define RING_PAGE 4096
/* A ring's parts are named after it ("NAME@member.63"), so a ring name leaves room for that. */
#define RING_NAME_MAX (PROTO_MAX_NAME - 16)

/* The highest frame number a ring can reach: 2^62 - 1 frames take a producer 146 years at a
 * billion a second, and stay below the stream counters' "let everything through" value. A control
 * page that says more (a head, a member's first frame) is a hostile producer's. */
#define RING_FRAME_MAX (UINT64_MAX >> 2)

typedef enum RingMode {
        RING_BACKPRESSURE = 0, /* every member sees every frame; the producer waits for the slowest */
        RING_LATEST = 1,       /* the producer never waits: a member takes the newest frame, a slow one skips */
        RING_STREAM = 2,       /* backpressure in the GPU: streams wait on counters in cuda-vmm memory */
} RingMode;

typedef enum RingMemberState {
        RING_MEMBER_FREE = 0,
        RING_MEMBER_ACTIVE = 1,
} RingMemberState;

/* What the producer says about member slot i (in the control page). */
typedef struct RingMemberSlot {
        uint64_t epoch;  /* which membership this is: a new one for every join (0: never used) */
        uint64_t start;  /* backpressure: the first frame this member takes */
        uint32_t state;  /* RingMemberState */
        uint32_t pad;
} RingMemberSlot;

/* The control page: the producer's. */
typedef struct RingCtl {
        uint32_t magic, version;
        uint32_t n_slots, n_members;
        uint32_t mode; /* RingMode */
        uint32_t closed; /* the producer closed the ring: take nothing more */
        uint64_t slot_size;
        uint64_t head;      /* the newest published frame (0: none yet) */
        uint32_t head_slot; /* ... and the slot it is in */
        uint32_t doorbell;  /* futex word: bumped at every publish; sleeping members wait on it */
        uint32_t producer_waiting; /* the producer sleeps on some member's release word */
        uint32_t pad;
        uint64_t slot_seq[RING_MAX_SLOTS]; /* the frame slot k holds; 0 while it is being written */
        uint32_t intent[RING_MAX_SLOTS];   /* latest mode: the producer considers overwriting slot k */
        RingMemberSlot member[RING_MAX_MEMBERS];
} RingCtl;

/* A member page: member i's own. Nothing here is trusted by anyone but member i. */
typedef struct RingMember {
        uint64_t epoch;    /* the membership this page speaks for (written at join) */
        uint64_t released; /* backpressure: every frame up to this one is released */
        uint64_t held;     /* latest: the frame being read (0: none) */
        uint32_t wake;     /* futex word the producer may sleep on: bumped at every release */
        uint32_t sleeping; /* the member is about to sleep, or sleeps, on the control page's doorbell */
        /* Frames this membership took (set to 0 at join, before the epoch; one more at every take):
         * for operators only (the broker's ring_frames_taken_total), nobody's handshake depends on
         * it. Appended within layout version 1: a member that predates it leaves it 0. */
        uint64_t taken;
} RingMember;

_Static_assert(sizeof(RingCtl) <= RING_PAGE, "the control block fits its page");
_Static_assert(sizeof(RingMember) <= RING_PAGE, "a member block fits its page");

/* A member page as the producer may use it, after checking it against what the producer knows. */
typedef struct RingMemberView {
        bool valid;        /* the page speaks for the membership the producer knows */
        uint64_t released; /* clamped to what can be true: between start - 1 and head */
        uint64_t held;     /* latest mode: a frame the member says it reads (any value: compared only) */
        bool sleeping;
} RingMemberView;

/* Reads member page m once (each field with one load), for the membership (epoch, start) the
 * control page records, with the ring at frame head. A page that speaks for another membership
 * is not valid (the member has not initialized it yet, or garbage): its member is treated as having
 * released nothing beyond start - 1. Never trusts a value it cannot check. */
RingMemberView ring_member_view(const volatile RingMember *m, uint64_t epoch, uint64_t start, uint64_t head);

/* Backpressure: may frame `frame` overwrite the slot of frame - n_slots, as far as this member is
 * concerned? */
bool ring_member_lets(const RingMemberView *v, uint64_t start, uint64_t frame, uint32_t n_slots);

/* The name of part `index` of a ring with n_slots slots and n_members seats: "RING@ctl",
 * "RING@slot.K", "RING@member.I", "RING@counter.I" (a stream ring's; what listings show). */
void ring_part_name(char *buf, size_t cap, const char *ring, uint32_t index, uint32_t n_slots, uint32_t n_members);

/* A ring's shape as the broker knows it (from the producer's ring-create, within the limits). */
typedef struct RingShape {
        uint32_t n_slots, n_members;
        uint64_t slot_size;
        RingMode mode;
} RingShape;

/* Checks the layout of a control page, the producer's and so not trusted by a member (at join) nor
 * by the broker (for a listing): magic, layout version, counts, slot size and mode equal to the
 * shape (itself within the limits), and the newest frame's slot within the slots. Each field is
 * read once. NULL when it holds; else why, where a sentence naming the field, what it says and what
 * was expected was written (cut to cap bytes, cap at least 1). */
const char *ring_ctl_check(const volatile RingCtl *c, const RingShape *shape, char *why, size_t cap);

/* ---- what operators see (the broker's ring-stat and rings replies) ---- */

/* One seat, read from the producer's control page and the seat's member page. */
typedef struct RingSeatReading {
        bool seated;       /* the control page seats membership `epoch` in this seat */
        bool confirmed;    /* ... and the member's page speaks for that membership */
        /* Only when seated, and never above head. Backpressure and stream: the last frame released,
         * as the producer counts it (ring_member_view: start - 1 for a page that does not speak for
         * the seat); latest: the frame the member holds (0: none). */
        uint64_t position;
        uint64_t lag; /* head - position, 0 when position is at or above head; latest: 0 holding none */
        /* Only when confirmed: the frames the member says it took, at most the frames published
         * since its first (head - start + 1), so a hostile page cannot claim more. */
        uint64_t taken;
} RingSeatReading;

/* A whole ring as the broker reads it for a listing. */
typedef struct RingReading {
        bool ctl_valid;    /* the control page passed ring_ctl_check; nothing below is set otherwise */
        char why[160];     /* ... and if not, why (ring_ctl_check's sentence) */
        uint64_t head;     /* the newest published frame, as the control page says */
        RingSeatReading seat[RING_MAX_MEMBERS];
} RingReading;

/* Reads a ring for operators: the control page c (the ring's shape as the broker knows it: n_slots,
 * n_members, slot_size, mode) and, for each seat i below n_members, its member page pages[i] (NULL:
 * not available) for membership epochs[i] (0: the seat is free; nothing is read for it). Every
 * shared word is loaded once; both pages are the other sides' and may hold anything, so only
 * checked or clamped values come out. n_members above RING_MAX_MEMBERS reads as invalid. */
void ring_read(const volatile RingCtl *c, uint32_t n_slots, uint32_t n_members, uint64_t slot_size, RingMode mode,
               const uint64_t *epochs, const volatile RingMember *const *pages, RingReading *ret);
