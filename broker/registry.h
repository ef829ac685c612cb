/* The registry: every buffer, name, reference, waiter, subscription and group the broker knows,
 * as a pure state machine. Operations take the acting peer (and, where it counts, the current time),
 * return their result (0, a registry code with its facts, or -ENOMEM), and say what each one changed
 * as changes (registry-change.h: the result of a success, answers to requests that waited, events,
 * fds let go of) into the caller's RegSink; the reply layer (broker/reply.c) turns results and
 * changes into frames and the caller does the I/O. Nothing here reads a socket,
 * a clock or a file, encodes a frame or words a message. Tested without sockets
 * (tests/unit/test-registry.c) and fuzzed with operation sequences (tests/fuzz/fuzz-registry.c).
 *
 * Ownership: the registry owns buffer fds from the moment an operation takes them, and hands fds
 * it no longer needs over as REG_CH_CLOSE_FD changes. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "broker-limits.h"
#include "budget.h"
#include "creds.h"
#include "proto.h"
#include "registry-change.h"
#include "ring.h"

typedef struct Registry Registry;
typedef struct RegPeer RegPeer;
typedef struct RegBuffer RegBuffer;

/* What a hello declares. Used only to diagnose, never to authorize. */
typedef struct PeerHello {
        uint64_t pid, pidns;       /* as the peer sees itself */
        uint64_t shm_dev, shm_ino; /* the identity of its /dev/shm (0, 0: not said) */
        const char *label;
        uint32_t n_gpus;
        const char *const *gpus;
} PeerHello;

typedef struct RegPublish {
        const char *name;
        bool again;              /* publish the idle buffer `buffer` again (nothing else is read) */
        uint64_t buffer;         /* new memory: the id (key) the producer chose, 0 = let the broker pick */
        ProtoBufferInfo info;    /* new memory: what it is (the new buffer takes a copy) */
        const char *device;      /* GPU UUID for the CUDA kinds, NULL for memfd */
        const uint8_t *meta;     /* msgpack map, validated; NULL for none or an empty one */
        uint32_t meta_len;
        bool has_meta;           /* publishing again: replace the metadata (an empty map clears it) */
        const uint8_t *handle;   /* cuda-legacy: PROTO_LEGACY_HANDLE_SIZE bytes */
        int fd;                  /* memfd and cuda-vmm; the registry takes it in every case */
        uint32_t retire_after;   /* retire automatically after this many attaches; 0 = never */
        /* Registered again after the producer lost its broker connection: the memory is the same
         * publication as before (generation), consumers may still hold it and come back to reclaim
         * their references, so during the restart grace it does not drain before they could. */
        bool restored;
        uint64_t generation;     /* restored: the publication's generation */
        bool retired;            /* restored: it was retired already (register it, do not publish it) */
        /* A view (info.segment set): the segment's size, when fd is the segment's memory (the first
         * view published of it); the segment is registered with it, under no name. */
        uint64_t segment_size;
} RegPublish;

/* A reference a reconnecting consumer still holds (its reclaim request). */
typedef struct RegReclaim {
        uint64_t buffer, generation;
        uint32_t refs;
        uint32_t owner_uid;      /* the producer's uid, as the consumer was told at attach */
        const char *name;        /* the name it attached under */
        ProtoKind kind;
} RegReclaim;

/* A ring's shape (ring-create). */
typedef struct RegRingSpec {
        const char *name;
        ProtoKind kind;          /* of the slots */
        uint64_t slot_size;
        uint32_t n_slots, n_members;
        ProtoMode mode;
        uint32_t lease_ms;       /* backpressure: how long a member may hold the producer up */
        const char *device;      /* CUDA slots: their GPU */
        /* Declared again after a restart: the seats its producer still counts as seated (seat i
         * with epoch epochs[i], 0 for none), waiting for their members to come back, and the epoch
         * the next join gets. */
        bool restored;
        uint64_t next_epoch;
        const uint64_t *epochs;  /* n_members entries, or NULL */
} RegRingSpec;

typedef struct RegRing RegRing;

typedef struct RegConfig {
        Limits limits;
        uint64_t epoch;            /* this broker instance (clients see it in hello and ping) */
        uint64_t first_generation; /* generations count up from here (the time since boot in µs at
                                    * start, so they keep increasing across restarts) */
        uint64_t id_seed;          /* seeds the ids the broker picks for publishes that name none */
        uint64_t start_ms;         /* the time of creation, on the clock operations' now_ms use */
        uint32_t restart_grace_ms; /* how long after start reconnecting holders may reclaim */
        /* The memory budget what peers make the registry keep is charged to (the caller's, which
         * outlives the registry; NULL: none), and what a connection costs besides its RegPeer (the
         * caller's own structures for it and the kernel's socket), charged with it. */
        Budget *budget;
        uint32_t peer_extra;
} RegConfig;

typedef struct RegCounters {
        uint64_t publishes, republishes, attaches, attaches_cached, attach_waits, timeouts;
        uint64_t releases, retires, drains, revokes, frees, peers_added, peers_removed;
        uint64_t groups_completed, groups_failed, events;
        uint64_t reclaims, reclaims_refused, claims_revoked;
        /* Frames ring members took, as their pages said when the broker last read them (a ring
         * listing or ring-stat: registry_ring_note_taken); never goes back. */
        uint64_t ring_frames_taken;
} RegCounters;

/* Creates an empty registry. 0 or -ENOMEM. */
int registry_new(Registry **ret, const RegConfig *cfg);

/* Frees everything and closes every fd the registry still holds. Returns NULL. */
Registry *registry_free(Registry *r);

uint64_t registry_epoch(const Registry *r);
const RegCounters *registry_counters(const Registry *r);

/* ---- peers ---- */

/* Adds a connected peer. 0, -ENOMEM, or a code (REG_E_CONNECTIONS_LIMIT, REG_E_CONNECTIONS_PER_UID,
 * REG_E_MEMORY_BUDGET) when there are too many connections (in all, or for its uid) or its uid's
 * memory budget has no room for one more, with why (unless NULL) filled in. */
int registry_peer_add(Registry *r, const PeerCreds *creds, uint64_t now_ms, void *userdata, RegPeer **ret,
                      RegWhy *why);

/* Removes a peer that disconnected or died: cancels its waits, releases its references, revokes or
 * orphans its buffers (broker-held ones stay until retired and drained), and frees it. */
void registry_peer_remove(Registry *r, RegPeer *p, RegSink *out);

/* Records a hello. 0, -ENOMEM, REG_E_HELLO_AGAIN on a second hello, or REG_E_MEMORY_BUDGET when the
 * GPUs it declares do not fit in its uid's memory budget (why, unless NULL, filled in). */
int registry_peer_hello(Registry *r, RegPeer *p, const PeerHello *h, RegWhy *why);

bool registry_peer_said_hello(const RegPeer *p);
uint32_t registry_peer_refs(const RegPeer *p);
uint64_t registry_peer_id(const RegPeer *p);
const PeerCreds *registry_peer_creds(const RegPeer *p);
/* What the peer called itself in hello ("" before). */
const char *registry_peer_label(const RegPeer *p);
void *registry_peer_userdata(const RegPeer *p);

/* A frame for this peer could not be built or queued; its caller must disconnect it. */
void registry_peer_mark_lost(RegPeer *p);

bool registry_peer_lost(const RegPeer *p);

/* The next peer marked lost and not yet taken (each once), or NULL. */
RegPeer *registry_take_lost(Registry *r);

/* ---- operations ----
 *
 * Each operation acts for peer p and returns its result: 0 once it succeeded, a registry code
 * (RegWhyCode, positive) with its facts in *why when it failed and changed nothing, or -ENOMEM (the
 * caller cuts p off). What a success gives the asker is a change of its own, REG_CH_RESULT, which
 * the operation emits at the place among its other changes where the reply belongs; a failure emits
 * nothing, and the caller answers with the code (broker/reply.c maps codes to statuses and texts).
 * Only the two operations whose request may wait (registry_attach by name with a timeout,
 * registry_group_join) take the request's id: they keep it in the wait, and answer it later with
 * REG_CH_ANSWER (the wait is over: an attach, the group complete, a deadline, the broker stopping).
 * They return 0 for a request that waits. */

int registry_publish(Registry *r, RegPeer *p, RegPublish *a, RegWhy *why, RegSink *out);

/* Attaches by name (waiting up to timeout_ms for a publish, as request id) or, with name NULL, by
 * buffer id. The buffer's fd travels only if this peer has not received it before (or said unmap
 * since). */
int registry_attach(Registry *r, RegPeer *p, uint64_t id, const char *name, uint64_t buffer, uint32_t timeout_ms,
                    uint64_t now_ms, RegWhy *why, RegSink *out);
/* The peer dropped its cached mapping of buffer. */
int registry_unmap(Registry *r, RegPeer *p, uint64_t buffer, RegWhy *why, RegSink *out);
int registry_release(Registry *r, RegPeer *p, uint64_t buffer, RegWhy *why, RegSink *out);
/* Retire and free are for the producer, for a peer of its uid once it is gone, or for an admin
 * (as_admin: the policy lets this peer manage other uids' buffers). */
int registry_retire(Registry *r, RegPeer *p, uint64_t buffer, bool as_admin, RegWhy *why, RegSink *out);
int registry_free_buffer(Registry *r, RegPeer *p, uint64_t buffer, bool as_admin, RegWhy *why, RegSink *out);
/* The buffer a request names by id (0, *ret), or REG_E_NO_BUFFER: the one place that fails so.
 * request.c resolves a buffer once with it, for its policy check (which needs the name) and for
 * the operation, through the registry_buffer_* forms below. */
int registry_request_buffer(const Registry *r, uint64_t buffer, RegBuffer **ret, RegWhy *why);
/* Attach by id, retire and free on a buffer resolved in the same turn; registry_attach (by id),
 * registry_retire and registry_free_buffer resolve it first, for callers that hold only the id. */
int registry_buffer_attach(Registry *r, RegPeer *p, RegBuffer *b, RegWhy *why, RegSink *out);
int registry_buffer_retire(Registry *r, RegPeer *p, RegBuffer *b, bool as_admin, RegWhy *why, RegSink *out);
int registry_buffer_free(Registry *r, RegPeer *p, RegBuffer *b, bool as_admin, RegWhy *why, RegSink *out);
/* A reconnecting consumer registers a reference it still holds (docs/protocol.md 6.15). Succeeds when
 * the buffer is that same publication and has not drained; is kept pending (a claim, which its
 * result says) while the broker is in its restart grace and nobody registered the buffer yet; else
 * fails with a REG_E_CLAIM_* code. */
int registry_reclaim(Registry *r, RegPeer *p, const RegReclaim *a, RegWhy *why, RegSink *out);
/* True while reconnecting holders may still come back (the restart grace). */
bool registry_in_grace(const Registry *r);

/* Rings (registry-rings.c, docs/protocol.md 6.16). ring-part registers part `index` of a ring like a
 * publish of new memory (a takes the same fields; its name is derived from the ring's). */
int registry_ring_create(Registry *r, RegPeer *p, const RegRingSpec *s, RegWhy *why, RegSink *out);
int registry_ring_part(Registry *r, RegPeer *p, const char *ring, uint32_t index, RegPublish *a, RegWhy *why,
                       RegSink *out);
int registry_ring_join(Registry *r, RegPeer *p, const char *ring, RegWhy *why, RegSink *out);
/* A member that lost its broker asks for its seat back (index, epoch): bound at once if the ring
 * has that seat waiting, kept pending (a seat claim) during the restart grace if the ring is not
 * back yet. */
int registry_ring_rejoin(Registry *r, RegPeer *p, const char *ring, uint32_t index, uint64_t epoch, RegWhy *why,
                         RegSink *out);
int registry_ring_leave(Registry *r, RegPeer *p, const char *ring, RegWhy *why, RegSink *out);
int registry_ring_evict(Registry *r, RegPeer *p, const char *ring, uint32_t index, uint64_t epoch, RegWhy *why,
                        RegSink *out);
int registry_ring_close(Registry *r, RegPeer *p, const char *ring, RegWhy *why, RegSink *out);
RegRing *registry_ring_by_name(const Registry *r, const char *name);
int registry_subscribe(Registry *r, RegPeer *p, const char *prefix, RegWhy *why, RegSink *out);
int registry_unsubscribe(Registry *r, RegPeer *p, uint64_t sub, RegWhy *why, RegSink *out);
/* Joins group (as request id) of `members` members: waits until the last one joins, or timeout_ms. */
int registry_group_join(Registry *r, RegPeer *p, uint64_t id, const char *group, uint32_t members,
                        uint32_t timeout_ms, uint64_t now_ms, RegWhy *why, RegSink *out);

/* Answers every pending attach and group join with REG_E_STOPPING (the broker is stopping). */
void registry_cancel_waits(Registry *r, RegSink *out);

/* Fails every wait whose deadline is at or before now_ms. */
void registry_expire(Registry *r, uint64_t now_ms, RegSink *out);

/* The earliest pending deadline, or UINT64_MAX. */
uint64_t registry_next_deadline(const Registry *r);

/* ---- read-only views (broker/inspect.c) ---- */

/* Buffers in registration order. A buffer's cursor (registry_buffer_cursor) increases with it;
 * registry_buffer_after gives the first buffer whose cursor is above `after` (0: the first). */
RegBuffer *registry_buffer_after(const Registry *r, uint64_t after);
RegBuffer *registry_buffer_next(const Registry *r, const RegBuffer *b);
uint64_t registry_buffer_cursor(const RegBuffer *b);
RegBuffer *registry_buffer_by_id(const Registry *r, uint64_t id);
/* The live buffer published under name, or NULL. */
RegBuffer *registry_buffer_by_name(const Registry *r, const char *name);
const char *registry_buffer_name(const RegBuffer *b);
/* Whether b is a part of a ring: live under no name, attachable only by the ring's members. */
bool registry_buffer_ring_part(const RegBuffer *b);

/* What the registry knows of a buffer. Points into the registry: valid until the next operation. */
typedef struct RegBufferView {
        uint64_t id, generation, refs;
        const char *name;
        ProtoBufferInfo info;  /* kind, size, offset, writable, broker_held, segment: as published */
        bool is_view;
        uint64_t segment_size; /* a view: its segment's size (what a consumer maps) */
        ProtoState state;
        uint32_t holders;
        uint64_t owner;        /* the producer's peer id; 0 once it is gone (an orphan) */
        uint32_t owner_uid, owner_pid;
        uint64_t owner_self_pid; /* the producer's PID in its own namespace (0: unknown) */
        const char *device;    /* NULL for memfd */
        const uint8_t *meta;
        uint32_t meta_len;
        const uint8_t *handle; /* cuda-legacy: PROTO_LEGACY_HANDLE_SIZE bytes, else NULL */
        bool restored;         /* registered again after a restart, holders may still come back */
        int fd;                /* the fd that travels to a consumer (a view's: its segment's), or -1 */
} RegBufferView;

void registry_buffer_view(const RegBuffer *b, RegBufferView *ret);


/* Calls fn for each peer holding references to b. */
void registry_buffer_holders(const RegBuffer *b, void (*fn)(const RegPeer *p, uint32_t refs, void *ud),
                             void *ud);

/* Rings in creation order, paged like buffers (registry_ring_cursor increases with each ring). */
RegRing *registry_ring_after(const Registry *r, uint64_t after);
RegRing *registry_ring_next(const Registry *r, const RegRing *g);
uint64_t registry_ring_cursor(const RegRing *g);

/* One seat of a ring, for listings. */
typedef struct RegRingSeatView {
        uint64_t epoch;        /* of its membership; 0: the seat is free */
        const RegPeer *member; /* NULL: free, or waiting for its member to come back (reserved) */
        bool reserved;         /* restored after a broker restart; its member has not come back yet */
        int page_fd;           /* its member page's memfd, the registry's (-1: not registered yet) */
} RegRingSeatView;

/* What the registry knows of a ring. Points into the registry: valid until the next operation. */
typedef struct RegRingView {
        const char *name;
        ProtoKind kind; /* of the slots */
        uint64_t slot_size;
        uint32_t n_slots, n_members;
        ProtoMode mode;
        uint32_t lease_ms;
        const char *device;    /* NULL for memfd slots */
        const RegPeer *owner;  /* its producer (a ring dies with it) */
        bool complete;         /* set up (reg_ring_set_up): joinable, its seats with parts at least */
        uint32_t taken;        /* seats with a member, or waiting for one */
        int ctl_fd;            /* the control page's memfd, the registry's (-1: not registered yet) */
        RegRingSeatView seats[RING_MAX_MEMBERS];
} RegRingView;

void registry_ring_view(const RegRing *g, RegRingView *ret);
/* What a ring listing read on seat i's page: membership epoch (the view's) says it took `taken`
 * frames, already clamped to what it could have (ring_read). Counts what is new since the last
 * reading of that membership in counters.ring_frames_taken; a page that says less than before
 * (a hostile or restarted member) takes nothing back. */
void registry_ring_note_taken(Registry *r, RegRing *g, uint32_t i, uint64_t epoch, uint64_t taken);

RegPeer *registry_peer_first(const Registry *r);
RegPeer *registry_peer_next(const Registry *r, const RegPeer *p);
/* What the registry knows of a peer; valid until the next operation. */
typedef struct RegPeerView {
        uint64_t id;
        PeerCreds creds;
        uint64_t pidns;        /* the kernel's, else what it declared */
        bool pidns_declared;
        uint64_t self_pid;     /* its PID in its own namespace: the kernel's, else what it declared */
        uint64_t shm_dev, shm_ino; /* its /dev/shm, as declared (0, 0: not said) */
        const char *label;
        uint32_t n_refs, n_subs, n_waits, n_gpus;
        uint64_t connected_ms, owned;
        const char (*gpus)[PROTO_MAX_UUID + 1];
} RegPeerView;

void registry_peer_view(const RegPeer *p, RegPeerView *ret);

typedef struct RegGauges {
        uint64_t peers, buffers, live, retired, idle, orphaned, refs, fds, waits, subs, groups, names;
        uint64_t claims_pending, restored; /* reclaims waiting for their buffer; restored buffers in grace */
        uint64_t rings, ring_members;
        /* Bytes of buffer memory registered (views not counted again), and of buffers consumers
         * hold references to (each buffer once per holder), by kind. */
        uint64_t shared_bytes[_PROTO_KIND_MAX], held_bytes[_PROTO_KIND_MAX];
        uint64_t held_memory; /* bytes of broker-held buffers' memory */
} RegGauges;
void registry_gauges(const Registry *r, RegGauges *g);

/* The bytes of RegGauges for one uid: of the buffers its peers published (shared) and of those
 * they hold references to (held); 0 for a uid the broker knows nothing of. */
void registry_uid_bytes(const Registry *r, uint32_t uid, uint64_t *shared, uint64_t *held);

/* The protocol's name rules (proto_name_valid) under their old names, for broker/inspect.c until
 * it calls proto's directly. */
static inline bool registry_name_valid(const char *s, size_t len)
{
        return proto_name_valid(s, len);
}

static inline bool registry_prefix_valid(const char *s, size_t len)
{
        return proto_prefix_valid(s, len);
}
