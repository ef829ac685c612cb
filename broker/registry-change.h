/* What a registry step changed that somebody must hear of, as the registry says it: how an operation
 * turned out (its result for the request in progress, or the answer to a request that waited), an
 * event to a peer, an fd the broker no longer needs. A failure is a code (RegWhyCode) with its facts
 * (RegWhy); the registry knows no protocol status, words nothing and encodes nothing. The reply layer
 * (broker/reply.c, broker/reply-text.c) turns each change into frames, texts and fds, in the order the
 * step emitted them, which is the order they go out. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "proto.h"

typedef struct RegPeer RegPeer;
typedef struct RegBuffer RegBuffer;
typedef struct RegRing RegRing;

/* Why something failed or happened: which text (broker/reply-text.c words each one) and the facts
 * it names. REG_E_* codes are a failed operation's, REG_R_* codes an event's reason. */
typedef enum RegWhyCode {
        REG_WHY_NONE,
        /* subscriptions */
        REG_E_SUBS_LIMIT,
        REG_E_NO_SUB,
        /* attach waits and groups */
        REG_E_GROUP_EMPTY,
        REG_E_GROUP_MISMATCH,
        REG_E_GROUP_JOINED,
        REG_E_WAITS_LIMIT,
        REG_E_GROUP_TIMEOUT,
        REG_E_WAIT_MISSED,
        REG_E_WAIT_TIMEOUT,
        REG_E_STOPPING,          /* the broker is stopping: no wait outlives it */
        /* attach */
        REG_E_SAME_PID,
        REG_E_DEVICE,
        REG_E_NO_BUFFER,
        /* rings */
        REG_E_PART_OF_NO_RING,
        REG_E_RING_MEMBERS_ONLY,
        REG_E_RING_EXISTS,
        REG_E_RING_BUFFERS_LIMIT,
        REG_E_RING_OTHERS,
        REG_E_NO_RING,
        REG_E_PART_MISFIT,
        REG_E_PART_KEY_TAKEN,
        REG_E_RING_SETTING_UP,
        REG_E_RING_MEMBER,
        REG_E_RING_NO_SEAT_READY,
        REG_E_RING_FULL,
        REG_E_RING_SEATS,
        REG_E_SEAT_NOT_WAITING,
        REG_E_RING_GONE,
        REG_E_SEAT_CLAIMS_LIMIT,
        REG_E_NOT_MEMBER,
        REG_R_MEMBER_GRACE_OVER,
        REG_R_RING_GRACE_OVER,
        REG_R_MEMBER_LEFT,
        REG_R_MEMBER_GONE,
        REG_R_EVICTED_UNRETURNED,
        REG_R_EVICTED_LEASE,
        REG_R_RING_CLOSED,
        REG_R_RING_PRODUCER_GONE,
        /* connections */
        REG_E_CONNECTIONS_LIMIT,
        REG_E_CONNECTIONS_PER_UID,
        REG_E_HELLO_AGAIN,
        /* the memory budget (broker/budget.h) */
        REG_E_MEMORY_BUDGET,
        REG_R_PRODUCER_GONE,
        REG_E_REFS_FULL,
        REG_E_NOT_LIVE,
        REG_E_NOTHING_UNDER,
        /* publish */
        REG_E_NAME_ORPHANED,
        REG_E_NAME_TAKEN,
        REG_E_OTHERS_BUFFER,
        REG_E_NOT_IDLE,
        REG_E_KEY_TAKEN,
        REG_E_BUFFERS_LIMIT,
        REG_E_FDS_LIMIT,
        REG_E_HELD_MEMORY_LIMIT,
        REG_E_OTHERS_SEGMENT,
        REG_E_NOT_A_SEGMENT,
        REG_E_SEGMENT_FREED,
        REG_E_NO_SEGMENT,
        REG_E_VIEW_OUTSIDE,
        REG_E_RESTORED_GENERATION,
        /* release, retire, free */
        REG_E_NOT_ATTACHED,
        REG_E_NOT_OWNER,
        /* reclaims and the restart grace */
        REG_E_CLAIM_OWNER,
        REG_E_CLAIM_REPUBLISHED,
        REG_E_CLAIM_DRAINED,
        REG_E_CLAIM_RING_PART,
        REG_E_CLAIM_RETIRED,
        REG_E_CLAIM_RETIRE_AFTER,
        REG_E_RECLAIM_NO_REFS,
        REG_E_REFS_LIMIT,
        REG_E_CLAIM_UNKNOWN,
        REG_E_CLAIMS_PER_UID,
        REG_E_CLAIMS_ALL,
        REG_R_CLAIM_GRACE_OVER,
        REG_R_RESTART_RELEASED,
        REG_R_RESTART_UNCLAIMED,
        REG_R_RESTORED_UNHELD,
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

/* Why a buffer cannot hold views (REG_E_NOT_A_SEGMENT). */
typedef enum RegNotSegment {
        REG_SEGMENT_IS_VIEW = 1,
        REG_SEGMENT_IS_RING_PART,
        REG_SEGMENT_OTHER_KIND,
} RegNotSegment;

/* A peer as a text names it: its id, pid and uid. */
typedef struct RegWho {
        uint64_t peer;
        uint32_t pid, uid;
} RegWho;

/* A code and its facts: the member named after the code (REG_E_NAME_TAKEN: name_taken) holds them;
 * codes without facts have none. Strings are borrowed: valid until the change has been emitted, or,
 * for an operation's result, until the caller has answered with it. */
typedef struct RegWhy {
        RegWhyCode code;
        union {
                /* subscriptions */
                struct { uint32_t subs; } subs_limit;          /* this connection's */
                struct { uint64_t sub; } no_sub;
                /* attach waits and groups */
                struct { const char *group; uint32_t members, asked; } group_mismatch;
                struct { const char *group; } group_joined;
                struct { uint32_t waits; } waits_limit;        /* this connection's */
                struct { const char *group; uint32_t joined, members; } group_timeout;
                struct { const char *name; uint64_t missed; } wait_missed; /* publications retired meanwhile */
                struct { const char *name; } wait_timeout;
                /* attach */
                struct {
                        const char *name;
                        uint64_t pid;          /* the PID both have, each in its own namespace */
                        uint32_t producer_uid;
                        bool producer_declared, consumer_declared; /* a PID only as declared in hello */
                } same_pid;
                struct {
                        const char *name, *device;
                        const char (*gpus)[PROTO_MAX_UUID + 1]; /* the consumer's */
                        uint32_t n_gpus;
                } device;
                struct { uint64_t buffer; } no_buffer;
                /* rings */
                struct { uint64_t buffer; const char *name; } part_of_no_ring;
                struct { uint64_t buffer; const char *name, *ring; } ring_members_only;
                struct { const char *ring; } ring_exists;
                struct { uint32_t uid, buffers; } ring_buffers_limit;
                struct { const char *ring; } ring_others;
                struct { const char *ring; } no_ring;
                struct { const char *ring; uint32_t index; RegPartRule rule; } part_misfit;
                struct { uint64_t buffer; RegWho owner; } part_key_taken;
                struct { const char *ring; uint32_t registered, parts; } ring_setting_up;
                struct { const char *ring; uint32_t seat; } ring_member;
                struct { const char *ring; } ring_no_seat_ready;
                struct { const char *ring; uint32_t seats; } ring_full;
                struct { const char *ring; uint32_t seats; } ring_seats;
                struct { const char *ring; uint32_t seat; uint64_t epoch; } seat_not_waiting;
                struct { const char *ring; } ring_gone;
                struct { uint32_t claims; } seat_claims_limit;  /* this connection's */
                struct { const char *ring; } not_member;
                struct { uint32_t grace_ms; } member_grace_over;
                struct { uint32_t grace_ms; } ring_grace_over;
                struct { uint32_t lease_ms; } evicted_lease;
                struct { RegWho producer; } ring_producer_gone;
                /* connections */
                struct { uint32_t limit; } connections_limit;
                struct { uint32_t uid, connections; } connections_per_uid;
                /* the memory budget */
                struct {
                        uint32_t uid;
                        bool whole_pool;  /* the pool of all uids is full, not only this uid's share */
                        uint64_t used, limit, asked;
                } memory_budget;
                struct { RegWho producer; } producer_gone;
                struct { uint32_t refs; } refs_full;            /* this connection's */
                struct { uint64_t buffer; ProtoState state; const char *name; } not_live;
                struct { const char *name; } nothing_under;
                /* publish */
                struct { const char *name; uint32_t uid; uint64_t buffer; } name_orphaned;
                struct { const char *name; RegWho owner; } name_taken;
                struct { uint64_t buffer; } others_buffer;
                struct { uint64_t buffer; ProtoState state; } not_idle;
                struct { uint64_t buffer; RegWho owner; } key_taken;
                struct { uint32_t uid, buffers; } buffers_limit;
                struct { uint32_t fds, uid; } fds_limit;
                struct { uint32_t uid; uint64_t held, size, limit; } held_memory_limit;
                struct { uint64_t segment; } others_segment;
                struct { uint64_t buffer; RegNotSegment why; } not_a_segment;
                struct { uint64_t segment; } segment_freed;
                struct { uint64_t segment; } no_segment;
                struct { uint64_t offset, size, segment_size; } view_outside;
                struct { uint64_t highest; } restored_generation;
                /* release, retire, free */
                struct { uint64_t buffer; } not_attached;
                struct { uint64_t buffer; const char *name; RegWho owner; } not_owner;
                /* reclaims and the restart grace: what the buffer is now, and what the claimant held */
                struct {
                        uint64_t buffer;
                        ProtoKind kind, held_kind;
                        uint32_t uid, held_uid;
                } claim_owner;
                struct {
                        uint64_t buffer, generation, held_generation;
                        const char *name, *held_name;
                } claim_republished;
                struct { uint64_t buffer; const char *name; } claim_drained;
                struct { uint64_t buffer; const char *name; } claim_ring_part;
                struct { uint64_t buffer; const char *name; uint32_t uid; } claim_retired; /* uid: the claimant's */
                struct {
                        uint64_t buffer;
                        const char *name;
                        uint32_t retire_after, attaches, unvouched;
                } claim_retire_after;
                struct { uint32_t held, asked, limit; } refs_limit;
                struct { uint64_t buffer; const char *name; uint32_t grace_ms; } claim_unknown;
                struct { uint32_t uid, claims; } claims_per_uid;
                struct { uint64_t claims; } claims_all;
                struct { uint32_t grace_ms; } claim_grace_over;
                struct { uint32_t came_back, grace_ms; } restart_released;
                struct { uint32_t grace_ms; } restart_unclaimed;
        };
} RegWhy;

/* Which publication an event is about. */
typedef struct RegBufferKey {
        uint64_t id, generation;
        const char *name;
        ProtoKind kind;
} RegBufferKey;

typedef enum RegChangeType {
        REG_CH_RESULT, /* the request in progress (its asker: `to`) succeeded; what it got: `reply` */
        REG_CH_ANSWER, /* answers request `req` of `to`, which waited: an error says `why`, else `reply` */
        REG_CH_EVENT, /* tells `to` of `event` on `key` (to a subscriber: `sub`); `why`, if any, is its reason */
        REG_CH_RING_EVENT, /* tells `to` of `event` on seat `index` (membership `epoch`) of ring `str`; `why`: reason */
        REG_CH_FORGET_PEER, /* `to` is going away: frames already addressed to it must not reach it */
        REG_CH_CLOSE_FD, /* `fd` (the registry's) is to be closed once the frames that borrow it are out */
} RegChangeType;

/* What a request that succeeded gets besides its success. A result goes where the operation emits it
 * among the step's changes: the protocol fixes that order (docs/protocol.md 6.3, section 7: a publish
 * that replaces a buffer sends the old one's events before its reply; an attach that uses up
 * retire_after sends its reply before the events). */
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
        uint64_t req;                /* REG_CH_ANSWER: the request that waited */
        RegReplyKind reply;          /* results, and answers without why */
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
