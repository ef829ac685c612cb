/* registry-rings.c: rings, their seats and parts, and members waiting for their seats. */
#pragma once

#include "registry-core.h"

/* One member slot of a ring. */
typedef struct RingSeat {
        struct RegRing *ring;
        uint32_t index;
        RegPeer *peer;  /* NULL: free */
        uint64_t epoch; /* of the current (or last) membership */
        bool reserved;  /* restored: its member has not come back yet (peer NULL) */
        List peer_link; /* RegPeer.seats */
        /* The most frames membership taken_epoch said it took, as counted in ring_frames_taken. */
        uint64_t taken_epoch, taken_seen;
} RingSeat;

/* A member back before its ring's producer (after a restart): waits until the producer declares
 * the ring again, or the grace ends. */
typedef struct SeatClaim {
        List link;      /* Registry.seat_claims */
        List peer_link; /* RegPeer.seat_claims */
        RegPeer *peer;
        uint32_t index;
        uint32_t cost; /* charged to its peer's uid (held budget) */
        uint64_t epoch;
        char ring[];
} SeatClaim;

/* A ring (docs/design.md "Rings"): its shape, its parts (buffers of its producer, attachable only
 * by its members: part 0 the control page, 1..n_slots the slots, then one member page per seat and,
 * for a stream ring, one counter buffer per seat), and who sits in which seat. Frames never pass
 * through here. */
typedef struct RegRing {
        HNode node;       /* Registry.rings, by name */
        List link;        /* Registry.ring_list, in creation order (listings page by seq) */
        uint64_t seq;
        RegPeer *owner;
        List owner_link;  /* RegPeer.rings */
        UidAcct *acct;    /* the ring itself counts as one of its producer's buffers */
        ProtoKind kind;
        uint64_t slot_size;
        uint32_t n_slots, n_members;
        ProtoMode mode;
        uint32_t lease_ms;
        char *device;
        uint64_t next_epoch;
        uint32_t n_registered; /* parts registered now */
        bool set_up;           /* every part was registered once: joinable (seats whose parts were let go
                                * of excepted, until the producer registers new ones) */
        RegBuffer **parts;     /* 1 + n_slots + n_members (twice n_members for a stream ring) */
        RingSeat *seats;       /* n_members */
        uint64_t cost;         /* charged to its producer's uid (held budget): what it allocated, and
                                * an event per seat */
        char name[];
} RegRing;

/* Part 0 the control page, then the slots, one page per seat, and (stream rings) one counter
 * buffer per seat. */
static inline uint32_t ring_n_parts(const RegRing *g)
{
        return 1 + g->n_slots + g->n_members * (g->mode == PROTO_MODE_STREAM ? 2 : 1);
}

/* registry-rings.c: whether p may attach b (a ring part: only its ring's members; 0, or a code with
 * why); what a peer's departure does to rings it produces or sits in. */
int reg_ring_attach_check(const RegBuffer *b, const RegPeer *p, RegWhy *why);
void reg_rings_drop_peer(Registry *r, RegPeer *p, RegSink *o);
/* The restart grace ended: seats nobody came back for are freed, members whose ring did not come
 * back are told. */
void reg_rings_grace_end(Registry *r, RegSink *o);
/* Whether g is set up: every part was registered once and its control page and slots still are
 * (seats whose parts were let go of wait for new ones on their own). */
bool reg_ring_set_up(const RegRing *g);
