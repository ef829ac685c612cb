/* The registry state machine: buffers, names and references, and the operations on them.
 * See registry.h for the contract; docs/protocol.md for what each reply and event means.
 *
 * What it must never do: any I/O (no socket, no clock: the time comes in as an argument, no file),
 * or close an fd itself: an fd it lets go goes to the outbox's close list and is closed after the
 * frames of the same operation, which may still carry it, are sent. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "registry-claims.h"
#include "registry-core.h"
#include "registry-rings-core.h"
#include "registry-subs.h"
#include "registry-waits.h"

UidAcct *reg_acct_get(Registry *r, uint32_t uid)
{
        uint64_t h = hash_u64(uid);
        UidAcct *a = HMAP_FIND(&r->uids, h, UidAcct, node, x, x->uid == uid);

        if (a)
                return a;
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

/* A uid's account lives only while the uid has a connection, a buffer or an fd, so that peers
 * coming and going under ever new uids cannot grow the table. */
void reg_acct_put(Registry *r, UidAcct *a)
{
        if (a && !a->connections && !a->buffers && !a->fds && !a->claims) {
                hmap_remove(&r->uids, &a->node);
                free(a);
        }
}

int reg_charge(Registry *r, uint32_t uid, uint64_t n, RegWhy *why)
{
        BudgetRefusal f;
        int e = budget_charge(r->budget, uid, BUDGET_HELD, n, &f);

        if (e <= 0)
                return e;
        if (why)
                *why = (RegWhy){ REG_E_MEMORY_BUDGET, .n = { uid, f.which == BUDGET_E_ALL, f.used, f.limit, n } };
        return PROTO_STATUS_QUOTA;
}

void reg_uncharge(Registry *r, uint32_t uid, uint64_t n)
{
        budget_uncharge(r->budget, uid, BUDGET_HELD, n);
}

void reg_charge_failed(RegSink *o, RegPeer *p, uint64_t id, int e, RegWhy why)
{
        if (e < 0)
                registry_peer_mark_lost(p);
        else
                reg_answer(o, p, id, PROTO_STATUS_QUOTA, why);
}

void reg_emit(RegSink *o, const RegChange *c)
{
        o->emit(o->ctx, c);
}

void reg_answer(RegSink *o, RegPeer *p, uint64_t id, unsigned status, RegWhy why)
{
        RegChange c = { .type = REG_CH_REPLY, .to = p, .req = id, .status = status, .why = why };

        reg_emit(o, &c);
}

void reg_close_fd(RegSink *o, int fd)
{
        reg_emit(o, &(RegChange){ .type = REG_CH_CLOSE_FD, .fd = fd });
}

void reg_tell(RegSink *o, RegPeer *p, ProtoEvent ev, const RegBuffer *b, uint64_t sub, RegWhy why)
{
        RegChange c = { .type = REG_CH_EVENT, .to = p, .event = ev, .sub = sub, .why = why,
                        .key = { b->id, b->generation, b->name, b->info.kind } };

        reg_emit(o, &c);
}

RegBuffer *reg_buffer_lookup(const Registry *r, uint64_t id)
{
        return HMAP_FIND(&r->buffers_by_id, hash_u64(id), RegBuffer, by_id, b, b->id == id);
}

RegBuffer *registry_request_buffer(Registry *r, RegPeer *p, uint64_t id, uint64_t buffer, RegSink *out)
{
        RegBuffer *b = reg_buffer_lookup(r, buffer);

        if (!b)
                reg_answer(out, p, id, PROTO_STATUS_NOT_FOUND, (RegWhy){ REG_E_NO_BUFFER, .n = { buffer } });
        return b;
}

RegName *reg_name_lookup(const Registry *r, const char *name)
{
        return HMAP_FIND(&r->names, hash_str(name), RegName, node, e, strcmp(e->name, name) == 0);
}


/* Whether b's memory counts as broker-held: it carries the memory's fd (a buffer or a segment, not a
 * view, whose memory is its segment's) and outlives its producer. Both are fixed at registration. */
static bool held_memory(const RegBuffer *b)
{
        return b->fd >= 0 && b->info.broker_held;
}

static RegName *name_get(Registry *r, const char *name)
{
        RegName *e = reg_name_lookup(r, name);
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

/* A name lives while a buffer is live under it or someone waits for it: asking for names nobody
 * publishes costs nothing once those waits are over. */
void reg_name_put(Registry *r, RegName *e)
{
        if (e && !e->live && list_empty(&e->waits)) {
                hmap_remove(&r->names, &e->node);
                free(e);
        }
}

static Hold *hold_lookup(const Registry *r, const RegPeer *p, const RegBuffer *b)
{
        return HMAP_FIND(&r->holds, hold_hash(p->id, b->id), Hold, node, h, h->peer == p && h->buf == b);
}

static bool hold_mapped(const Registry *r, const RegPeer *p, const RegBuffer *b)
{
        const Hold *h = hold_lookup(r, p, b);
        return h && h->mapped;
}

int reg_hold_add(Registry *r, RegPeer *p, RegBuffer *b, uint32_t refs, bool mapped, RegWhy *why)
{
        Hold *h;
        int e;

        /* A view's holder maps its segment: the mark (and the freed event) belong to the segment,
         * the references to the view. */
        if (b->segment && mapped) {
                e = reg_hold_add(r, p, b->segment, 0, true, why);
                if (e != 0)
                        return e;
                mapped = false;
        }
        h = hold_lookup(r, p, b);
        if (!h) {
                e = reg_charge(r, p->creds.uid, REG_HOLD_COST, why);
                if (e != 0)
                        return e;
                h = calloc(1, sizeof(*h));
                if (!h || hmap_insert(&r->holds, &h->node, hold_hash(p->id, b->id)) < 0) {
                        free(h);
                        reg_uncharge(r, p->creds.uid, REG_HOLD_COST);
                        return -ENOMEM;
                }
                h->buf = b;
                h->peer = p;
                list_append(&b->holds, &h->buf_link);
                list_append(&p->holds, &h->peer_link);
        }
        /* A hold with no references left stays while the peer keeps the mapping (mapped): it is
         * how the next attach knows the fd need not travel again, and who hears "freed". */
        if (h->count == 0 && refs > 0)
                b->holders++;
        h->count += refs;
        b->refs += refs;
        p->n_refs += refs;
        r->n_refs += refs;
        h->mapped |= mapped;
        return 0;
}

void reg_hold_drop(Registry *r, Hold *h)
{
        h->buf->refs -= h->count;
        h->buf->holders -= h->count > 0;
        h->peer->n_refs -= h->count;
        r->n_refs -= h->count;
        list_unlink(&h->buf_link);
        list_unlink(&h->peer_link);
        hmap_remove(&r->holds, &h->node);
        reg_uncharge(r, h->peer->creds.uid, REG_HOLD_COST);
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
        reg_name_put(r, e);
}

/* The heap parts of a buffer: name, device, handle, metadata. */
static void buffer_free_fields(RegBuffer *b)
{
        free(b->name);
        free(b->device);
        free(b->handle);
        free(b->meta);
}

void reg_segment_release_if_done(Registry *r, RegBuffer *s, RegSink *o)
{
        /* A leaving producer's segments are dealt with after its views (registry_peer_remove). */
        if (s->n_views || s->destroying || s->state != PROTO_STATE_IDLE || (s->owner && s->owner->leaving))
                return;
        if (!s->owner || s->free_on_drain)
                reg_buffer_destroy(r, s, o);
}

/* A view leaves its segment; the segment goes too if nothing else keeps it. */
static void view_detach(Registry *r, RegBuffer *v, RegSink *o)
{
        RegBuffer *s = v->segment;

        list_unlink(&v->view_link);
        v->segment = NULL;
        s->n_views--;
        reg_segment_release_if_done(r, s, o);
}

void reg_buffer_destroy(Registry *r, RegBuffer *b, RegSink *o)
{
        b->destroying = true;
        /* The memory goes with the segment (the broker closes its fd): no view may outlive it. */
        while (!list_empty(&b->views))
                reg_buffer_destroy(r, list_entry(b->views.next, RegBuffer, view_link), o);
        if (b->segment)
                view_detach(r, b, o);
        while (!list_empty(&b->holds)) {
                Hold *h = list_entry(b->holds.next, Hold, buf_link);

                /* Only peers that still map it are told, so that they drop their cached mapping;
                 * a lost peer gets nothing more. */
                if (h->mapped && !h->peer->lost) {
                        reg_tell(o, h->peer, PROTO_EV_FREED, b, 0, (RegWhy){ REG_WHY_NONE });
                        r->counters.events++;
                }
                reg_hold_drop(r, h);
        }
        buffer_unpublish(r, b);
        reg_restored_forget(r, b);
        reg_departed_forget(b);
        reg_ring_part_gone(b);
        list_unlink(&b->owner_link);
        list_unlink(&b->link);
        hmap_remove(&r->buffers_by_id, &b->by_id);
        hmap_remove(&r->buffers_by_seq, &b->by_seq);
        if (held_memory(b)) {
                b->acct->held_memory -= b->info.size;
                r->held_memory -= b->info.size;
        }
        if (b->fd >= 0) {
                b->acct->fds--;
                r->n_fds--;
                reg_close_fd(o, b->fd);
        }
        reg_uncharge(r, b->owner_uid, b->cost);
        b->acct->buffers--;
        reg_acct_put(r, b->acct);
        r->n_buffers--;
        r->counters.frees++;
        r->n_state[b->state]--;
        r->n_orphaned -= b->owner == NULL;
        buffer_free_fields(b);
        free(b);
}

void reg_buffer_drain(Registry *r, RegBuffer *b, RegWhy why, RegSink *o)
{
        reg_buffer_set_state(r, b, PROTO_STATE_IDLE);
        reg_restored_forget(r, b);
        reg_departed_forget(b);
        r->counters.drains++;
        if (b->owner) {
                reg_tell(o, b->owner, PROTO_EV_DRAINED, b, 0, why);
                r->counters.events++;
        }
        reg_notify_subscribers(r, PROTO_EV_DRAINED, b, why, o);
        /* A segment stays while views of it are registered; the last one takes it along. */
        if ((!b->owner || b->free_on_drain) && b->n_views == 0)
                reg_buffer_destroy(r, b, o);
}

void reg_buffer_drain_if_done(Registry *r, RegBuffer *b, RegWhy why, RegSink *o)
{
        if (b->state != PROTO_STATE_RETIRED || b->refs > 0)
                return;
        /* A holder of the old broker may still reconnect and reclaim: drained would be a lie. */
        if (b->restored && r->in_grace)
                return;
        reg_buffer_drain(r, b, why, o);
}

void reg_buffer_retire(Registry *r, RegBuffer *b, RegSink *o)
{
        if (b->state != PROTO_STATE_LIVE)
                return;
        reg_buffer_set_state(r, b, PROTO_STATE_RETIRED);
        buffer_unpublish(r, b);
        r->counters.retires++;
        reg_notify_subscribers(r, PROTO_EV_RETIRED, b, (RegWhy){ REG_WHY_NONE }, o);
        reg_buffer_drain_if_done(r, b, (RegWhy){ REG_WHY_NONE }, o);
}

void reg_buffer_revoke(Registry *r, RegBuffer *b, RegWhy why, RegSink *o)
{
        b->destroying = true;
        /* The views' holders lose the memory too, and hear it under the names they attached. */
        while (!list_empty(&b->views))
                reg_buffer_revoke(r, list_entry(b->views.next, RegBuffer, view_link), why, o);
        list_for_each(pos, &b->holds) {
                Hold *h = list_entry(pos, Hold, buf_link);

                if (h->count == 0)
                        continue; /* only a cached mapping: the freed event that follows covers it */
                reg_tell(o, h->peer, PROTO_EV_REVOKED, b, 0, why);
                r->counters.events++;
        }
        r->counters.revokes++;
        reg_notify_subscribers(r, PROTO_EV_REVOKED, b, why, o);
        reg_buffer_destroy(r, b, o);
}

static bool peer_sees_device(const RegPeer *p, const char *uuid)
{
        for (uint32_t i = 0; i < p->n_gpus; i++)
                if (strcmp(p->gpus[i], uuid) == 0)
                        return true;
        return false;
}

/* Explains, before CUDA would fail obscurely, why this consumer cannot use this buffer.
 * Returns a status and fills why, or 0.
 *
 * Legacy CUDA IPC, as measured (docs/legacy-ipc.md): a handle opens in any process whose PID, as
 * that process sees it, differs from the exporter's, whatever PID namespaces the two are in; the
 * driver takes a handle whose exporting PID equals the opener's for one of the opener's own and
 * fails with CUDA_ERROR_INVALID_CONTEXT. Two processes of one namespace never share a PID, so only
 * processes of different namespaces with equal PIDs are refused (both PID 1 of their containers,
 * the usual case). An unknown PID is no reason to refuse: CUDA then decides. */
unsigned reg_attach_diagnose(const RegBuffer *b, const RegPeer *p, RegWhy *why)
{
        if (b->info.kind == PROTO_KIND_CUDA_LEGACY) {
                uint64_t mine = peer_self_pid(p), ns = peer_pidns(p);
                bool same_ns = ns && b->owner_pidns && ns == b->owner_pidns;

                if (mine && mine == b->owner_self_pid && !same_ns) {
                        *why = (RegWhy){ REG_E_SAME_PID, .s = { b->name },
                                         .n = { mine, b->owner_uid, b->owner_self_pid_declared,
                                                peer_self_pid_declared(p) } };
                        return PROTO_STATUS_SAME_PID;
                }
        }
        if (b->info.kind != PROTO_KIND_MEMFD && b->device && !peer_sees_device(p, b->device)) {
                *why = (RegWhy){ REG_E_DEVICE, .s = { b->name, b->device },
                                 .gpus = (const char (*)[PROTO_MAX_UUID + 1])p->gpus, .n_gpus = p->n_gpus };
                return PROTO_STATUS_DEVICE;
        }
        return 0;
}

static void reply_attached(RegSink *o, RegPeer *p, uint64_t id, RegBuffer *b, bool cached)
{
        reg_emit(o, &(RegChange){ .type = REG_CH_REPLY, .to = p, .req = id, .reply = REG_RE_ATTACHED, .buffer = b,
                                  .flag = cached });
}

/* Takes a reference for p on a live buffer and replies. */
static void attach_now(Registry *r, RegPeer *p, uint64_t id, RegBuffer *b, RegSink *o)
{
        unsigned status;
        RegWhy why;
        bool cached;
        int e;

        status = reg_attach_diagnose(b, p, &why);
        if (!status && !reg_ring_may_attach(b, p, &why))
                status = PROTO_STATUS_DENIED;
        if (status) {
                reg_answer(o, p, id, status, why);
                return;
        }
        if (p->n_refs + p->n_claim_refs >= r->limits.refs_per_peer) {
                reg_answer(o, p, id, PROTO_STATUS_QUOTA,
                           (RegWhy){ REG_E_REFS_FULL, .n = { p->n_refs + p->n_claim_refs } });
                return;
        }
        /* The fd travels once per peer: afterwards the peer's cached mapping serves, until it says
         * unmap. A legacy handle has no fd and is always in the reply itself. */
        cached = hold_mapped(r, p, reg_memory_of(b));
        e = reg_hold_add(r, p, b, 1, reg_memory_of(b)->fd >= 0, &why);
        if (e != 0) {
                reg_charge_failed(o, p, id, e, why);
                return;
        }
        b->attaches++;
        r->counters.attaches++;
        if (cached)
                r->counters.attaches_cached++;
        reply_attached(o, p, id, b, cached);
        if (b->retire_after && b->attaches >= b->retire_after)
                reg_buffer_retire(r, b, o);
}

/* Hands a newly published buffer to everyone waiting for its name, oldest first, for as long as
 * it stays published (retire_after may retire it half-way). */
static void wake_waiters(Registry *r, RegName *e, RegSink *o)
{
        RegBuffer *b = e->live;

        /* b stays valid throughout (each attach adds a reference), but e is freed if b gets
         * retired and nobody else waits, so test b before touching e. */
        while (b && b->published == e && !list_empty(&e->waits)) {
                Wait *w = list_entry(e->waits.next, Wait, link);
                RegPeer *p = w->peer;
                uint64_t id = w->req_id;

                /* Keep the name entry alive across reg_wait_free: it still has a live buffer. */
                reg_wait_free(r, w);
                attach_now(r, p, id, b, o);
        }
}

void registry_buffer_attach(Registry *r, RegPeer *p, uint64_t id, RegBuffer *b, RegSink *out)
{
        if (b->state != PROTO_STATE_LIVE) {
                reg_answer(out, p, id, PROTO_STATUS_STATE,
                           (RegWhy){ REG_E_NOT_LIVE, .n = { b->id, b->state }, .s = { b->name } });
                return;
        }
        attach_now(r, p, id, b, out);
}

void registry_attach(Registry *r, RegPeer *p, uint64_t id, const char *name, uint64_t buffer,
                     uint32_t timeout_ms, uint64_t now_ms, RegSink *out)
{
        uint64_t cost;
        RegName *e;
        RegBuffer *b;
        RegWhy why;
        Wait *w;
        int err;

        if (!name) {
                b = registry_request_buffer(r, p, id, buffer, out);
                if (b)
                        registry_buffer_attach(r, p, id, b, out);
                return;
        }

        e = reg_name_lookup(r, name);
        if (e && e->live) {
                attach_now(r, p, id, e->live, out);
                return;
        }
        if (timeout_ms == 0) {
                reg_answer(out, p, id, PROTO_STATUS_NOT_FOUND, (RegWhy){ REG_E_NOTHING_UNDER, .s = { name } });
                return;
        }
        if (p->n_waits >= r->limits.waits_per_peer) {
                reg_answer(out, p, id, PROTO_STATUS_QUOTA, (RegWhy){ REG_E_WAITS_LIMIT, .n = { p->n_waits } });
                return;
        }
        cost = reg_wait_cost(sizeof(RegName), strlen(name));
        err = reg_charge(r, p->creds.uid, cost, &why);
        if (err != 0) {
                reg_charge_failed(out, p, id, err, why);
                return;
        }
        e = name_get(r, name);
        w = calloc(1, sizeof(*w));
        if (!e || !w) {
                free(w);
                reg_name_put(r, e);
                reg_uncharge(r, p->creds.uid, cost);
                registry_peer_mark_lost(p);
                return;
        }
        timeout_ms = MIN(timeout_ms, r->limits.max_timeout_ms);
        *w = (Wait){ .timer = { HEAP_NODE_INIT, TIMER_WAIT }, .peer = p, .req_id = id,
                     .deadline = now_ms + timeout_ms, .name_publishes = e->publishes, .name = e,
                     .cost = (uint32_t)cost };
        if (heap_push(&r->timers, &w->timer.node, w->deadline) < 0) {
                free(w);
                reg_name_put(r, e);
                reg_uncharge(r, p->creds.uid, cost);
                registry_peer_mark_lost(p);
                return;
        }
        list_append(&e->waits, &w->link);
        list_append(&p->waits, &w->peer_link);
        p->n_waits++;
        r->n_waits++;
        r->counters.attach_waits++;
}

static bool may_manage(const RegBuffer *b, const RegPeer *p)
{
        return b->owner ? b->owner == p : b->owner_uid == p->creds.uid;
}

static void reply_published(RegSink *o, RegPeer *p, uint64_t id, const RegBuffer *b)
{
        reg_emit(o, &(RegChange){ .type = REG_CH_REPLY, .to = p, .req = id, .reply = REG_RE_PUBLISHED, .buffer = b });
}

/* Puts b under its name and tells whoever waits or listens. A new publication gets a new
 * generation; a restored one keeps the generation its consumers know it by. */
static void publish_under_name(Registry *r, RegPeer *p, uint64_t id, RegBuffer *b, RegName *e, bool restored,
                               RegSink *o)
{
        RegBuffer *old = e->live;

        e->live = b;
        b->published = e;
        e->publishes++;
        if (old && old != b)
                reg_buffer_retire(r, old, o); /* the same producer replaced its own buffer */
        reg_buffer_set_state(r, b, PROTO_STATE_LIVE);
        if (!restored)
                b->generation = ++r->generation;
        b->attaches = 0;
        reply_published(o, p, id, b);
        reg_claims_adopt(r, b, o);
        reg_notify_subscribers(r, PROTO_EV_PUBLISHED, b, (RegWhy){ REG_WHY_NONE }, o);
        /* Adopted claims counted as attaches may have used retire_after up; e may go with it. */
        if (reg_attaches_used_up(b)) {
                reg_buffer_retire(r, b, o);
                return;
        }
        wake_waiters(r, e, o);
}

/* May p put a buffer under name? A producer may replace its own buffer, and a restarted producer
 * (same uid) the one its predecessor left broker-held: the old one is retired and drains as usual.
 * Returns the other producer's live buffer that keeps p out, or NULL. */
static const RegBuffer *name_blocker(Registry *r, const RegPeer *p, const char *name, const RegBuffer *self)
{
        RegName *e = reg_name_lookup(r, name);
        const RegBuffer *live = e ? e->live : NULL;

        if (!live || live == self || live->owner == p || (!live->owner && live->owner_uid == p->creds.uid))
                return NULL;
        return live;
}

/* Checks the name is free for p. Returns 0, or replies with an error and returns its status. */
static unsigned publish_check_name(Registry *r, RegPeer *p, uint64_t id, const char *name, const RegBuffer *self,
                                   RegSink *o)
{
        const RegBuffer *live = name_blocker(r, p, name, self);

        if (!live)
                return 0;
        if (!live->owner)
                reg_answer(o, p, id, PROTO_STATUS_NAME_TAKEN,
                           (RegWhy){ REG_E_NAME_ORPHANED, .s = { name }, .n = { live->owner_uid, live->id } });
        else
                reg_answer(o, p, id, PROTO_STATUS_NAME_TAKEN, (RegWhy){ REG_E_NAME_TAKEN, .s = { name },
                           .n = { live->owner_id, live->owner_pid, live->owner_uid } });
        return PROTO_STATUS_NAME_TAKEN;
}

static int buffer_set_meta(RegBuffer *b, const uint8_t *meta, uint32_t len)
{
        int r = bytes_replace(&b->meta, meta, len);

        if (r == 0)
                b->meta_len = b->meta ? len : 0;
        return r;
}

/* What a buffer costs its producer's uid while the broker knows it: itself, its name twice (its own
 * copy, and the name's entry as if it were the only one under it), device, legacy handle and
 * metadata, its index slots, and the events it causes. */
static uint64_t buffer_cost(const char *name, const char *device, bool handle, uint32_t meta_len)
{
        size_t len = strlen(name);

        return budget_alloc_cost(sizeof(RegBuffer)) + budget_alloc_cost(len + 1) +
               budget_alloc_cost(sizeof(RegName) + len + 1) +
               (device && *device ? budget_alloc_cost(strlen(device) + 1) : 0) +
               (handle ? budget_alloc_cost(PROTO_LEGACY_HANDLE_SIZE) : 0) +
               (meta_len ? budget_alloc_cost(meta_len) : 0) + 3 * REG_INDEX_COST + REG_FRAME_COST;
}

/* Copies what a new buffer keeps of the publish: name, device, legacy handle, metadata. */
static int buffer_set_fields(RegBuffer *b, const RegPublish *a)
{
        b->name = strdup(a->name);
        b->device = a->device && *a->device ? strdup(a->device) : NULL;
        if (a->handle) {
                b->handle = malloc(PROTO_LEGACY_HANDLE_SIZE);
                if (b->handle)
                        memcpy(b->handle, a->handle, PROTO_LEGACY_HANDLE_SIZE);
        }
        if (!b->name || (a->device && *a->device && !b->device) || (a->handle && !b->handle))
                return -ENOMEM;
        return buffer_set_meta(b, a->meta, a->meta_len);
}

static void republish(Registry *r, RegPeer *p, uint64_t id, RegPublish *a, RegSink *out)
{
        RegBuffer *b = registry_request_buffer(r, p, id, a->buffer, out);
        uint64_t cost;
        char *name;
        RegName *e;
        RegWhy why;
        int err;

        if (!b)
                return;
        if (b->owner != p) {
                reg_answer(out, p, id, PROTO_STATUS_NOT_OWNER, (RegWhy){ REG_E_OTHERS_BUFFER, .n = { a->buffer } });
                return;
        }
        if (b->state != PROTO_STATE_IDLE) {
                reg_answer(out, p, id, PROTO_STATUS_STATE, (RegWhy){ REG_E_NOT_IDLE, .n = { a->buffer, b->state } });
                return;
        }
        if (publish_check_name(r, p, id, a->name, b, out))
                return;
        /* Another name or other metadata may cost more (or less) than the old. */
        cost = buffer_cost(a->name, b->device, b->handle, a->has_meta ? a->meta_len : b->meta_len);
        err = cost > b->cost ? reg_charge(r, b->owner_uid, cost - b->cost, &why) : 0;
        if (err != 0) {
                reg_charge_failed(out, p, id, err, why);
                return;
        }
        e = name_get(r, a->name);
        name = strdup(a->name);
        if (!e || !name || (a->has_meta && buffer_set_meta(b, a->meta, a->meta_len) < 0)) {
                free(name);
                reg_name_put(r, e);
                if (cost > b->cost)
                        reg_uncharge(r, b->owner_uid, cost - b->cost);
                registry_peer_mark_lost(p);
                return;
        }
        if (cost < b->cost)
                reg_uncharge(r, b->owner_uid, b->cost - cost);
        b->cost = cost;
        free(b->name);
        b->name = name;
        b->retire_after = a->retire_after;
        b->free_on_drain = false;
        r->counters.republishes++;
        publish_under_name(r, p, id, b, e, false, out);
}

/* An id for memory whose producer named none: drawn at random (splitmix64), so that ids say nothing
 * about how many buffers exist and one broker's ids are unlikely to be another's. */
static uint64_t draw_id(Registry *r)
{
        for (;;) {
                uint64_t z = (r->id_state += UINT64_C(0x9e3779b97f4a7c15));

                z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
                z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
                z = (z ^ (z >> 31)) & PROTO_MAX_BUFFER_ID;
                if (z && !reg_buffer_lookup(r, z))
                        return z;
        }
}

/* Makes p the producer of b, with what the attach checks need to know of it. */
static void reg_buffer_set_owner(RegBuffer *b, RegPeer *p)
{
        b->owner = p;
        b->owner_id = p->id;
        b->owner_uid = p->creds.uid;
        b->owner_pid = p->creds.pid;
        b->owner_pidns = peer_pidns(p);
        b->owner_pidns_declared = peer_pidns_declared(p);
        b->owner_self_pid = peer_self_pid(p);
        b->owner_self_pid_declared = peer_self_pid_declared(p);
}

/* A producer that lost its connection to this broker instance registers a broker-held buffer of its
 * own again, which the broker kept as an orphan: it becomes the owner once more, and the broker
 * keeps the memory (and holds) it already has. */
static bool adopt_orphan(Registry *r, RegPeer *p, uint64_t id, RegBuffer *b, const RegPublish *a, RegSink *out)
{
        if (b->owner || b->owner_uid != p->creds.uid || !a->restored || b->generation != a->generation)
                return false;
        reg_buffer_set_owner(b, p);
        b->free_on_drain = false;
        list_append(&p->owned, &b->owner_link);
        r->n_orphaned--;
        reply_published(out, p, id, b);
        return true;
}

/* Checks the id a publish of new memory chose. Returns 0, or replies (adopting an orphan, or with
 * an error) and returns non-zero. */
static int check_new_id(Registry *r, RegPeer *p, uint64_t id, const RegPublish *a, RegSink *out)
{
        RegBuffer *b = a->buffer ? reg_buffer_lookup(r, a->buffer) : NULL;

        if (!b)
                return 0;
        if (adopt_orphan(r, p, id, b, a, out))
                return 1;
        reg_answer(out, p, id, PROTO_STATUS_KEY_TAKEN,
                   (RegWhy){ REG_E_KEY_TAKEN, .n = { a->buffer, b->owner_id, b->owner_uid } });
        return PROTO_STATUS_KEY_TAKEN;
}

/* A restored buffer that was retired, or whose name another producer took while this one was away,
 * is registered without a name: its holders may reclaim it, and it drains when they are done. */
static void register_retired(Registry *r, RegPeer *p, uint64_t id, RegBuffer *b, RegSink *out)
{
        reg_buffer_set_state(r, b, PROTO_STATE_RETIRED);
        reply_published(out, p, id, b);
        reg_claims_adopt(r, b, out);
        reg_buffer_drain_if_done(r, b, (RegWhy){ REG_R_RESTORED_UNHELD }, out);
}

RegBuffer *reg_buffer_register(Registry *r, RegPeer *p, uint64_t id, const RegPublish *a, int *fd, RegSink *out)
{
        RegBuffer *b = NULL;
        uint64_t cost;
        RegWhy why;
        int e;

        if (check_new_id(r, p, id, a, out))
                return NULL;
        if (p->acct->buffers >= r->limits.buffers_per_uid) {
                reg_answer(out, p, id, PROTO_STATUS_QUOTA,
                           (RegWhy){ REG_E_BUFFERS_LIMIT, .n = { p->creds.uid, p->acct->buffers } });
                return NULL;
        }
        if (*fd >= 0 && p->acct->fds >= r->limits.fds_per_uid) {
                reg_answer(out, p, id, PROTO_STATUS_QUOTA,
                           (RegWhy){ REG_E_FDS_LIMIT, .n = { p->acct->fds, p->creds.uid } });
                return NULL;
        }
        if (*fd >= 0 && a->info.broker_held && r->limits.held_memory_per_uid &&
            (p->acct->held_memory > r->limits.held_memory_per_uid ||
             a->info.size > r->limits.held_memory_per_uid - p->acct->held_memory)) {
                reg_answer(out, p, id, PROTO_STATUS_QUOTA,
                           (RegWhy){ REG_E_HELD_MEMORY_LIMIT,
                                     .n = { p->creds.uid, p->acct->held_memory, a->info.size,
                                            r->limits.held_memory_per_uid } });
                return NULL;
        }
        cost = buffer_cost(a->name, a->device, a->handle, a->meta_len);
        e = reg_charge(r, p->creds.uid, cost, &why);
        if (e != 0) {
                reg_charge_failed(out, p, id, e, why);
                return NULL;
        }
        b = calloc(1, sizeof(*b));
        if (!b || buffer_set_fields(b, a) < 0)
                goto no_memory;
        b->cost = cost;
        b->id = a->buffer ? a->buffer : draw_id(r);
        b->seq = ++r->next_seq;
        if (hmap_insert(&r->buffers_by_id, &b->by_id, hash_u64(b->id)) < 0)
                goto no_memory;
        if (hmap_insert(&r->buffers_by_seq, &b->by_seq, hash_u64(b->seq)) < 0) {
                hmap_remove(&r->buffers_by_id, &b->by_id);
                goto no_memory;
        }
        b->info = a->info;
        b->fd = steal_fd(*fd);
        b->retire_after = a->retire_after;
        reg_buffer_set_owner(b, p);
        b->acct = p->acct;
        list_init(&b->holds);
        list_init(&b->departed);
        list_init(&b->restored_link);
        list_init(&b->views);
        list_init(&b->view_link);
        list_append(&r->buffers, &b->link);
        list_append(&p->owned, &b->owner_link);
        b->acct->buffers++;
        if (b->fd >= 0) {
                b->acct->fds++;
                r->n_fds++;
        }
        if (held_memory(b)) {
                b->acct->held_memory += b->info.size;
                r->held_memory += b->info.size;
        }
        r->n_buffers++;
        r->n_state[PROTO_STATE_NONE]++;
        r->counters.publishes++;
        if (a->restored) {
                b->generation = a->generation;
                if (r->in_grace) {
                        b->restored = true;
                        list_append(&r->restored, &b->restored_link);
                }
        }
        return b;

no_memory:
        if (b)
                buffer_free_fields(b);
        free(b);
        reg_uncharge(r, p->creds.uid, cost);
        registry_peer_mark_lost(p);
        return NULL;
}

/* The segment a view is published in: registered already (then an fd that came along is closed:
 * the segment's memory travels once), or registered now with the fd. Its producer's, and neither a
 * view nor a ring part. NULL once answered. */
static RegBuffer *view_segment(Registry *r, RegPeer *p, uint64_t id, const RegPublish *a, int *fd, RegSink *out)
{
        RegBuffer *s = reg_buffer_lookup(r, a->info.segment);
        uint64_t size = s ? s->info.size : a->segment_size;
        RegPublish seg;

        if (s && !s->owner && s->owner_uid == p->creds.uid && a->restored) {
                /* Broker-held and orphaned while its producer was away: it comes back with a view. */
                reg_buffer_set_owner(s, p);
                s->free_on_drain = false;
                list_append(&p->owned, &s->owner_link);
                r->n_orphaned--;
        }
        if (s && s->owner != p) {
                reg_answer(out, p, id, PROTO_STATUS_NOT_OWNER, (RegWhy){ REG_E_OTHERS_SEGMENT, .n = { s->id } });
                return NULL;
        }
        if (s && (s->segment || s->ring_part || s->info.kind != a->info.kind)) {
                reg_answer(out, p, id, PROTO_STATUS_INVALID,
                           (RegWhy){ REG_E_NOT_A_SEGMENT, .n = { s->id, s->segment ? 1 : s->ring_part ? 2 : 3 } });
                return NULL;
        }
        if (s && s->free_on_drain) {
                reg_answer(out, p, id, PROTO_STATUS_STATE, (RegWhy){ REG_E_SEGMENT_FREED, .n = { s->id } });
                return NULL;
        }
        if (!s && *fd < 0) {
                reg_answer(out, p, id, PROTO_STATUS_NOT_FOUND, (RegWhy){ REG_E_NO_SEGMENT, .n = { a->info.segment } });
                return NULL;
        }
        if (a->info.offset > size || a->info.size > size - a->info.offset) {
                reg_answer(out, p, id, PROTO_STATUS_INVALID,
                           (RegWhy){ REG_E_VIEW_OUTSIDE, .n = { a->info.offset, a->info.size, size } });
                return NULL;
        }
        if (s) {
                if (*fd >= 0)
                        reg_close_fd(out, steal_fd(*fd));
                return s;
        }
        seg = (RegPublish){ .name = "", .buffer = a->info.segment, .device = a->device, .fd = -1,
                            .info = { .kind = a->info.kind, .size = a->segment_size, .writable = a->info.writable,
                                      .broker_held = a->info.broker_held } };
        s = reg_buffer_register(r, p, id, &seg, fd, out);
        if (s)
                reg_buffer_set_state(r, s, PROTO_STATE_IDLE); /* registered, under no name */
        return s;
}

/* Registers and publishes a view: a range of a segment's memory under a name of its own. */
static void publish_view(Registry *r, RegPeer *p, uint64_t id, RegPublish *a, int *fd, RegSink *out)
{
        RegBuffer *s, *v;
        RegPublish va;
        int none = -1;
        RegName *e;

        if (!a->restored && publish_check_name(r, p, id, a->name, NULL, out))
                return;
        s = view_segment(r, p, id, a, fd, out);
        if (!s)
                return;
        /* What the memory is, the segment says; a view only names its range. */
        va = *a;
        va.info.kind = s->info.kind;
        va.info.writable = s->info.writable;
        va.info.broker_held = s->info.broker_held;
        va.device = s->device;
        e = name_get(r, a->name);
        if (!e) {
                registry_peer_mark_lost(p);
                return;
        }
        v = reg_buffer_register(r, p, id, &va, &none, out);
        if (!v) {
                reg_name_put(r, e);
                return;
        }
        v->segment = s;
        list_append(&s->views, &v->view_link);
        s->n_views++;
        if (a->restored && (a->retired || name_blocker(r, p, a->name, NULL))) {
                reg_name_put(r, e);
                register_retired(r, p, id, v, out);
                return;
        }
        publish_under_name(r, p, id, v, e, a->restored, out);
}

void registry_publish(Registry *r, RegPeer *p, uint64_t id, RegPublish *a, RegSink *out)
{
        _cleanup_close_ int fd = steal_fd(a->fd);
        RegBuffer *b;
        RegName *e;

        if (a->again) {
                republish(r, p, id, a, out);
                return;
        }
        if (a->restored && (a->generation == 0 || a->generation > r->generation)) {
                reg_answer(out, p, id, PROTO_STATUS_INVALID,
                           (RegWhy){ REG_E_RESTORED_GENERATION, .n = { r->generation } });
                return;
        }
        if (a->info.segment) {
                publish_view(r, p, id, a, &fd, out);
                return;
        }
        /* A restored buffer never fails for its name: if another producer took it meanwhile, the
         * restored one is registered retired, so that its holders can still come back. */
        if (!a->restored && publish_check_name(r, p, id, a->name, NULL, out))
                return;
        e = name_get(r, a->name);
        if (!e) {
                registry_peer_mark_lost(p);
                return;
        }
        b = reg_buffer_register(r, p, id, a, &fd, out);
        if (!b) {
                reg_name_put(r, e);
                return;
        }
        if (a->restored && (a->retired || name_blocker(r, p, a->name, NULL))) {
                reg_name_put(r, e);
                register_retired(r, p, id, b, out);
                return;
        }
        publish_under_name(r, p, id, b, e, a->restored, out);
}

void registry_release(Registry *r, RegPeer *p, uint64_t id, uint64_t buffer, RegSink *out)
{
        RegBuffer *b = reg_buffer_lookup(r, buffer);
        Hold *h = b ? hold_lookup(r, p, b) : NULL;

        if ((!h || h->count == 0) && reg_claim_release(r, p, buffer)) {
                /* A reference reclaimed while its producer is still away: the claim shrinks. */
                r->counters.releases++;
                reg_answer(out, p, id, PROTO_STATUS_OK, (RegWhy){ REG_WHY_NONE });
                return;
        }
        if (!h || h->count == 0) {
                reg_answer(out, p, id, PROTO_STATUS_NOT_ATTACHED, (RegWhy){ REG_E_NOT_ATTACHED, .n = { buffer } });
                return;
        }
        h->count--;
        b->refs--;
        p->n_refs--;
        r->n_refs--;
        if (h->count == 0) {
                b->holders--;
                if (!h->mapped)
                        reg_hold_drop(r, h);
        }
        r->counters.releases++;
        reg_answer(out, p, id, PROTO_STATUS_OK, (RegWhy){ REG_WHY_NONE });
        reg_buffer_drain_if_done(r, b, (RegWhy){ REG_WHY_NONE }, out);
}

void registry_unmap(Registry *r, RegPeer *p, uint64_t id, uint64_t buffer, RegSink *out)
{
        RegBuffer *b = reg_buffer_lookup(r, buffer);
        Hold *h = b ? hold_lookup(r, p, b) : NULL;

        /* Unknown or never mapped: nothing to forget, and nothing wrong either (the buffer may
         * have been freed while the request travelled). */
        if (h) {
                h->mapped = false;
                if (h->count == 0)
                        reg_hold_drop(r, h);
        }
        reg_answer(out, p, id, PROTO_STATUS_OK, (RegWhy){ REG_WHY_NONE });
}

/* Retire and free are for whoever may manage b (may_manage) or an admin; else replies and returns false. */
static bool managing(RegPeer *p, uint64_t id, const RegBuffer *b, bool as_admin, RegSink *out)
{
        if (as_admin || may_manage(b, p))
                return true;
        reg_answer(out, p, id, PROTO_STATUS_NOT_OWNER,
                   (RegWhy){ REG_E_NOT_OWNER, .n = { b->id, b->owner_id, b->owner_uid }, .s = { b->name } });
        return false;
}

void registry_buffer_retire(Registry *r, RegPeer *p, uint64_t id, RegBuffer *b, bool as_admin, RegSink *out)
{
        if (!managing(p, id, b, as_admin, out))
                return;
        /* Retiring twice is harmless: the drained event comes once. */
        reg_answer(out, p, id, PROTO_STATUS_OK, (RegWhy){ REG_WHY_NONE });
        reg_buffer_retire(r, b, out);
}

void registry_buffer_free(Registry *r, RegPeer *p, uint64_t id, RegBuffer *b, bool as_admin, RegSink *out)
{
        if (!managing(p, id, b, as_admin, out))
                return;
        reg_answer(out, p, id, PROTO_STATUS_OK, (RegWhy){ REG_WHY_NONE });
        if (b->state == PROTO_STATE_IDLE) {
                /* A segment goes once its views went (reg_segment_release_if_done). */
                if (b->n_views)
                        b->free_on_drain = true;
                else
                        reg_buffer_destroy(r, b, out);
                return;
        }
        /* Still referenced: forget it once drained; the producer still gets its drained event. */
        b->free_on_drain = true;
        reg_buffer_retire(r, b, out);
}

void registry_retire(Registry *r, RegPeer *p, uint64_t id, uint64_t buffer, bool as_admin, RegSink *out)
{
        RegBuffer *b = registry_request_buffer(r, p, id, buffer, out);

        if (b)
                registry_buffer_retire(r, p, id, b, as_admin, out);
}

void registry_free_buffer(Registry *r, RegPeer *p, uint64_t id, uint64_t buffer, bool as_admin, RegSink *out)
{
        RegBuffer *b = registry_request_buffer(r, p, id, buffer, out);

        if (b)
                registry_buffer_free(r, p, id, b, as_admin, out);
}

int registry_new(Registry **ret, const RegConfig *cfg)
{
        Registry *r = calloc(1, sizeof(*r));

        if (!r)
                return -ENOMEM;
        r->limits = cfg->limits;
        r->budget = cfg->budget;
        r->peer_extra = cfg->peer_extra;
        r->epoch = cfg->epoch;
        r->generation = cfg->first_generation;
        r->id_state = cfg->id_seed;
        r->restart_grace_ms = cfg->restart_grace_ms;
        list_init(&r->buffers);
        list_init(&r->peers);
        list_init(&r->subs);
        list_init(&r->lost);
        list_init(&r->restored);
        list_init(&r->seat_claims);
        list_init(&r->ring_list);
        r->grace_timer = (Timer){ HEAP_NODE_INIT, TIMER_GRACE };
        /* Every broker start may be a restart: holders of a predecessor get the grace to come back. */
        if (cfg->restart_grace_ms > 0) {
                if (heap_push(&r->timers, &r->grace_timer.node, cfg->start_ms + cfg->restart_grace_ms) < 0) {
                        free(r);
                        return -ENOMEM;
                }
                r->in_grace = true;
        }
        *ret = r;
        return 0;
}

/* The registry is going away with everyone in it: nobody is told anything, its fds are closed. */
static void drop_change(void *ctx, const RegChange *c)
{
        (void)ctx;
        if (c->type == REG_CH_CLOSE_FD)
                safe_close(c->fd);
}

Registry *registry_free(Registry *r)
{
        RegSink out = { drop_change, NULL };

        if (!r)
                return NULL;
        /* Peers first: that cancels waits and groups and releases references. Broker-held buffers
         * survive their owners, so they are destroyed explicitly afterwards. */
        while (!list_empty(&r->peers))
                registry_peer_remove(r, list_entry(r->peers.next, RegPeer, link), &out);
        while (!list_empty(&r->buffers))
                reg_buffer_destroy(r, list_entry(r->buffers.next, RegBuffer, link), &out);
        hmap_deinit(&r->buffers_by_id);
        hmap_deinit(&r->buffers_by_seq);
        hmap_deinit(&r->claims);
        hmap_deinit(&r->rings);
        hmap_deinit(&r->names);
        hmap_deinit(&r->groups);
        hmap_deinit(&r->holds);
        hmap_deinit(&r->uids);
        heap_deinit(&r->timers);
        free(r);
        return NULL;
}
