/* The registry state machine: buffers, names, references, waits, subscriptions and groups.
 * See registry.h for the contract; docs/protocol.md for what each reply and event means. */
#include "registry.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heap.h"
#include "hmap.h"
#include "list.h"
#include "macro.h"

typedef struct UidAcct {
        HNode node;
        uint32_t uid;
        uint32_t connections, buffers, fds;
} UidAcct;

typedef struct RegName {
        HNode node;
        RegBuffer *live; /* the buffer published under this name, if any */
        List waits;      /* Wait.link, oldest first */
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
};

struct RegBuffer {
        uint64_t id;
        HNode by_id;
        List link; /* Registry.buffers, in id order (ids only grow) */
        char name[PROTO_MAX_NAME + 1];
        RegName *published; /* while live */
        uint64_t generation;
        ProtoKind kind;
        ProtoState state;
        uint64_t size, offset;
        char device[PROTO_MAX_UUID + 1];
        uint8_t *meta;
        uint32_t meta_len;
        uint8_t handle[PROTO_LEGACY_HANDLE_SIZE];
        int fd;
        bool writable, broker_held, free_on_drain;
        uint32_t retire_after, attaches;
        RegPeer *owner; /* NULL once the producer is gone (broker-held buffers only) */
        uint64_t owner_id, owner_pidns;
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
};

/* ---- small helpers ---- */

static uint64_t hash_str(const char *s)
{
        return hash_bytes(s, strlen(s));
}

static uint64_t hold_hash(uint64_t peer, uint64_t buffer)
{
        uint64_t k[2] = { peer, buffer };
        return hash_bytes(k, sizeof(k));
}

static void copy_str(char *dst, size_t cap, const char *src)
{
        size_t n = src ? strnlen(src, cap - 1) : 0;
        memcpy(dst, src ? src : "", n);
        dst[n] = 0;
}

static bool name_char_ok(char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               strchr("._:/@+=-", c) != NULL;
}

bool registry_prefix_valid(const char *s, size_t len)
{
        if (len > PROTO_MAX_NAME || (len > 0 && s[0] == '/'))
                return false;
        for (size_t i = 0; i < len; i++) {
                if (!s[i] || !name_char_ok(s[i]))
                        return false;
                if (s[i] == '.' && i + 1 < len && s[i + 1] == '.')
                        return false;
        }
        return true;
}

bool registry_name_valid(const char *s, size_t len)
{
        return len > 0 && registry_prefix_valid(s, len);
}

static UidAcct *acct_get(Registry *r, uint32_t uid)
{
        uint64_t h = hash_u64(uid);
        UidAcct *a;

        for (HNode *n = hmap_bucket(&r->uids, h); n; n = n->next) {
                a = container_of(n, UidAcct, node);
                if (n->hash == h && a->uid == uid)
                        return a;
        }
        a = calloc(1, sizeof(*a));
        if (!a)
                return NULL;
        a->uid = uid;
        if (hmap_insert(&r->uids, &a->node, h) < 0) {
                free(a);
                return NULL;
        }
        return a;
}

static void acct_put(Registry *r, UidAcct *a)
{
        if (a && !a->connections && !a->buffers && !a->fds) {
                hmap_remove(&r->uids, &a->node);
                free(a);
        }
}

/* ---- replies and events ---- */

static void reply_base(ProtoMsg *m, uint64_t id, unsigned status)
{
        memset(m, 0, sizeof(*m));
        m->reply = id;
        m->status = status;
        m->has = PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS);
}

static void reply_ok(Outbox *o, RegPeer *p, uint64_t id)
{
        ProtoMsg m;

        reply_base(&m, id, PROTO_STATUS_OK);
        outbox_send(o, p, &m, -1);
}

/* Replies with an error status; the message says what happened in this case, the status name
 * (and its default text, on the client side) says how to fix it in general. */
_printf_(5, 6) static void reply_err(Outbox *o, RegPeer *p, uint64_t id, unsigned status, const char *fmt, ...)
{
        char text[PROTO_MAX_TEXT + 1];
        ProtoMsg m;
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(text, sizeof(text), fmt, ap);
        va_end(ap);
        reply_base(&m, id, status);
        m.error = proto_str(proto_status_name(status));
        m.message = proto_str(text);
        m.has |= PROTO_BIT(PF_ERROR) | PROTO_BIT(PF_MESSAGE);
        outbox_send(o, p, &m, -1);
}

static void event_base(ProtoMsg *m, ProtoEvent ev, const RegBuffer *b)
{
        memset(m, 0, sizeof(*m));
        m->event = ev;
        m->buffer = b->id;
        m->generation = b->generation;
        m->name = proto_str(b->name);
        m->kind = b->kind;
        m->has = PROTO_BIT(PF_EVENT) | PROTO_BIT(PF_BUFFER) | PROTO_BIT(PF_GENERATION) |
                 PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND);
}

/* Tells every subscriber whose prefix matches the buffer's name. */
static void notify_subscribers(Registry *r, ProtoEvent ev, const RegBuffer *b, const char *reason, Outbox *o)
{
        list_for_each(pos, &r->subs) {
                Sub *s = list_entry(pos, Sub, link);
                ProtoMsg m;

                if (strncmp(b->name, s->prefix, s->prefix_len) != 0)
                        continue;
                event_base(&m, ev, b);
                m.sub = s->id;
                proto_set(&m, PF_SUB);
                if (reason) {
                        m.reason = proto_str(reason);
                        proto_set(&m, PF_REASON);
                }
                outbox_send(o, s->peer, &m, -1);
                r->counters.events++;
        }
}

/* ---- buffers ---- */

static RegBuffer *buffer_lookup(const Registry *r, uint64_t id)
{
        uint64_t h = hash_u64(id);

        for (HNode *n = hmap_bucket(&r->buffers_by_id, h); n; n = n->next) {
                RegBuffer *b = container_of(n, RegBuffer, by_id);
                if (n->hash == h && b->id == id)
                        return b;
        }
        return NULL;
}

static RegName *name_lookup(const Registry *r, const char *name)
{
        uint64_t h = hash_str(name);

        for (HNode *n = hmap_bucket(&r->names, h); n; n = n->next) {
                RegName *e = container_of(n, RegName, node);
                if (n->hash == h && strcmp(e->name, name) == 0)
                        return e;
        }
        return NULL;
}

static RegName *name_get(Registry *r, const char *name)
{
        RegName *e = name_lookup(r, name);
        size_t len = strlen(name);

        if (e)
                return e;
        e = calloc(1, sizeof(*e) + len + 1);
        if (!e)
                return NULL;
        memcpy(e->name, name, len + 1);
        list_init(&e->waits);
        if (hmap_insert(&r->names, &e->node, hash_str(name)) < 0) {
                free(e);
                return NULL;
        }
        return e;
}

/* A name entry lives while a buffer is published under it or someone waits for it. */
static void name_put(Registry *r, RegName *e)
{
        if (e && !e->live && list_empty(&e->waits)) {
                hmap_remove(&r->names, &e->node);
                free(e);
        }
}

static Hold *hold_lookup(const Registry *r, const RegPeer *p, const RegBuffer *b)
{
        uint64_t h = hold_hash(p->id, b->id);

        for (HNode *n = hmap_bucket(&r->holds, h); n; n = n->next) {
                Hold *x = container_of(n, Hold, node);
                if (n->hash == h && x->peer == p && x->buf == b)
                        return x;
        }
        return NULL;
}

/* Drops a whole hold (all of one peer's references to one buffer, and its mapped mark). */
static void hold_drop(Registry *r, Hold *h)
{
        h->buf->refs -= h->count;
        h->buf->holders -= h->count > 0;
        h->peer->n_refs -= h->count;
        r->n_refs -= h->count;
        list_unlink(&h->buf_link);
        list_unlink(&h->peer_link);
        hmap_remove(&r->holds, &h->node);
        free(h);
}

/* Takes b off its name. The name may already point at a newer buffer of the same producer. */
static void buffer_unpublish(Registry *r, RegBuffer *b)
{
        RegName *e = b->published;

        if (!e)
                return;
        b->published = NULL;
        if (e->live == b)
                e->live = NULL;
        name_put(r, e);
}

/* Forgets a buffer and closes its fd (through the outbox). Peers that received the fd are told,
 * so they can drop cached mappings (which would otherwise keep the memory alive). */
static void buffer_destroy(Registry *r, RegBuffer *b, Outbox *o)
{
        while (!list_empty(&b->holds)) {
                Hold *h = list_entry(b->holds.next, Hold, buf_link);

                if (h->mapped && !h->peer->lost) {
                        ProtoMsg m;

                        event_base(&m, PROTO_EV_FREED, b);
                        outbox_send(o, h->peer, &m, -1);
                        r->counters.events++;
                }
                hold_drop(r, h);
        }
        buffer_unpublish(r, b);
        list_unlink(&b->owner_link);
        list_unlink(&b->link);
        hmap_remove(&r->buffers_by_id, &b->by_id);
        if (b->fd >= 0) {
                b->acct->fds--;
                r->n_fds--;
                outbox_close_fd(o, b->fd);
        }
        b->acct->buffers--;
        acct_put(r, b->acct);
        r->n_buffers--;
        r->counters.frees++;
        free(b->meta);
        free(b);
}

/* The last reference of a retired buffer went: tell the producer it may reuse or free the memory. */
static void buffer_drain(Registry *r, RegBuffer *b, Outbox *o)
{
        ProtoMsg m;

        b->state = PROTO_STATE_IDLE;
        r->counters.drains++;
        if (b->owner) {
                event_base(&m, PROTO_EV_DRAINED, b);
                outbox_send(o, b->owner, &m, -1);
                r->counters.events++;
        }
        notify_subscribers(r, PROTO_EV_DRAINED, b, NULL, o);
        if (!b->owner || b->free_on_drain)
                buffer_destroy(r, b, o);
}

static void buffer_retire(Registry *r, RegBuffer *b, Outbox *o)
{
        if (b->state != PROTO_STATE_LIVE)
                return;
        b->state = PROTO_STATE_RETIRED;
        buffer_unpublish(r, b);
        r->counters.retires++;
        notify_subscribers(r, PROTO_EV_RETIRED, b, NULL, o);
        if (b->refs == 0)
                buffer_drain(r, b, o);
}

/* The memory is gone (its producer died and the broker may not keep it): holders are told to stop
 * using it, their references vanish and no drained event follows. */
static void buffer_revoke(Registry *r, RegBuffer *b, const char *reason, Outbox *o)
{
        list_for_each(pos, &b->holds) {
                Hold *h = list_entry(pos, Hold, buf_link);
                ProtoMsg m;

                if (h->count == 0)
                        continue; /* only a cached mapping: the freed event that follows covers it */
                event_base(&m, PROTO_EV_REVOKED, b);
                m.reason = proto_str(reason);
                proto_set(&m, PF_REASON);
                outbox_send(o, h->peer, &m, -1);
                r->counters.events++;
        }
        r->counters.revokes++;
        notify_subscribers(r, PROTO_EV_REVOKED, b, reason, o);
        buffer_destroy(r, b, o);
}

void registry_buffer_describe(const RegBuffer *b, ProtoMsg *m)
{
        memset(m, 0, sizeof(*m));
        m->buffer = b->id;
        m->name = proto_str(b->name);
        m->generation = b->generation;
        m->kind = b->kind;
        m->state = b->state;
        m->size = b->size;
        m->offset = b->offset;
        m->writable = b->writable;
        m->broker_held = b->broker_held;
        m->refs = b->refs;
        m->holders = b->holders;
        m->owner = b->owner ? b->owner->id : 0;
        m->uid = b->owner_uid;
        m->pid = b->owner_pid;
        m->has = PROTO_BIT(PF_BUFFER) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_GENERATION) | PROTO_BIT(PF_KIND) |
                 PROTO_BIT(PF_STATE) | PROTO_BIT(PF_SIZE) | PROTO_BIT(PF_OFFSET) | PROTO_BIT(PF_WRITABLE) |
                 PROTO_BIT(PF_BROKER_HELD) | PROTO_BIT(PF_REFS) | PROTO_BIT(PF_HOLDERS) |
                 PROTO_BIT(PF_OWNER) | PROTO_BIT(PF_UID) | PROTO_BIT(PF_PID);
        if (b->device[0]) {
                m->device = proto_str(b->device);
                proto_set(m, PF_DEVICE);
        }
        if (b->meta_len) {
                m->meta = (ProtoRaw){ b->meta, b->meta_len, 0 };
                proto_set(m, PF_META);
        }
        if (b->kind == PROTO_KIND_CUDA_LEGACY) {
                m->handle = (ProtoStr){ (const char *)b->handle, PROTO_LEGACY_HANDLE_SIZE };
                proto_set(m, PF_HANDLE);
        }
}

/* ---- attach ---- */

static bool peer_sees_device(const RegPeer *p, const char *uuid)
{
        for (uint32_t i = 0; i < p->n_gpus; i++)
                if (strcmp(p->gpus[i], uuid) == 0)
                        return true;
        return false;
}

/* The PID namespace a peer lives in: what the broker read from /proc beats what the peer said. */
static uint64_t peer_pidns(const RegPeer *p)
{
        return p->creds.pidns ? p->creds.pidns : p->decl_pidns;
}

/* Explains, before CUDA would fail obscurely, why this consumer cannot use this buffer.
 * Returns a status and fills text, or 0. */
static unsigned attach_diagnose(const RegBuffer *b, const RegPeer *p, char *text, size_t cap)
{
        if (b->kind == PROTO_KIND_CUDA_LEGACY) {
                uint64_t mine = peer_pidns(p);
                bool differ = mine && b->owner_pidns && mine != b->owner_pidns;

                /* The kernel's own view: a pid of 0 means "outside the broker's namespace", so one
                 * visible peer and one invisible one cannot share a namespace. */
                if (!differ && !p->creds.pid != !b->owner_pid)
                        differ = true;
                if (differ) {
                        snprintf(text, cap,
                                 "buffer '%s' is cuda-legacy: its producer (pid %u, uid %u) is in PID namespace "
                                 "%llu and this consumer is in %llu; legacy CUDA IPC needs both in one PID "
                                 "namespace (CUDA would fail with 'invalid device context'). Fix: set "
                                 "shareProcessNamespace: true on the pod, or publish as cuda-vmm",
                                 b->name, b->owner_pid, b->owner_uid, (unsigned long long)b->owner_pidns,
                                 (unsigned long long)mine);
                        return PROTO_STATUS_PIDNS;
                }
        }
        if (b->kind != PROTO_KIND_MEMFD && b->device[0] && !peer_sees_device(p, b->device)) {
                size_t n = (size_t)snprintf(text, cap,
                                            "buffer '%s' lives on GPU %s, which this consumer cannot see "
                                            "(it sees: ", b->name, b->device);
                for (uint32_t i = 0; i < p->n_gpus && n < cap; i++)
                        n += (size_t)snprintf(text + n, cap - n, "%s%s", i ? ", " : "", p->gpus[i]);
                if (n < cap)
                        snprintf(text + n, cap - n, "%s). Fix: give producer and consumer the same "
                                 "ResourceClaim, or the same visible devices",
                                 p->n_gpus ? "" : "no GPU");
                return PROTO_STATUS_DEVICE;
        }
        return 0;
}

static void reply_attached(Outbox *o, RegPeer *p, uint64_t id, const RegBuffer *b, bool cached)
{
        ProtoMsg m;

        registry_buffer_describe(b, &m);
        m.reply = id;
        m.status = PROTO_STATUS_OK;
        m.cached = cached;
        m.has |= PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS) | PROTO_BIT(PF_CACHED);
        outbox_send(o, p, &m, cached ? -1 : b->fd);
}

/* Takes a reference for p on a live buffer and replies. */
static void attach_now(Registry *r, RegPeer *p, uint64_t id, RegBuffer *b, Outbox *o)
{
        char text[PROTO_MAX_TEXT + 1];
        unsigned status;
        bool cached;
        Hold *h;

        status = attach_diagnose(b, p, text, sizeof(text));
        if (status) {
                reply_err(o, p, id, status, "%s", text);
                return;
        }
        if (p->n_refs >= r->limits.refs_per_peer) {
                reply_err(o, p, id, PROTO_STATUS_QUOTA, "this connection holds %u references (the limit); "
                          "release some first", p->n_refs);
                return;
        }
        h = hold_lookup(r, p, b);
        if (!h) {
                h = calloc(1, sizeof(*h));
                if (!h || hmap_insert(&r->holds, &h->node, hold_hash(p->id, b->id)) < 0) {
                        free(h);
                        registry_peer_mark_lost(p);
                        return;
                }
                h->buf = b;
                h->peer = p;
                list_append(&b->holds, &h->buf_link);
                list_append(&p->holds, &h->peer_link);
        }
        if (h->count++ == 0)
                b->holders++;
        b->refs++;
        p->n_refs++;
        r->n_refs++;
        b->attaches++;
        r->counters.attaches++;
        /* The fd travels once per peer: afterwards the peer's cached mapping serves, until it says
         * unmap. A legacy handle has no fd and is always in the reply itself. */
        cached = h->mapped;
        if (cached)
                r->counters.attaches_cached++;
        else if (b->fd >= 0)
                h->mapped = true;
        reply_attached(o, p, id, b, cached);
        if (b->retire_after && b->attaches >= b->retire_after)
                buffer_retire(r, b, o);
}

static void wait_free(Registry *r, Wait *w)
{
        if (w->name) {
                list_unlink(&w->link);
                heap_remove(&r->timers, &w->timer.node);
                name_put(r, w->name);
        }
        list_unlink(&w->peer_link);
        w->peer->n_waits--;
        r->n_waits--;
        free(w);
}

/* Hands a newly published buffer to everyone waiting for its name, oldest first, for as long as
 * it stays published (retire_after may retire it half-way). */
static void wake_waiters(Registry *r, RegName *e, Outbox *o)
{
        RegBuffer *b = e->live;

        /* b stays valid throughout (each attach adds a reference), but e is freed if b gets
         * retired and nobody else waits, so test b before touching e. */
        while (b && b->published == e && !list_empty(&e->waits)) {
                Wait *w = list_entry(e->waits.next, Wait, link);
                RegPeer *p = w->peer;
                uint64_t id = w->req_id;

                /* Keep the name entry alive across wait_free: it still has a live buffer. */
                wait_free(r, w);
                attach_now(r, p, id, b, o);
        }
}

void registry_attach(Registry *r, RegPeer *p, uint64_t id, const char *name, uint64_t buffer,
                     uint32_t timeout_ms, uint64_t now_ms, Outbox *out)
{
        RegName *e;
        RegBuffer *b;
        Wait *w;

        if (!name) {
                b = buffer_lookup(r, buffer);
                if (!b) {
                        reply_err(out, p, id, PROTO_STATUS_NOT_FOUND, "no buffer with id %llu",
                                  (unsigned long long)buffer);
                        return;
                }
                if (b->state != PROTO_STATE_LIVE) {
                        reply_err(out, p, id, PROTO_STATUS_STATE, "buffer %llu ('%s') is %s, not live",
                                  (unsigned long long)buffer, b->name, proto_state_name(b->state));
                        return;
                }
                attach_now(r, p, id, b, out);
                return;
        }

        e = name_lookup(r, name);
        if (e && e->live) {
                attach_now(r, p, id, e->live, out);
                return;
        }
        if (timeout_ms == 0) {
                reply_err(out, p, id, PROTO_STATUS_NOT_FOUND, "nothing is published under '%s'", name);
                return;
        }
        if (p->n_waits >= r->limits.waits_per_peer) {
                reply_err(out, p, id, PROTO_STATUS_QUOTA, "this connection already waits %u times (the limit)",
                          p->n_waits);
                return;
        }
        e = name_get(r, name);
        w = calloc(1, sizeof(*w));
        if (!e || !w) {
                free(w);
                name_put(r, e);
                registry_peer_mark_lost(p);
                return;
        }
        timeout_ms = MIN(timeout_ms, r->limits.max_timeout_ms);
        *w = (Wait){ .timer = { HEAP_NODE_INIT, TIMER_WAIT }, .peer = p, .req_id = id,
                     .deadline = now_ms + timeout_ms, .name = e };
        if (heap_push(&r->timers, &w->timer.node, w->deadline) < 0) {
                free(w);
                name_put(r, e);
                registry_peer_mark_lost(p);
                return;
        }
        list_append(&e->waits, &w->link);
        list_append(&p->waits, &w->peer_link);
        p->n_waits++;
        r->n_waits++;
        r->counters.attach_waits++;
}

/* ---- publish ---- */

static bool may_manage(const RegBuffer *b, const RegPeer *p)
{
        return b->owner ? b->owner == p : b->owner_uid == p->creds.uid;
}

/* Puts b under its name and tells whoever waits or listens. */
static void publish_under_name(Registry *r, RegPeer *p, uint64_t id, RegBuffer *b, RegName *e, Outbox *o)
{
        RegBuffer *old = e->live;
        ProtoMsg m;

        e->live = b;
        b->published = e;
        if (old && old != b)
                buffer_retire(r, old, o); /* the same producer replaced its own buffer */
        b->state = PROTO_STATE_LIVE;
        b->generation = ++r->generation;
        b->attaches = 0;

        reply_base(&m, id, PROTO_STATUS_OK);
        m.buffer = b->id;
        m.generation = b->generation;
        m.has |= PROTO_BIT(PF_BUFFER) | PROTO_BIT(PF_GENERATION);
        outbox_send(o, p, &m, -1);

        notify_subscribers(r, PROTO_EV_PUBLISHED, b, NULL, o);
        wake_waiters(r, e, o);
}

/* Checks the name is free for p. Returns 0, or replies with an error and returns its status. */
static unsigned publish_check_name(Registry *r, RegPeer *p, uint64_t id, const char *name, const RegBuffer *self,
                                   Outbox *o)
{
        RegName *e = name_lookup(r, name);

        const RegBuffer *live = e ? e->live : NULL;

        /* A producer may replace its own buffer, and a restarted producer (same uid) the one its
         * predecessor left broker-held: the old one is retired and drains as usual. */
        if (!live || live == self || live->owner == p || (!live->owner && live->owner_uid == p->creds.uid))
                return 0;
        if (!live->owner)
                reply_err(o, p, id, PROTO_STATUS_NAME_TAKEN,
                          "'%s' is held by the broker for uid %u (buffer %llu, its producer is gone); a peer of "
                          "that uid may publish over it, or retire it", name, live->owner_uid,
                          (unsigned long long)live->id);
        else
                reply_err(o, p, id, PROTO_STATUS_NAME_TAKEN,
                          "'%s' is published by another producer (peer %llu, pid %u, uid %u)", name,
                          (unsigned long long)live->owner_id, live->owner_pid, live->owner_uid);
        return PROTO_STATUS_NAME_TAKEN;
}

static int buffer_set_meta(RegBuffer *b, const uint8_t *meta, uint32_t len)
{
        uint8_t *copy = NULL;

        if (meta && len) {
                copy = malloc(len);
                if (!copy)
                        return -ENOMEM;
                memcpy(copy, meta, len);
        }
        free(b->meta);
        b->meta = copy;
        b->meta_len = copy ? len : 0;
        return 0;
}

static void republish(Registry *r, RegPeer *p, uint64_t id, RegPublish *a, Outbox *out)
{
        RegBuffer *b = buffer_lookup(r, a->buffer);
        RegName *e;

        if (!b) {
                reply_err(out, p, id, PROTO_STATUS_NOT_FOUND, "no buffer with id %llu", (unsigned long long)a->buffer);
                return;
        }
        if (b->owner != p) {
                reply_err(out, p, id, PROTO_STATUS_NOT_OWNER, "buffer %llu belongs to another peer",
                          (unsigned long long)a->buffer);
                return;
        }
        if (b->state != PROTO_STATE_IDLE) {
                reply_err(out, p, id, PROTO_STATUS_STATE,
                          "buffer %llu is %s; retire it and wait for its drained event before publishing it again",
                          (unsigned long long)a->buffer, proto_state_name(b->state));
                return;
        }
        if (publish_check_name(r, p, id, a->name, b, out))
                return;
        e = name_get(r, a->name);
        if (!e || (a->has_meta && buffer_set_meta(b, a->meta, a->meta_len) < 0)) {
                name_put(r, e);
                registry_peer_mark_lost(p);
                return;
        }
        copy_str(b->name, sizeof(b->name), a->name);
        b->retire_after = a->retire_after;
        b->free_on_drain = false;
        r->counters.republishes++;
        publish_under_name(r, p, id, b, e, out);
}

void registry_publish(Registry *r, RegPeer *p, uint64_t id, RegPublish *a, uint64_t now_ms, Outbox *out)
{
        _cleanup_close_ int fd = steal_fd(a->fd);
        RegBuffer *b;
        RegName *e;

        (void)now_ms;
        if (a->buffer) {
                republish(r, p, id, a, out);
                return;
        }
        if (publish_check_name(r, p, id, a->name, NULL, out))
                return;
        if (p->acct->buffers >= r->limits.buffers_per_uid) {
                reply_err(out, p, id, PROTO_STATUS_QUOTA, "uid %u owns %u buffers (the limit); free some first",
                          p->creds.uid, p->acct->buffers);
                return;
        }
        if (fd >= 0 && p->acct->fds >= r->limits.fds_per_uid) {
                reply_err(out, p, id, PROTO_STATUS_QUOTA, "the broker holds %u fds for uid %u (the limit)",
                          p->acct->fds, p->creds.uid);
                return;
        }

        b = calloc(1, sizeof(*b));
        e = name_get(r, a->name);
        if (!b || !e || buffer_set_meta(b, a->meta, a->meta_len) < 0) {
                free(b);
                name_put(r, e);
                registry_peer_mark_lost(p);
                return;
        }
        b->id = ++r->next_buffer_id;
        if (hmap_insert(&r->buffers_by_id, &b->by_id, hash_u64(b->id)) < 0) {
                free(b->meta);
                free(b);
                name_put(r, e);
                registry_peer_mark_lost(p);
                return;
        }
        copy_str(b->name, sizeof(b->name), a->name);
        copy_str(b->device, sizeof(b->device), a->device);
        b->kind = a->kind;
        b->size = a->size;
        b->offset = a->offset;
        if (a->handle)
                memcpy(b->handle, a->handle, PROTO_LEGACY_HANDLE_SIZE);
        b->fd = steal_fd(fd);
        b->writable = a->writable;
        b->broker_held = a->broker_held;
        b->retire_after = a->retire_after;
        b->owner = p;
        b->owner_id = p->id;
        b->owner_uid = p->creds.uid;
        b->owner_pid = p->creds.pid;
        b->owner_pidns = peer_pidns(p);
        b->acct = p->acct;
        list_init(&b->holds);
        list_append(&r->buffers, &b->link);
        list_append(&p->owned, &b->owner_link);
        b->acct->buffers++;
        if (b->fd >= 0) {
                b->acct->fds++;
                r->n_fds++;
        }
        r->n_buffers++;
        r->counters.publishes++;
        publish_under_name(r, p, id, b, e, out);
}

/* ---- release, retire, free ---- */

void registry_release(Registry *r, RegPeer *p, uint64_t id, uint64_t buffer, Outbox *out)
{
        RegBuffer *b = buffer_lookup(r, buffer);
        Hold *h = b ? hold_lookup(r, p, b) : NULL;

        if (!h || h->count == 0) {
                reply_err(out, p, id, PROTO_STATUS_NOT_ATTACHED, "this connection holds no reference to buffer %llu",
                          (unsigned long long)buffer);
                return;
        }
        h->count--;
        b->refs--;
        p->n_refs--;
        r->n_refs--;
        if (h->count == 0) {
                b->holders--;
                if (!h->mapped)
                        hold_drop(r, h);
        }
        r->counters.releases++;
        reply_ok(out, p, id);
        if (b->state == PROTO_STATE_RETIRED && b->refs == 0)
                buffer_drain(r, b, out);
}

void registry_unmap(Registry *r, RegPeer *p, uint64_t id, uint64_t buffer, Outbox *out)
{
        RegBuffer *b = buffer_lookup(r, buffer);
        Hold *h = b ? hold_lookup(r, p, b) : NULL;

        /* Unknown or never mapped: nothing to forget, and nothing wrong either (the buffer may
         * have been freed while the request travelled). */
        if (h) {
                h->mapped = false;
                if (h->count == 0)
                        hold_drop(r, h);
        }
        reply_ok(out, p, id);
}

static RegBuffer *managed_buffer(Registry *r, RegPeer *p, uint64_t id, uint64_t buffer, bool as_admin,
                                 Outbox *out)
{
        RegBuffer *b = buffer_lookup(r, buffer);

        if (!b) {
                reply_err(out, p, id, PROTO_STATUS_NOT_FOUND, "no buffer with id %llu", (unsigned long long)buffer);
                return NULL;
        }
        if (!as_admin && !may_manage(b, p)) {
                reply_err(out, p, id, PROTO_STATUS_NOT_OWNER,
                          "buffer %llu ('%s') belongs to peer %llu (uid %u)", (unsigned long long)buffer, b->name,
                          (unsigned long long)b->owner_id, b->owner_uid);
                return NULL;
        }
        return b;
}

void registry_retire(Registry *r, RegPeer *p, uint64_t id, uint64_t buffer, bool as_admin, Outbox *out)
{
        RegBuffer *b = managed_buffer(r, p, id, buffer, as_admin, out);

        if (!b)
                return;
        reply_ok(out, p, id); /* retiring twice is harmless: the drained event comes once */
        buffer_retire(r, b, out);
}

void registry_free_buffer(Registry *r, RegPeer *p, uint64_t id, uint64_t buffer, bool as_admin, Outbox *out)
{
        RegBuffer *b = managed_buffer(r, p, id, buffer, as_admin, out);

        if (!b)
                return;
        reply_ok(out, p, id);
        if (b->state == PROTO_STATE_IDLE) {
                buffer_destroy(r, b, out);
                return;
        }
        /* Still referenced: forget it once drained; the producer still gets its drained event. */
        b->free_on_drain = true;
        buffer_retire(r, b, out);
}

/* ---- subscriptions ---- */

void registry_subscribe(Registry *r, RegPeer *p, uint64_t id, const char *prefix, Outbox *out)
{
        size_t len = strlen(prefix);
        ProtoMsg m;
        Sub *s;

        if (p->n_subs >= r->limits.subs_per_peer) {
                reply_err(out, p, id, PROTO_STATUS_QUOTA, "this connection has %u subscriptions (the limit)",
                          p->n_subs);
                return;
        }
        s = calloc(1, sizeof(*s) + len + 1);
        if (!s) {
                registry_peer_mark_lost(p);
                return;
        }
        s->id = ++r->next_sub_id;
        s->peer = p;
        s->prefix_len = (uint32_t)len;
        memcpy(s->prefix, prefix, len + 1);
        list_append(&r->subs, &s->link);
        list_append(&p->subs, &s->peer_link);
        p->n_subs++;
        r->n_subs++;

        reply_base(&m, id, PROTO_STATUS_OK);
        m.sub = s->id;
        proto_set(&m, PF_SUB);
        outbox_send(out, p, &m, -1);
}

static void sub_free(Registry *r, Sub *s)
{
        list_unlink(&s->link);
        list_unlink(&s->peer_link);
        s->peer->n_subs--;
        r->n_subs--;
        free(s);
}

void registry_unsubscribe(Registry *r, RegPeer *p, uint64_t id, uint64_t sub, Outbox *out)
{
        list_for_each(pos, &p->subs) {
                Sub *s = list_entry(pos, Sub, peer_link);
                if (s->id == sub) {
                        sub_free(r, s);
                        reply_ok(out, p, id);
                        return;
                }
        }
        reply_err(out, p, id, PROTO_STATUS_NOT_FOUND, "this connection has no subscription %llu",
                  (unsigned long long)sub);
}

/* ---- rendezvous groups ---- */

static RegGroup *group_lookup(const Registry *r, const char *name)
{
        uint64_t h = hash_str(name);

        for (HNode *n = hmap_bucket(&r->groups, h); n; n = n->next) {
                RegGroup *g = container_of(n, RegGroup, node);
                if (n->hash == h && strcmp(g->name, name) == 0)
                        return g;
        }
        return NULL;
}

static void group_free(Registry *r, RegGroup *g)
{
        heap_remove(&r->timers, &g->timer.node);
        hmap_remove(&r->groups, &g->node);
        r->n_groups--;
        free(g);
}

static void join_free(Registry *r, Wait *w)
{
        list_unlink(&w->link);
        w->group->joined--;
        wait_free(r, w);
}

/* Re-arms the group's timer at the earliest deadline among its members. */
static int group_rearm(Registry *r, RegGroup *g)
{
        uint64_t earliest = UINT64_MAX;

        list_for_each(pos, &g->joins)
                earliest = MIN(earliest, list_entry(pos, Wait, link)->deadline);
        heap_remove(&r->timers, &g->timer.node);
        if (earliest == UINT64_MAX)
                return 0;
        return heap_push(&r->timers, &g->timer.node, earliest);
}

/* Answers every member at once (all-or-nothing) and dissolves the group. */
static void group_finish(Registry *r, RegGroup *g, bool complete, Outbox *o)
{
        uint32_t joined = g->joined;

        while (!list_empty(&g->joins)) {
                Wait *w = list_entry(g->joins.next, Wait, link);
                RegPeer *p = w->peer;
                uint64_t id = w->req_id;
                ProtoMsg m;

                join_free(r, w);
                if (!complete) {
                        reply_err(o, p, id, PROTO_STATUS_TIMEOUT,
                                  "group '%s': %u of %u members joined before the earliest member's deadline",
                                  g->name, joined, g->members);
                        continue;
                }
                reply_base(&m, id, PROTO_STATUS_OK);
                m.group = proto_str(g->name);
                m.members = g->members;
                m.has |= PROTO_BIT(PF_GROUP) | PROTO_BIT(PF_MEMBERS);
                outbox_send(o, p, &m, -1);
        }
        if (complete)
                r->counters.groups_completed++;
        else
                r->counters.groups_failed++;
        group_free(r, g);
}

void registry_group_join(Registry *r, RegPeer *p, uint64_t id, const char *group, uint32_t members,
                         uint32_t timeout_ms, uint64_t now_ms, Outbox *out)
{
        RegGroup *g = group_lookup(r, group);
        size_t len = strlen(group);
        Wait *w;

        if (members == 0) {
                reply_err(out, p, id, PROTO_STATUS_INVALID, "a group needs at least one member");
                return;
        }
        if (g && g->members != members) {
                reply_err(out, p, id, PROTO_STATUS_GROUP_MISMATCH,
                          "group '%s' was started with %u members; this join says %u", group, g->members, members);
                return;
        }
        if (g) {
                list_for_each(pos, &g->joins) {
                        if (list_entry(pos, Wait, link)->peer == p) {
                                reply_err(out, p, id, PROTO_STATUS_STATE, "this connection already joined group '%s'",
                                          group);
                                return;
                        }
                }
        }
        if (p->n_waits >= r->limits.waits_per_peer) {
                reply_err(out, p, id, PROTO_STATUS_QUOTA, "this connection already waits %u times (the limit)",
                          p->n_waits);
                return;
        }
        if (!g) {
                g = calloc(1, sizeof(*g) + len + 1);
                if (!g || hmap_insert(&r->groups, &g->node, hash_str(group)) < 0) {
                        free(g);
                        registry_peer_mark_lost(p);
                        return;
                }
                memcpy(g->name, group, len + 1);
                g->members = members;
                g->timer = (Timer){ HEAP_NODE_INIT, TIMER_GROUP };
                list_init(&g->joins);
                r->n_groups++;
        }
        w = calloc(1, sizeof(*w));
        if (!w) {
                if (list_empty(&g->joins))
                        group_free(r, g);
                registry_peer_mark_lost(p);
                return;
        }
        timeout_ms = MIN(timeout_ms, r->limits.max_timeout_ms);
        *w = (Wait){ .timer = { HEAP_NODE_INIT, TIMER_WAIT }, .peer = p, .req_id = id,
                     .deadline = now_ms + timeout_ms, .group = g };
        list_append(&g->joins, &w->link);
        list_append(&p->waits, &w->peer_link);
        g->joined++;
        p->n_waits++;
        r->n_waits++;
        if (g->joined == g->members) {
                group_finish(r, g, true, out);
                return;
        }
        if (group_rearm(r, g) < 0)
                registry_peer_mark_lost(p);
}

/* ---- time ---- */

void registry_expire(Registry *r, uint64_t now_ms, Outbox *out)
{
        HeapNode *top;

        while ((top = heap_top(&r->timers)) && top->key <= now_ms) {
                Timer *t = container_of(top, Timer, node);

                if (t->type == TIMER_GROUP) {
                        group_finish(r, container_of(t, RegGroup, timer), false, out);
                } else {
                        Wait *w = container_of(t, Wait, timer);
                        RegPeer *p = w->peer;
                        uint64_t id = w->req_id;
                        char name[PROTO_MAX_NAME + 1];

                        copy_str(name, sizeof(name), w->name->name);
                        wait_free(r, w);
                        r->counters.timeouts++;
                        reply_err(out, p, id, PROTO_STATUS_TIMEOUT,
                                  "nothing was published under '%s' before the timeout", name);
                }
        }
}

void registry_cancel_waits(Registry *r, unsigned status, const char *why, Outbox *out)
{
        RegPeer *p;

        for (p = registry_peer_first(r); p; p = registry_peer_next(r, p)) {
                while (!list_empty(&p->waits)) {
                        Wait *w = list_entry(p->waits.next, Wait, peer_link);
                        RegGroup *g = w->group;
                        uint64_t id = w->req_id;

                        if (g) {
                                join_free(r, w);
                                if (g->joined == 0)
                                        group_free(r, g);
                        } else {
                                wait_free(r, w);
                        }
                        reply_err(out, p, id, status, "%s", why);
                }
        }
}

uint64_t registry_next_deadline(const Registry *r)
{
        HeapNode *top = heap_top(&r->timers);
        return top ? top->key : UINT64_MAX;
}

/* ---- peers ---- */

int registry_peer_add(Registry *r, const PeerCreds *creds, uint64_t now_ms, void *userdata, RegPeer **ret,
                      char *why, size_t why_cap)
{
        UidAcct *acct;
        RegPeer *p;

        if (r->n_peers >= r->limits.connections) {
                snprintf(why, why_cap, "the broker has %u connections (the limit, --max-connections); close some",
                         r->limits.connections);
                return PROTO_STATUS_QUOTA;
        }
        acct = acct_get(r, creds->uid);
        if (!acct)
                return -ENOMEM;
        if (acct->connections >= r->limits.connections_per_uid) {
                snprintf(why, why_cap, "uid %u has %u connections (the limit, --max-connections-per-uid); close some",
                         creds->uid, acct->connections);
                acct_put(r, acct);
                return PROTO_STATUS_QUOTA;
        }
        p = calloc(1, sizeof(*p));
        if (!p) {
                acct_put(r, acct);
                return -ENOMEM;
        }
        p->id = ++r->next_peer_id;
        p->creds = *creds;
        p->acct = acct;
        p->connected_ms = now_ms;
        p->userdata = userdata;
        list_init(&p->owned);
        list_init(&p->holds);
        list_init(&p->waits);
        list_init(&p->subs);
        list_append(&r->peers, &p->link);
        acct->connections++;
        r->n_peers++;
        r->counters.peers_added++;
        *ret = p;
        return 0;
}

void registry_peer_remove(Registry *r, RegPeer *p, Outbox *out)
{
        char reason[160];

        if (!p)
                return;
        list_for_each_safe(pos, &p->waits) {
                Wait *w = list_entry(pos, Wait, peer_link);
                RegGroup *g = w->group;

                if (!g) {
                        wait_free(r, w);
                        continue;
                }
                join_free(r, w);
                if (g->joined == 0)
                        group_free(r, g);
                else
                        group_rearm(r, g);
        }
        while (!list_empty(&p->subs))
                sub_free(r, list_entry(p->subs.next, Sub, peer_link));

        /* Its references vanish; a retired buffer it was the last holder of drains now. */
        while (!list_empty(&p->holds)) {
                Hold *h = list_entry(p->holds.next, Hold, peer_link);
                RegBuffer *b = h->buf;

                hold_drop(r, h);
                if (b->state == PROTO_STATE_RETIRED && b->refs == 0 && b->owner != p)
                        buffer_drain(r, b, out);
        }

        snprintf(reason, sizeof(reason), "producer (peer %llu, pid %u, uid %u) disconnected",
                 (unsigned long long)p->id, p->creds.pid, p->creds.uid);
        while (!list_empty(&p->owned)) {
                RegBuffer *b = list_entry(p->owned.next, RegBuffer, owner_link);

                list_unlink(&b->owner_link);
                if (b->state == PROTO_STATE_IDLE || (b->state == PROTO_STATE_RETIRED && b->refs == 0)) {
                        buffer_destroy(r, b, out);
                } else if (b->broker_held) {
                        /* The broker keeps the memory (its fd) until the buffer is retired and drained. */
                        b->owner = NULL;
                        b->free_on_drain = true;
                } else {
                        buffer_revoke(r, b, reason, out);
                }
        }

        /* Frames queued for it earlier in this batch (say, another producer's revoke) must not
         * outlive it: the caller would look it up after it is gone. */
        outbox_drop_peer(out, p);
        list_unlink(&p->link);
        p->acct->connections--;
        acct_put(r, p->acct);
        r->n_peers--;
        r->counters.peers_removed++;
        free(p->gpus);
        free(p);
}

int registry_peer_hello(Registry *r, RegPeer *p, const PeerHello *h)
{
        if (p->hello)
                return PROTO_STATUS_STATE;
        if (h->n_gpus) {
                p->gpus = calloc(h->n_gpus, sizeof(*p->gpus));
                if (!p->gpus)
                        return -ENOMEM;
                for (uint32_t i = 0; i < h->n_gpus; i++)
                        copy_str(p->gpus[i], sizeof(p->gpus[i]), h->gpus[i]);
                p->n_gpus = h->n_gpus;
        }
        p->decl_pid = h->pid;
        p->decl_pidns = h->pidns;
        copy_str(p->label, sizeof(p->label), h->label);
        p->hello = true;
        (void)r;
        return 0;
}

bool registry_peer_said_hello(const RegPeer *p)
{
        return p->hello;
}

uint64_t registry_peer_id(const RegPeer *p)
{
        return p->id;
}

const PeerCreds *registry_peer_creds(const RegPeer *p)
{
        return &p->creds;
}

void *registry_peer_userdata(const RegPeer *p)
{
        return p->userdata;
}

void registry_peer_mark_lost(RegPeer *p)
{
        if (p)
                p->lost = true;
}

bool registry_peer_lost(const RegPeer *p)
{
        return p->lost;
}

void registry_peer_describe(const RegPeer *p, ProtoMsg *m)
{
        memset(m, 0, sizeof(*m));
        m->peer = p->id;
        m->pid = p->creds.pid;
        m->uid = p->creds.uid;
        m->gid = p->creds.gid;
        m->pidns = peer_pidns(p);
        m->label = proto_str(p->label);
        m->refs = p->n_refs;
        m->subs = p->n_subs;
        m->waits = p->n_waits;
        m->started_ms = p->connected_ms;
        m->n_gpus = p->n_gpus;
        for (uint32_t i = 0; i < p->n_gpus && i < PROTO_MAX_GPUS; i++)
                m->gpus[i] = proto_str(p->gpus[i]);
        m->buffers = 0;
        list_for_each(pos, &p->owned)
                m->buffers++;
        m->has = PROTO_BIT(PF_PEER) | PROTO_BIT(PF_PID) | PROTO_BIT(PF_UID) | PROTO_BIT(PF_GID) |
                 PROTO_BIT(PF_PIDNS) | PROTO_BIT(PF_LABEL) | PROTO_BIT(PF_REFS) | PROTO_BIT(PF_SUBS) |
                 PROTO_BIT(PF_WAITS) | PROTO_BIT(PF_STARTED_MS) | PROTO_BIT(PF_GPUS) | PROTO_BIT(PF_BUFFERS);
}

/* ---- views ---- */

RegBuffer *registry_buffer_after(const Registry *r, uint64_t after)
{
        RegBuffer *b = buffer_lookup(r, after);

        if (b)
                return registry_buffer_next(r, b);
        list_for_each(pos, &r->buffers) {
                b = list_entry(pos, RegBuffer, link);
                if (b->id > after)
                        return b;
        }
        return NULL;
}

RegBuffer *registry_buffer_next(const Registry *r, const RegBuffer *b)
{
        return b->link.next == &r->buffers ? NULL : list_entry(b->link.next, RegBuffer, link);
}

RegBuffer *registry_buffer_by_id(const Registry *r, uint64_t id)
{
        return buffer_lookup(r, id);
}

RegBuffer *registry_buffer_by_name(const Registry *r, const char *name)
{
        RegName *e = name_lookup(r, name);
        return e ? e->live : NULL;
}

const char *registry_buffer_name(const RegBuffer *b)
{
        return b->name;
}

void registry_buffer_holders(const RegBuffer *b, void (*fn)(const RegPeer *p, uint32_t refs, void *ud), void *ud)
{
        list_for_each(pos, &b->holds) {
                const Hold *h = list_entry(pos, Hold, buf_link);
                if (h->count)
                        fn(h->peer, h->count, ud);
        }
}

RegPeer *registry_peer_first(const Registry *r)
{
        return list_empty(&r->peers) ? NULL : list_entry(r->peers.next, RegPeer, link);
}

RegPeer *registry_peer_next(const Registry *r, const RegPeer *p)
{
        return p->link.next == &r->peers ? NULL : list_entry(p->link.next, RegPeer, link);
}

void registry_gauges(const Registry *r, RegGauges *g)
{
        memset(g, 0, sizeof(*g));
        g->peers = r->n_peers;
        g->buffers = r->n_buffers;
        g->refs = r->n_refs;
        g->fds = r->n_fds;
        g->waits = r->n_waits;
        g->subs = r->n_subs;
        g->groups = r->n_groups;
        g->names = r->names.count;
        list_for_each(pos, &r->buffers) {
                const RegBuffer *b = list_entry(pos, RegBuffer, link);
                g->live += b->state == PROTO_STATE_LIVE;
                g->retired += b->state == PROTO_STATE_RETIRED;
                g->idle += b->state == PROTO_STATE_IDLE;
                g->orphaned += b->owner == NULL;
        }
}

uint64_t registry_epoch(const Registry *r)
{
        return r->epoch;
}

const RegCounters *registry_counters(const Registry *r)
{
        return &r->counters;
}

/* ---- life cycle ---- */

int registry_new(Registry **ret, const Limits *limits, uint64_t epoch)
{
        Registry *r = calloc(1, sizeof(*r));

        if (!r)
                return -ENOMEM;
        r->limits = *limits;
        r->epoch = epoch;
        list_init(&r->buffers);
        list_init(&r->peers);
        list_init(&r->subs);
        *ret = r;
        return 0;
}

Registry *registry_free(Registry *r)
{
        Outbox out = OUTBOX_INIT;

        if (!r)
                return NULL;
        /* Peers first: that cancels waits and groups and releases references. Broker-held buffers
         * survive their owners, so they are destroyed explicitly afterwards. */
        while (!list_empty(&r->peers))
                registry_peer_remove(r, list_entry(r->peers.next, RegPeer, link), &out);
        while (!list_empty(&r->buffers))
                buffer_destroy(r, list_entry(r->buffers.next, RegBuffer, link), &out);
        outbox_clear(&out);
        free(out.frames);
        free(out.close_fds);
        hmap_deinit(&r->buffers_by_id);
        hmap_deinit(&r->names);
        hmap_deinit(&r->groups);
        hmap_deinit(&r->holds);
        hmap_deinit(&r->uids);
        heap_deinit(&r->timers);
        free(r);
        return NULL;
}
