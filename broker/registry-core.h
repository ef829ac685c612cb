/* The registry's own types, shared by its parts: uid accounts, names, holds, subscriptions, peers,
 * buffers and the registry itself, with what the core (registry-core.c) offers the parts above it:
 * accounts and charges, emitting changes and results, names, holds, a buffer's life and the events
 * it causes. The parts are layered, each calling only the ones below it (docs/design.md "Registry"):
 * core; subs and claims; rings; waits; peers (and views, read-only); registry.c. Each part has a
 * header of its own next to this one (registry-waits.h, registry-claims.h, registry-rings-core.h,
 * registry-subs.h). Nothing outside broker/registry*.c includes these, except the white-box checks
 * of tests/unit/regaudit.h (through registry-internal.h). */
#pragma once

#include <stdio.h>
#include <string.h>

#include "budget.h"
#include "heap.h"
#include "hmap.h"
#include "list.h"
#include "macro.h"
#include "registry.h"

typedef struct UidAcct {
        HNode node;
        uint32_t uid;
        uint32_t connections, buffers, fds;
        uint32_t claims; /* pending claims of its peers */
        uint64_t shared_bytes, held_bytes; /* as Registry's, for this uid's buffers and holds */
        uint64_t held_memory; /* bytes of its broker-held buffers' memory (Limits.held_memory_per_uid) */
} UidAcct;

typedef struct RegName {
        HNode node;
        RegBuffer *live; /* the buffer published under this name, if any */
        List waits;      /* Wait.link, oldest first */
        uint64_t publishes; /* while the entry lives: so a wait can tell it missed a publication */
        char name[];
} RegName;

/* A pending deadline; embedded in attach waits and groups. */
typedef enum TimerType { TIMER_WAIT, TIMER_GROUP, TIMER_GRACE } TimerType;
typedef struct Timer {
        HeapNode node;
        TimerType type;
} Timer;

/* One peer's relation to one buffer: its references (count) and whether it received the
 * buffer's fd (mapped), in which case it may keep a cached mapping after releasing, is not sent
 * the fd again, and is told when the broker forgets the buffer. */
typedef struct Hold {
        HNode node; /* key: (peer id, buffer id) */
        RegBuffer *buf;
        RegPeer *peer;
        uint32_t count;
        bool mapped;
        List buf_link, peer_link;
} Hold;

/* A peer watching a name prefix (registry-subs.c subscribes; the core tells subscribers). */
typedef struct Sub {
        uint64_t id;
        RegPeer *peer;
        List peer_link, link;
        uint32_t prefix_len;
        uint32_t cost; /* charged to its peer's uid (held budget) */
        char prefix[];
} Sub;

/* References a peer of uid still held on a buffer when the broker ended its connection (the buffer
 * stayed): what the broker can vouch for when a peer of that uid comes back and reclaims them
 * (registry-claims.c). */
typedef struct DepartedHold {
        List link; /* RegBuffer.departed */
        uint32_t uid, refs;
} DepartedHold;

struct RegPeer {
        uint64_t id;
        PeerCreds creds;
        bool hello, lost;
        uint64_t decl_pid, decl_pidns;
        uint64_t decl_shm_dev, decl_shm_ino; /* its /dev/shm as it said (diagnosis only) */
        char label[PROTO_MAX_LABEL + 1];
        uint32_t n_gpus;
        char (*gpus)[PROTO_MAX_UUID + 1];
        List link;  /* Registry.peers, in id order */
        List owned; /* RegBuffer.owner_link */
        List holds; /* Hold.peer_link */
        List waits; /* Wait.peer_link */
        List subs;  /* Sub.peer_link */
        List claims; /* Claim.peer_link */
        List rings;  /* RegRing.owner_link: rings it produces */
        List seats;  /* RingSeat.peer_link: rings it is a member of */
        List seat_claims; /* SeatClaim.peer_link */
        uint32_t n_refs, n_waits, n_subs;
        uint32_t n_claim_refs; /* references its pending claims ask for (they count against its quota) */
        uint32_t n_seat_claims; /* its SeatClaims: bounded like its waits */
        uint64_t charged;       /* held budget for the connection itself and its hello (reg_peer_cost) */
        bool leaving;           /* registry_peer_remove is dealing with its buffers */
        UidAcct *acct;
        uint64_t connected_ms;
        void *userdata;
        Registry *reg;
        List lost_link; /* in Registry.lost once marked lost */
};

struct RegBuffer {
        uint64_t id;        /* the key its producer chose (or the broker drew); stable across restarts */
        uint64_t seq;       /* registration order: the listing cursor */
        HNode by_id, by_seq;
        List link; /* Registry.buffers, in registration order */
        char *name;         /* heap: most names are short, and a registry holds 100k buffers */
        RegName *published; /* while live */
        uint64_t generation;
        ProtoBufferInfo info; /* kind, size, offset, writable, broker_held: as published */
        ProtoState state;
        char *device;       /* GPU UUID, NULL for memfd */
        uint8_t *meta;
        uint32_t meta_len;
        uint8_t *handle;    /* cuda-legacy only: PROTO_LEGACY_HANDLE_SIZE bytes */
        int fd;
        bool free_on_drain;
        /* Registered again after a restart while holders may still come back: it does not drain
         * before the grace ends (Registry.restored lists these). */
        bool restored;
        List restored_link;
        uint32_t reclaimed; /* holders that came back and reclaimed */
        List departed;      /* DepartedHold.link: until the buffer drains or goes */
        uint32_t n_departed;
        /* A part of a ring: attachable only by the ring's members (a member page only by its own
         * member), never by name, and not at all once the ring is gone. */
        bool ring_part;
        RegRing *ring;
        uint32_t ring_index;
        uint32_t retire_after, attaches;
        /* A view (info.segment set): the buffer whose memory it names a range of, and its place in
         * that segment's views. A segment outlives every view of it: it is forgotten only once its
         * last view is (reg_segment_release_if_done). Views have no fd of their own. */
        RegBuffer *segment;
        List view_link;
        List views;         /* a segment's views (RegBuffer.view_link) */
        uint32_t n_views;
        bool destroying;    /* being forgotten: its views go first, without looking back at it */
        RegPeer *owner; /* NULL once the producer is gone (broker-held buffers only) */
        uint64_t owner_id, owner_pidns;
        bool owner_pidns_declared;
        uint32_t owner_uid, owner_pid;
        uint64_t owner_self_pid;     /* the producer's PID in its own namespace (peer_self_pid) */
        bool owner_self_pid_declared;
        UidAcct *acct;
        List owner_link;
        List holds; /* Hold.buf_link */
        uint64_t refs;
        uint32_t holders;
        uint64_t cost;      /* charged to owner_uid (held budget): reg_buffer_cost */
};

struct Registry {
        Limits limits;
        Budget *budget;       /* NULL: none (every charge fits) */
        uint32_t peer_extra;  /* what a connection costs outside the registry (RegConfig) */
        uint64_t epoch;
        uint64_t next_peer_id, next_seq, next_sub_id, generation;
        uint64_t id_state;                  /* the generator of ids the broker picks (splitmix64) */
        HMap buffers_by_id, buffers_by_seq, names, groups, holds, uids, claims, rings;
        List buffers, peers, subs;
        Heap timers;
        RegCounters counters;
        uint64_t n_peers, n_buffers, n_waits, n_subs, n_groups, n_refs, n_fds;
        uint64_t n_state[_PROTO_STATE_MAX]; /* buffers per state, kept current: stats never walk */
        /* Bytes by kind, kept current likewise: of buffer memory registered (a buffer that is not
         * a view: a view's bytes are its segment's), and of buffers consumers hold references to
         * (each buffer's size once per peer holding it, a view's own size). */
        uint64_t shared_bytes[_PROTO_KIND_MAX], held_bytes[_PROTO_KIND_MAX];
        uint64_t n_orphaned;
        uint64_t held_memory;               /* bytes of every broker-held buffer's memory */
        List lost;                          /* RegPeer.lost_link: peers the caller must disconnect */
        /* The restart grace: reconnecting holders may reclaim until it ends (a TIMER_GRACE). */
        bool in_grace;
        uint32_t restart_grace_ms;
        Timer grace_timer;
        List restored;                      /* RegBuffer.restored_link */
        uint64_t n_claims;
        uint64_t n_rings, n_seated;
        List ring_list;   /* RegRing.link, oldest first */
        uint64_t next_ring_seq;
        List seat_claims; /* SeatClaim.link */
        uint64_t n_seat_claims;
};

static inline uint64_t hash_str(const char *s)
{
        return hash_bytes(s, strlen(s));
}

static inline uint64_t hold_hash(uint64_t peer, uint64_t buffer)
{
        uint64_t k[2] = { peer, buffer };
        return hash_bytes(k, sizeof(k));
}

static inline void copy_str(char *dst, size_t cap, const char *src)
{
        size_t n = src ? strnlen(src, cap - 1) : 0;
        memcpy(dst, src ? src : "", n);
        dst[n] = 0;
}

/* The PID namespace a peer lives in: what the kernel told the broker beats what the peer said. */
static inline uint64_t peer_pidns(const RegPeer *p)
{
        return p->creds.pidns ? p->creds.pidns : p->decl_pidns;
}

/* peer_pidns() is only the peer's word (diagnosis only: it grants nothing). */
static inline bool peer_pidns_declared(const RegPeer *p)
{
        return !p->creds.pidns && p->decl_pidns;
}

/* The PID a peer has in its own PID namespace, which legacy CUDA IPC compares: the kernel's where
 * the broker sees the peer, else what it said in hello (0: unknown). */
static inline uint64_t peer_self_pid(const RegPeer *p)
{
        return p->creds.self_pid ? p->creds.self_pid : p->decl_pid;
}

/* peer_self_pid() is only the peer's word. A peer that lies can only make attaches of its own, or of
 * its own buffers, be refused: the kernel's view is taken wherever the broker has one. */
static inline bool peer_self_pid_declared(const RegPeer *p)
{
        return !p->creds.self_pid && p->decl_pid;
}

UidAcct *reg_acct_get(Registry *r, uint32_t uid);

/* What one frame (a reply or an event) costs while the outbox holds it: its encoding's allocation
 * and its slot. Each thing that makes the broker send a frame unasked (a subscription, a wait, a
 * reference) is charged one, so that what one step encodes at once is paid for in advance. */
#define REG_FRAME_COST 576
/* What an entry costs in a hash table or the timer heap beside the entry itself (its bucket). */
#define REG_INDEX_COST 16

/* Charges n bytes to uid's held budget (budget.h). 0; REG_E_MEMORY_BUDGET with why (unless NULL)
 * naming the budget; or -ENOMEM. */
int reg_charge(Registry *r, uint32_t uid, uint64_t n, RegWhy *why);

/* Gives back n bytes charged to uid with reg_charge. */
void reg_uncharge(Registry *r, uint32_t uid, uint64_t n);

void reg_acct_put(Registry *r, UidAcct *a);

/* An operation fails with w: its facts go to *why, its code is what the operation returns. */
static inline int reg_fail(RegWhy *why, RegWhy w)
{
        *why = w;
        return (int)w.code;
}

/* Emits a change (registry-change.h) for the caller to deliver. */
void reg_emit(RegSink *o, const RegChange *c);

/* Who hears how an operation turned out: the asker of the request in progress, or a request that
 * waited (its id is kept in the wait) and is answered now. */
typedef struct RegAsker {
        RegPeer *peer;
        bool waited;
        uint64_t req; /* waited: the request's id */
} RegAsker;

static inline RegAsker reg_asker(RegPeer *p)
{
        return (RegAsker){ p, false, 0 };
}

/* Says that a's request succeeded with what c carries (its reply kind and fields), at this point of
 * the step: the result of the request in progress, or the answer to one that waited. */
static inline void reg_succeed(RegSink *o, RegAsker a, RegChange c)
{
        c.type = a.waited ? REG_CH_ANSWER : REG_CH_RESULT;
        c.to = a.peer;
        c.req = a.req;
        reg_emit(o, &c);
}

/* The request in progress succeeded, with nothing to say besides. */
static inline void reg_done(RegSink *o, RegPeer *p)
{
        reg_succeed(o, reg_asker(p), (RegChange){ .reply = REG_RE_PLAIN });
}

/* Answers request req of p, which waited, with an error: why. */
static inline void reg_answer_error(RegSink *o, RegPeer *p, uint64_t req, RegWhy why)
{
        reg_emit(o, &(RegChange){ .type = REG_CH_ANSWER, .to = p, .req = req, .why = why });
}

/* Hands fd (the registry's) over, to be closed once the frames that borrow it are out. */
void reg_close_fd(RegSink *o, int fd);

/* Tells p of event ev on b (a subscriber: sub, else 0); why (REG_WHY_NONE: none) is its reason. */
void reg_tell(RegSink *o, RegPeer *p, ProtoEvent ev, const RegBuffer *b, uint64_t sub, RegWhy why);

/* Tells p of event ev on a publication the registry no longer (or not yet) has as a buffer. */
static inline void reg_tell_key(RegSink *o, RegPeer *p, ProtoEvent ev, RegBufferKey key, RegWhy why)
{
        reg_emit(o, &(RegChange){ .type = REG_CH_EVENT, .to = p, .event = ev, .key = key, .why = why });
}

RegBuffer *reg_buffer_lookup(const Registry *r, uint64_t id);

RegName *reg_name_lookup(const Registry *r, const char *name);

/* The entry of name, made if there is none. NULL: out of memory. */
RegName *reg_name_get(Registry *r, const char *name);

/* A name entry lives while a buffer is published under it or someone waits for it. */
void reg_name_put(Registry *r, RegName *e);

/* Moves b to state, keeping the per-state counts. */
static inline void reg_buffer_set_state(Registry *r, RegBuffer *b, ProtoState state)
{
        r->n_state[b->state]--;
        r->n_state[state]++;
        b->state = state;
}

/* What a buffer costs its producer's uid while the broker knows it (its name, device, legacy handle
 * and metadata count). */
uint64_t reg_buffer_cost(const char *name, const char *device, bool handle, uint32_t meta_len);

/* Replaces b's metadata (len bytes; NULL or 0: none). 0 or -ENOMEM. */
int reg_buffer_set_meta(RegBuffer *b, const uint8_t *meta, uint32_t len);

/* Makes p the producer of b, with what the attach checks need to know of it. */
void reg_buffer_set_owner(RegBuffer *b, RegPeer *p);

/* Registers new memory for p under the id it chose (no buffer has it: the caller checked) or one
 * drawn for it, within p's quotas; allocates the buffer and indexes it. Takes *fd. 0 with *ret (state
 * none, owned by p, under no name), a code with why, or -ENOMEM. */
int reg_buffer_register(Registry *r, RegPeer *p, const RegPublish *a, int *fd, RegBuffer **ret, RegWhy *why);

/* The buffer whose memory (and fd) b is: its segment for a view, else b itself. */
static inline RegBuffer *reg_memory_of(RegBuffer *b)
{
        return b->segment ? b->segment : b;
}

/* A segment whose last view went is forgotten now if nothing else keeps it: it is idle and was
 * freed, or its producer is gone. */
void reg_segment_release_if_done(Registry *r, RegBuffer *s, RegSink *o);

/* What a hold costs its peer's uid: itself, its index slot, and the freed event it may cause. */
#define REG_HOLD_COST (budget_alloc_cost(sizeof(Hold)) + REG_INDEX_COST + REG_FRAME_COST)

/* p's hold on b, or NULL. */
Hold *reg_hold_lookup(const Registry *r, const RegPeer *p, const RegBuffer *b);
/* h's peer becomes (sign 1) or stops being (-1) a holder of h's buffer: one holding a reference,
 * counted in the buffer's holders and the bytes held (the registry's and the peer's uid's). */
void reg_holder_count(Registry *r, const Hold *h, int sign);

/* Drops a whole hold (all of one peer's references to one buffer, and its mapped mark). */
void reg_hold_drop(Registry *r, Hold *h);

/* Adds refs references of p to b (creating the hold); mapped marks that p has b's memory mapped
 * (for a view: its segment's, which is what p maps). 0, -ENOMEM, or REG_E_MEMORY_BUDGET (why filled
 * in) when a new hold does not fit in p's uid's memory budget. */
int reg_hold_add(Registry *r, RegPeer *p, RegBuffer *b, uint32_t refs, bool mapped, RegWhy *why);

/* A retired buffer drains once nothing references it, unless holders may still come back: a
 * restored buffer during the restart grace. Drains it if it may (reason for the events, or NULL). */
void reg_buffer_drain_if_done(Registry *r, RegBuffer *b, RegWhy why, RegSink *o);

/* Forgets a buffer and closes its fd (through the outbox). Peers that received the fd are told,
 * so they can drop cached mappings (which would otherwise keep the memory alive). */
void reg_buffer_destroy(Registry *r, RegBuffer *b, RegSink *o);

/* The last reference of a retired buffer went: tell the producer it may reuse or free the memory. */
void reg_buffer_drain(Registry *r, RegBuffer *b, RegWhy why, RegSink *o);

/* The memory is gone (its producer died and the broker may not keep it): holders are told to stop
 * using it, their references vanish and no drained event follows. */
void reg_buffer_revoke(Registry *r, RegBuffer *b, RegWhy why, RegSink *o);

/* The checks an attach (and a reclaim) makes of consumer p on b: its PID namespace and devices. 0, or
 * a code with why. */
int reg_attach_diagnose(const RegBuffer *b, const RegPeer *p, RegWhy *why);

/* Retires live b: off its name, subscribers told, drained if nothing holds it. */
void reg_buffer_retire(Registry *r, RegBuffer *b, RegSink *o);

/* Tells every subscriber whose prefix matches the buffer's name. */
void reg_notify_subscribers(Registry *r, ProtoEvent ev, const RegBuffer *b, RegWhy why, RegSink *o);

/* Takes b off the restored list (it leaves the registry, or the grace ended). */
void reg_restored_forget(Registry *r, RegBuffer *b);

/* Forgets the departed holds b remembers: b drains or goes (its memory may be reused). */
void reg_departed_forget(RegBuffer *b);

/* b leaves the registry: if it is a part of a ring, the ring no longer has it. */
void reg_ring_part_gone(RegBuffer *b);
