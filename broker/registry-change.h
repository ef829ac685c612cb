/* What a registry step changed that somebody must hear of, as the registry says it: a reply to a
 * request (a protocol status, and for an error why, as a code and its facts), an event to a peer,
 * an fd the broker no longer needs. The registry words nothing and encodes nothing; the reply layer
 * (broker/reply.c, broker/reply-text.c) turns each change into frames, texts and fds, in the order
 * the step emitted them, which is the order they go out. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "proto.h"

typedef struct RegPeer RegPeer;
typedef struct RegBuffer RegBuffer;
typedef struct RegRing RegRing;

/* Why something failed or happened: which text (broker/reply-text.c words each one) and the facts
 * it names. Strings are borrowed: valid until the change has been emitted. */
typedef enum RegWhyCode {
        REG_WHY_NONE,
        /* subscriptions */
        REG_E_SUBS_LIMIT,        /* n0: subscriptions of this connection */
        REG_E_NO_SUB,            /* n0: the subscription id */
        /* attach waits and groups */
        REG_E_GROUP_EMPTY,
        REG_E_GROUP_MISMATCH,    /* s0: group, n0: its members, n1: this join's */
        REG_E_GROUP_JOINED,      /* s0: group */
        REG_E_WAITS_LIMIT,       /* n0: waits of this connection */
        REG_E_GROUP_TIMEOUT,     /* s0: group, n0: joined, n1: members */
        REG_E_WAIT_MISSED,       /* s0: name, n0: publications retired during the wait */
        REG_E_WAIT_TIMEOUT,      /* s0: name */
        REG_E_TEXT,              /* s0: a text the caller gave (registry_cancel_waits) */
        /* attach */
        REG_E_SAME_PID,          /* s0: buffer name; n0: the PID producer and consumer share (each in its own
                                  * namespace); n1: the producer's uid; n2, n3: whether the producer's and the
                                  * consumer's PID were only declared */
        REG_E_DEVICE,            /* s0: buffer name, s1: its GPU; gpus: the consumer's */
        REG_E_NO_BUFFER,         /* n0: id */
        /* rings */
        REG_E_PART_OF_NO_RING,   /* n0: id, s0: name */
        REG_E_RING_MEMBERS_ONLY, /* n0: id, s0: name, s1: ring */
        REG_E_RING_EXISTS,       /* s0: ring */
        REG_E_RING_BUFFERS_LIMIT, /* n0: uid, n1: its buffers */
        REG_E_RING_OTHERS,       /* s0: ring */
        REG_E_NO_RING,           /* s0: ring */
        REG_E_PART_MISFIT,       /* s0: ring, n0: part index, n1: the rule it breaks (a RegPartRule) */
        REG_E_PART_KEY_TAKEN,    /* n0: id, n1: its producer's peer id, n2: uid */
        REG_E_RING_SETTING_UP,   /* s0: ring, n0: parts registered, n1: parts */
        REG_E_RING_MEMBER,       /* s0: ring, n0: the seat this connection has */
        REG_E_RING_NO_SEAT_READY, /* s0: ring */
        REG_E_RING_FULL,         /* s0: ring, n0: seats */
        REG_E_RING_SEATS,        /* s0: ring, n0: seats */
        REG_E_SEAT_NOT_WAITING,  /* s0: ring, n0: seat, n1: epoch */
        REG_E_RING_GONE,         /* s0: ring */
        REG_E_SEAT_CLAIMS_LIMIT, /* n0: seat claims of this connection */
        REG_E_NOT_MEMBER,        /* s0: ring */
        REG_R_MEMBER_GRACE_OVER, /* n0: the restart grace (ms) */
        REG_R_RING_GRACE_OVER,   /* n0: the restart grace (ms) */
        REG_R_MEMBER_LEFT,
        REG_R_MEMBER_GONE,
        REG_R_EVICTED_UNRETURNED,
        REG_R_EVICTED_LEASE,     /* n0: the lease (ms) */
        REG_R_RING_CLOSED,
        REG_R_RING_PRODUCER_GONE, /* n0-n2: the producer's peer id, pid, uid */
        /* connections */
        REG_E_CONNECTIONS_LIMIT, /* n0: the limit */
        REG_E_CONNECTIONS_PER_UID, /* n0: uid, n1: its connections */
        /* the memory budget (broker/budget.h) */
        REG_E_MEMORY_BUDGET,     /* n0: uid, n1: 1 if the whole pool is full (else the uid's share), n2: what it
                                  * holds, n3: the share or pool, n4: the bytes asked */
        REG_R_PRODUCER_GONE,     /* n0-n2: the producer's peer id, pid, uid */
        REG_E_REFS_FULL,         /* n0: references this connection holds */
        REG_E_NOT_LIVE,          /* n0: id, n1: its state, s0: name */
        REG_E_NOTHING_UNDER,     /* s0: name */
        /* publish */
        REG_E_NAME_ORPHANED,     /* s0: name, n0: the orphan's producer uid, n1: its id */
        REG_E_NAME_TAKEN,        /* s0: name, n0-n2: the producer's peer id, pid, uid */
        REG_E_OTHERS_BUFFER,     /* n0: id */
        REG_E_NOT_IDLE,          /* n0: id, n1: its state */
        REG_E_KEY_TAKEN,         /* n0: id, n1: its producer's peer id, n2: its uid */
        REG_E_BUFFERS_LIMIT,     /* n0: uid, n1: its buffers */
        REG_E_FDS_LIMIT,         /* n0: fds held, n1: uid */
        REG_E_HELD_MEMORY_LIMIT, /* n0: uid, n1: its broker-held bytes, n2: the buffer's, n3: the limit */
        REG_E_OTHERS_SEGMENT,    /* n0: the segment's id */
        REG_E_NOT_A_SEGMENT,     /* n0: id, n1: why (1 a view, 2 a ring part, 3 another kind) */
        REG_E_SEGMENT_FREED,     /* n0: id */
        REG_E_NO_SEGMENT,        /* n0: id */
        REG_E_VIEW_OUTSIDE,      /* n0: offset, n1: size, n2: the segment's size */
        REG_E_RESTORED_GENERATION, /* n0: the highest generation given */
        /* release, retire, free */
        REG_E_NOT_ATTACHED,      /* n0: id */
        REG_E_NOT_OWNER,         /* n0: id, s0: name, n1: its producer's peer id, n2: uid */
        /* reclaims and the restart grace (n0 is the buffer's id unless said otherwise) */
        REG_E_CLAIM_OWNER,       /* n1, n2: its kind and producer uid now; n3, n4: those the consumer held */
        REG_E_CLAIM_REPUBLISHED, /* n1, s0: its generation and name now; n2, s1: those the consumer held */
        REG_E_CLAIM_DRAINED,     /* s0: name */
        REG_E_CLAIM_RING_PART,   /* s0: name */
        REG_E_CLAIM_RETIRED,     /* s0: name, n1: the claimant's uid, which held nothing on it */
        REG_E_CLAIM_RETIRE_AFTER, /* s0: name, n1: retire_after, n2: attaches, n3: unvouched references */
        REG_E_RECLAIM_NO_REFS,
        REG_E_REFS_LIMIT,        /* n0: references held, n1: more asked, n2: the limit (not an id) */
        REG_E_CLAIM_UNKNOWN,     /* s0: name, n1: the restart grace (ms) */
        REG_E_CLAIMS_PER_UID,    /* n0: uid, n1: its pending claims (not an id) */
        REG_E_CLAIMS_ALL,        /* n0: pending claims (not an id) */
        REG_R_CLAIM_GRACE_OVER,  /* n0: the restart grace (ms; not an id) */
        REG_R_RESTART_RELEASED,  /* n0: holders that came back, n1: the grace (not an id) */
        REG_R_RESTART_UNCLAIMED, /* n0: the grace (not an id) */
        REG_R_RESTORED_UNHELD,   /* a restored buffer registered retired, nobody holding it */
        _REG_WHY_MAX
} RegWhyCode;

/* Which rule a ring part breaks (REG_E_PART_MISFIT). */
typedef enum RegPartRule {
        REG_PART_FITS,
        REG_PART_PART_BEYOND,
        REG_PART_PART_TAKEN,
        REG_PART_PART_HELD_OR_RETIRED,
        REG_PART_SLOT_SHAPE,
        REG_PART_SLOT_READ_ONLY,
        REG_PART_SLOT_DEVICE,
        REG_PART_COUNTERS_SHAPE,
        REG_PART_COUNTERS_DEVICE,
        REG_PART_PAGE_SHAPE,
        REG_PART_CONTROL_READ_ONLY,
        REG_PART_PAGE_WRITABLE,
        REG_PART_RESTORED_GENERATION,
} RegPartRule;

typedef struct RegWhy {
        RegWhyCode code;
        uint64_t n[8];
        const char *s[3];
        const char (*gpus)[PROTO_MAX_UUID + 1]; /* REG_E_DEVICE: the consumer's GPUs */
        uint32_t n_gpus;
} RegWhy;

/* Which publication an event is about. */
typedef struct RegBufferKey {
        uint64_t id, generation;
        const char *name;
        ProtoKind kind;
} RegBufferKey;

typedef enum RegChangeType {
        REG_CH_REPLY, /* answers request `req` of `to` with `status`; an error says `why`; fields by `reply` */
        REG_CH_EVENT, /* tells `to` of `event` on `key` (to a subscriber: `sub`); `why`, if any, is its reason */
        REG_CH_RING_EVENT, /* tells `to` of `event` on seat `index` (membership `epoch`) of ring `str`; `why`: reason */
        REG_CH_FORGET_PEER, /* `to` is going away: frames already addressed to it must not reach it */
        REG_CH_CLOSE_FD, /* `fd` (the registry's) is to be closed once the frames that borrow it are out */
} RegChangeType;

/* The fields of a successful reply besides its status. */
typedef enum RegReplyKind {
        REG_RE_PLAIN,  /* none */
        REG_RE_SUB,    /* sub: the new subscription's id */
        REG_RE_GROUP,  /* str: the group, n: its members */
        REG_RE_STATE,  /* n: the buffer's state (a ProtoState) */
        REG_RE_PENDING, /* pending: true */
        REG_RE_ATTACHED, /* buffer's description and cached (flag); its memory's fd travels unless cached */
        REG_RE_PUBLISHED, /* buffer's id, generation and state */
        REG_RE_PART,   /* a ring part's (buffer's) id and generation */
        REG_RE_SEAT,   /* ring's shape, seat index, membership epoch, and the n parts its member attaches */
} RegReplyKind;

/* A part of a ring a member attaches: its index and buffer id. */
typedef struct RegPartRef {
        uint32_t index;
        uint64_t buffer;
} RegPartRef;

typedef struct RegChange {
        RegChangeType type;
        RegPeer *to;
        uint64_t req;                /* replies */
        unsigned status;             /* replies: a PROTO_STATUS_* */
        RegReplyKind reply;          /* replies with status ok */
        ProtoEvent event;            /* events */
        RegBufferKey key;            /* events */
        const RegBuffer *buffer;     /* replies about a buffer */
        bool flag;
        int fd;                      /* REG_CH_CLOSE_FD */
        const RegRing *ring;         /* REG_RE_SEAT */
        uint32_t index;              /* ring seats */
        uint64_t epoch;
        const RegPartRef *parts;     /* REG_RE_SEAT: n of them */
        uint64_t sub, n;
        const char *str;
        RegWhy why;
} RegChange;

/* Where a registry step's changes go, in order: the caller's (the broker's reply layer,
 * reply_sink() in broker/reply.h, turns them into frames; a test may keep them as they are). */
typedef struct RegSink {
        void (*emit)(void *ctx, const RegChange *c);
        void *ctx;
} RegSink;
