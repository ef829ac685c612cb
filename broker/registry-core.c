/* The registry's core, the layer every other part stands on: uid accounts and the memory budget's
 * charges, emitting changes, names, holds (references), a buffer's whole life (registering, retiring,
 * draining, revoking, forgetting) with the events it causes to holders and subscribers, the checks an
 * attach makes of a consumer, and the peer list with its lost peers. It calls no other part of the
 * registry (docs/design.md "Registry"); the parts above it call in.
 *
 * What it must never do: any I/O (no socket, no clock: the time comes in as an argument, no file),
 * or close an fd itself: an fd it lets go goes to the outbox's close list and is closed after the
 * frames of the same operation, which may still carry it, are sent. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "registry-core.h"
#include "registry-rings-core.h" /* RegRing: a ring part leaving the registry leaves its ring's table */

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
                *why = (RegWhy){ REG_E_MEMORY_BUDGET, .memory_budget = { .uid = uid,
                                                                         .whole_pool = f.which == BUDGET_E_ALL,
                                                                         .used = f.used, .limit = f.limit,
                                                                         .asked = n } };
        return REG_E_MEMORY_BUDGET;
}

void reg_uncharge(Registry *r, uint32_t uid, uint64_t n)
{
        budget_uncharge(r->budget, uid, BUDGET_HELD, n);
}

void reg_emit(RegSink *o, const RegChange *c)
{
        o->emit(o->ctx, c);
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

int registry_request_buffer(const Registry *r, uint64_t buffer, RegBuffer **ret, RegWhy *why)
{
        RegBuffer *b = reg_buffer_lookup(r, buffer);

        if (!b)
                return reg_fail(why, (RegWhy){ REG_E_NO_BUFFER, .no_buffer = { buffer } });
        *ret = b;
        return 0;
}

RegName *reg_name_lookup(const Registry *r, const char *name)
{
        return HMAP_FIND(&r->names, hash_str(name), RegName, node, e, strcmp(e->name, name) == 0);
}

RegName *reg_name_get(Registry *r, const char *name)
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

/* Whether b's memory counts as broker-held: it carries the memory's fd (a buffer or a segment, not
 * a view, whose memory is its segment's) and outlives its producer. Both are fixed at registration. */
static bool held_memory(const RegBuffer *b)
{
        return b->fd >= 0 && b->info.broker_held;
}

Hold *reg_hold_lookup(const Registry *r, const RegPeer *p, const RegBuffer *b)
{
        return HMAP_FIND(&r->holds, hold_hash(p->id, b->id), Hold, node, h, h->peer == p && h->buf == b);
}

/* b's memory joins (sign 1) or leaves (-1) the bytes shared, unless it is a view's (its segment's). */
static void shared_bytes_count(Registry *r, const RegBuffer *b, int sign)
{
        uint64_t n = b->info.size;

        if (b->info.segment)
                return;
        if (sign > 0) {
                r->shared_bytes[b->info.kind] += n;
                b->acct->shared_bytes += n;
        } else {
                r->shared_bytes[b->info.kind] -= n;
                b->acct->shared_bytes -= n;
        }
}

void reg_holder_count(Registry *r, const Hold *h, int sign)
{
        uint64_t n = h->buf->info.size;

        if (sign > 0) {
                h->buf->holders++;
                r->held_bytes[h->buf->info.kind] += n;
                h->peer->acct->held_bytes += n;
        } else {
                h->buf->holders--;
                r->held_bytes[h->buf->info.kind] -= n;
                h->peer->acct->held_bytes -= n;
        }
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
        h = reg_hold_lookup(r, p, b);
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
                reg_holder_count(r, h, 1);
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
        if (h->count > 0)
                reg_holder_count(r, h, -1);
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
        if (b->fd >= 0) {
                b->acct->fds--;
                r->n_fds--;
                reg_close_fd(o, b->fd);
        }
        reg_uncharge(r, b->owner_uid, b->cost);
        shared_bytes_count(r, b, -1);
        if (held_memory(b)) {
                b->acct->held_memory -= b->info.size;
                r->held_memory -= b->info.size;
        }
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
 * Returns a code and fills why, or 0.
 *
 * Legacy CUDA IPC, as measured (docs/legacy-ipc.md): a handle opens in any process whose PID, as
 * that process sees it, differs from the exporter's, whatever PID namespaces the two are in; the
 * driver takes a handle whose exporting PID equals the opener's for one of the opener's own and
 * fails with CUDA_ERROR_INVALID_CONTEXT. Two processes of one namespace never share a PID, so only
 * processes of different namespaces with equal PIDs are refused (both PID 1 of their containers,
 * the usual case). An unknown PID is no reason to refuse: CUDA then decides. */
int reg_attach_diagnose(const RegBuffer *b, const RegPeer *p, RegWhy *why)
{
        if (b->info.kind == PROTO_KIND_CUDA_LEGACY) {
                uint64_t mine = peer_self_pid(p), ns = peer_pidns(p);
                bool same_ns = ns && b->owner_pidns && ns == b->owner_pidns;

                if (mine && mine == b->owner_self_pid && !same_ns)
                        return reg_fail(why, (RegWhy){
                                REG_E_SAME_PID,
                                .same_pid = { .name = b->name, .pid = mine, .producer_uid = b->owner_uid,
                                              .producer_declared = b->owner_self_pid_declared,
                                              .consumer_declared = peer_self_pid_declared(p) } });
        }
        if (b->info.kind != PROTO_KIND_MEMFD && b->device && !peer_sees_device(p, b->device))
                return reg_fail(why, (RegWhy){ REG_E_DEVICE,
                                               .device = { .name = b->name, .device = b->device,
                                                           .gpus = (const char (*)[PROTO_MAX_UUID + 1])p->gpus,
                                                           .n_gpus = p->n_gpus } });
        return 0;
}

int reg_buffer_set_meta(RegBuffer *b, const uint8_t *meta, uint32_t len)
{
        int r = bytes_replace(&b->meta, meta, len);

        if (r == 0)
                b->meta_len = b->meta ? len : 0;
        return r;
}

/* What a buffer costs its producer's uid while the broker knows it: itself, its name twice (its own
 * copy, and the name's entry as if it were the only one under it), device, legacy handle and
 * metadata, its index slots, and the events it causes. */
uint64_t reg_buffer_cost(const char *name, const char *device, bool handle, uint32_t meta_len)
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
        return reg_buffer_set_meta(b, a->meta, a->meta_len);
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
void reg_buffer_set_owner(RegBuffer *b, RegPeer *p)
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

int reg_buffer_register(Registry *r, RegPeer *p, const RegPublish *a, int *fd, RegBuffer **ret, RegWhy *why)
{
        RegBuffer *b = NULL;
        uint64_t cost;
        int e;

        if (p->acct->buffers >= r->limits.buffers_per_uid)
                return reg_fail(why, (RegWhy){ REG_E_BUFFERS_LIMIT,
                                               .buffers_limit = { .uid = p->creds.uid, .buffers = p->acct->buffers } });
        if (*fd >= 0 && p->acct->fds >= r->limits.fds_per_uid)
                return reg_fail(why, (RegWhy){ REG_E_FDS_LIMIT, .fds_limit = { .fds = p->acct->fds,
                                                                               .uid = p->creds.uid } });
        if (*fd >= 0 && a->info.broker_held && r->limits.held_memory_per_uid &&
            (p->acct->held_memory > r->limits.held_memory_per_uid ||
             a->info.size > r->limits.held_memory_per_uid - p->acct->held_memory))
                return reg_fail(why, (RegWhy){ REG_E_HELD_MEMORY_LIMIT,
                                               .held_memory_limit = { .uid = p->creds.uid,
                                                                      .held = p->acct->held_memory,
                                                                      .size = a->info.size,
                                                                      .limit = r->limits.held_memory_per_uid } });
        cost = reg_buffer_cost(a->name, a->device, a->handle, a->meta_len);
        e = reg_charge(r, p->creds.uid, cost, why);
        if (e != 0)
                return e;
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
        shared_bytes_count(r, b, 1);
        if (held_memory(b)) {
                b->acct->held_memory += b->info.size;
                r->held_memory += b->info.size;
        }
        if (b->fd >= 0) {
                b->acct->fds++;
                r->n_fds++;
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
        *ret = b;
        return 0;

no_memory:
        if (b)
                buffer_free_fields(b);
        free(b);
        reg_uncharge(r, p->creds.uid, cost);
        return -ENOMEM;
}

void reg_notify_subscribers(Registry *r, ProtoEvent ev, const RegBuffer *b, RegWhy why, RegSink *o)
{
        list_for_each(pos, &r->subs) {
                Sub *s = list_entry(pos, Sub, link);

                if (strncmp(b->name, s->prefix, s->prefix_len) != 0)
                        continue;
                reg_tell(o, s->peer, ev, b, s->id, why);
                r->counters.events++;
        }
}

void reg_restored_forget(Registry *r, RegBuffer *b)
{
        if (!b->restored)
                return;
        b->restored = false;
        list_unlink(&b->restored_link);
}

void reg_departed_forget(RegBuffer *b)
{
        while (!list_empty(&b->departed)) {
                DepartedHold *d = list_entry(b->departed.next, DepartedHold, link);

                list_unlink(&d->link);
                free(d);
        }
        b->n_departed = 0;
}

void reg_ring_part_gone(RegBuffer *b)
{
        if (b->ring) {
                b->ring->parts[b->ring_index] = NULL;
                b->ring->n_registered--;
                b->ring = NULL;
        }
}

void registry_peer_mark_lost(RegPeer *p)
{
        if (p && !p->lost) {
                p->lost = true;
                list_append(&p->reg->lost, &p->lost_link);
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
