/* Internals shared by the registry's files: registry.c (buffers, names, references and the
 * operations on them), registry-peers.c, registry-waits.c (attach waits, groups, deadlines),
 * registry-subs.c and registry-views.c. Nothing outside broker/registry*.c includes this. */
#pragma once

#include <stdio.h>
#include <string.h>

#include "heap.h"
#include "hmap.h"
#include "list.h"
#include "macro.h"
#include "registry.h"

typedef struct UidAcct {
        HNode node;
        uint32_t uid;
        uint32_t connections, buffers, fds;
} UidAcct;

typedef struct RegName {
        HNode node;
        RegBuffer *live; /* the buffer published under this name, if any */
        List waits;      /* Wait.link, oldest first */
        uint64_t publishes; /* while the entry lives: so a wait can tell it missed a publication */
        char name[];
} RegName;

/* A pending deadline; embedded in attach waits and groups. */
typedef enum TimerType { TIMER_WAIT, TIMER_GROUP } TimerType;
typedef struct Timer {
        HeapNode node;
        TimerType type;
} Timer;

typedef struct RegGroup {
        HNode node;
        Timer timer;
        uint32_t members, joined;
        List joins; /* Wait.link */
        char name[];
} RegGroup;

/* An attach waiting for a name, or a member waiting for its group to fill. */
typedef struct Wait {
        Timer timer; /* attach waits only: groups keep one timer for all members */
        RegPeer *peer;
        uint64_t req_id, deadline;
        uint64_t name_publishes; /* attach waits: the name's publishes when the wait began */
        RegName *name;
        RegGroup *group;
        List peer_link, link;
} Wait;

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

typedef struct Sub {
        uint64_t id;
        RegPeer *peer;
        List peer_link, link;
        uint32_t prefix_len;
        char prefix[];
} Sub;

struct RegPeer {
        uint64_t id;
        PeerCreds creds;
        bool hello, lost;
        uint64_t decl_pid, decl_pidns;
        char label[PROTO_MAX_LABEL + 1];
        uint32_t n_gpus;
        char (*gpus)[PROTO_MAX_UUID + 1];
        List link;  /* Registry.peers, in id order */
        List owned; /* RegBuffer.owner_link */
        List holds; /* Hold.peer_link */
        List waits; /* Wait.peer_link */
        List subs;  /* Sub.peer_link */
        uint32_t n_refs, n_waits, n_subs;
        UidAcct *acct;
        uint64_t connected_ms;
        void *userdata;
        Registry *reg;
        List lost_link; /* in Registry.lost once marked lost */
};

struct RegBuffer {
        uint64_t id;
        HNode by_id;
        List link; /* Registry.buffers, in id order (ids only grow) */
        char *name;         /* heap: most names are short, and a registry holds 100k buffers */
        RegName *published; /* while live */
        uint64_t generation;
        ProtoKind kind;
        ProtoState state;
        uint64_t size, offset;
        char *device;       /* GPU UUID, NULL for memfd */
        uint8_t *meta;
        uint32_t meta_len;
        uint8_t *handle;    /* cuda-legacy only: PROTO_LEGACY_HANDLE_SIZE bytes */
        int fd;
        bool writable, broker_held, free_on_drain;
        uint32_t retire_after, attaches;
        RegPeer *owner; /* NULL once the producer is gone (broker-held buffers only) */
        uint64_t owner_id, owner_pidns;
        bool owner_pidns_declared;
        uint32_t owner_uid, owner_pid;
        UidAcct *acct;
        List owner_link;
        List holds; /* Hold.buf_link */
        uint64_t refs;
        uint32_t holders;
};

struct Registry {
        Limits limits;
        uint64_t epoch;
        uint64_t next_peer_id, next_buffer_id, next_sub_id, generation;
        HMap buffers_by_id, names, groups, holds, uids;
        List buffers, peers, subs;
        Heap timers;
        RegCounters counters;
        uint64_t n_peers, n_buffers, n_waits, n_subs, n_groups, n_refs, n_fds;
        uint64_t n_state[_PROTO_STATE_MAX]; /* buffers per state, kept current: stats never walk */
        uint64_t n_orphaned;
        List lost;                          /* RegPeer.lost_link: peers the caller must disconnect */
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

UidAcct *reg_acct_get(Registry *r, uint32_t uid);

void reg_acct_put(Registry *r, UidAcct *a);

void reg_reply_base(ProtoMsg *m, uint64_t id, unsigned status);

void reg_reply_ok(Outbox *o, RegPeer *p, uint64_t id);

/* Replies with an error status; the message says what happened in this case, the status name
 * (and its default text, on the client side) says how to fix it in general. */
_printf_(5, 6) void reg_reply_err(Outbox *o, RegPeer *p, uint64_t id, unsigned status, const char *fmt, ...);

void reg_event_base(ProtoMsg *m, ProtoEvent ev, const RegBuffer *b);

/* Tells every subscriber whose prefix matches the buffer's name. */
void reg_notify_subscribers(Registry *r, ProtoEvent ev, const RegBuffer *b, const char *reason, Outbox *o);

RegBuffer *reg_buffer_lookup(const Registry *r, uint64_t id);

RegName *reg_name_lookup(const Registry *r, const char *name);

/* A name entry lives while a buffer is published under it or someone waits for it. */
void reg_name_put(Registry *r, RegName *e);

/* Moves b to state, keeping the per-state counts. */
static inline void reg_buffer_set_state(Registry *r, RegBuffer *b, ProtoState state)
{
        r->n_state[b->state]--;
        r->n_state[state]++;
        b->state = state;
}

/* Drops a whole hold (all of one peer's references to one buffer, and its mapped mark). */
void reg_hold_drop(Registry *r, Hold *h);

/* Forgets a buffer and closes its fd (through the outbox). Peers that received the fd are told,
 * so they can drop cached mappings (which would otherwise keep the memory alive). */
void reg_buffer_destroy(Registry *r, RegBuffer *b, Outbox *o);

/* The last reference of a retired buffer went: tell the producer it may reuse or free the memory. */
void reg_buffer_drain(Registry *r, RegBuffer *b, Outbox *o);

/* The memory is gone (its producer died and the broker may not keep it): holders are told to stop
 * using it, their references vanish and no drained event follows. */
void reg_buffer_revoke(Registry *r, RegBuffer *b, const char *reason, Outbox *o);

void reg_wait_free(Registry *r, Wait *w);

void reg_join_free(Registry *r, Wait *w);

void reg_group_free(Registry *r, RegGroup *g);

/* Re-arms the group's timer at the earliest deadline among its members. */
int reg_group_rearm(Registry *r, RegGroup *g);

void reg_sub_free(Registry *r, Sub *s);
