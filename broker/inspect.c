/* Listing replies. Each carries an "items" array of records; long listings are paged with
 * "after" (an opaque cursor: the position of the last record) and "more", so a reply always fits in
 * one frame. A peer sees only what the policy lets it see (docs/security.md "What listings show"). */
#include "inspect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "ringview.h"

/* Records stop well before the frame limit, leaving room for the reply's own fields. */
#define ITEMS_BUDGET (PROTO_MAX_BODY - 1024)
#define DEFAULT_PAGE 256

typedef struct Items {
        ProtoBuf buf;
        uint32_t count;
        bool full, failed;
} Items;

static void items_init(Items *it)
{
        static const uint8_t array32_placeholder[5];

        /* Room for an array32 header, patched in items_finish once the count is known. */
        *it = (Items){ 0 };
        if (proto_buf_append(&it->buf, array32_placeholder, sizeof(array32_placeholder)) < 0)
                it->failed = true;
}

/* Appends one record unless it would overflow the frame; returns false once full. */
static bool items_add(Items *it, const ProtoMsg *rec, uint32_t max)
{
        size_t before = it->buf.len;

        if (it->full || it->failed || it->count >= max)
                return (it->full = true, false);
        if (proto_record_encode(&it->buf, rec) < 0) {
                it->failed = true;
                return false;
        }
        if (it->buf.len > ITEMS_BUDGET) {
                it->buf.len = before;
                it->full = true;
                return false;
        }
        it->count++;
        return true;
}

static void items_finish(Items *it, ProtoMsg *reply)
{
        it->buf.data[0] = 0xdd;
        it->buf.data[1] = (uint8_t)(it->count >> 24);
        it->buf.data[2] = (uint8_t)(it->count >> 16);
        it->buf.data[3] = (uint8_t)(it->count >> 8);
        it->buf.data[4] = (uint8_t)it->count;
        reply->items = (ProtoRaw){ it->buf.data, (uint32_t)it->buf.len, it->count };
        proto_set(reply, PF_ITEMS);
}

static void reply_items(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, Items *it, ProtoMsg *reply)
{
        if (it->failed) {
                registry_peer_mark_lost(p);
        } else {
                reply->reply = m->id;
                reply->status = PROTO_STATUS_OK;
                reply->has |= PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS);
                items_finish(it, reply);
                outbox_send(ctx->out, p, reply, -1);
        }
        proto_buf_free(&it->buf);
}

/* ---- who sees what ---- */

static bool may(const RequestCtx *ctx, const RegPeer *p, PolicyAction action, const char *name)
{
        const PeerCreds *c = registry_peer_creds(p);
        return policy_allows(ctx->policy, c->uid, c->gid, action, name);
}

/* A buffer is listed to a peer that may attach it or manage it as an administrator, and to peers of
 * its producer's uid (who may retire or free it once the producer is gone, and must find it). */
static bool sees_buffer(const RequestCtx *ctx, const RegPeer *p, const char *name, uint32_t owner_uid)
{
        return registry_peer_creds(p)->uid == owner_uid || may(ctx, p, POLICY_ATTACH, name) ||
               may(ctx, p, POLICY_ADMIN, name);
}

/* Other uids' connections (pid, uid, label, GPUs) are shown to administrators of every name, and to
 * everyone when no policy file is loaded: then every peer may attach every name anyway, and the
 * socket's mode and group are the only gate. A peer always sees the connections of its own uid. */
static bool sees_peer(const RequestCtx *ctx, const RegPeer *p, const RegPeer *other)
{
        return !ctx->policy || registry_peer_creds(other)->uid == registry_peer_creds(p)->uid ||
               may(ctx, p, POLICY_ADMIN, "");
}

static uint32_t page_size(const ProtoMsg *m)
{
        if (!proto_has(m, PF_LIMIT) || m->limit == 0)
                return DEFAULT_PAGE;
        return m->limit > PROTO_MAX_ITEMS ? PROTO_MAX_ITEMS : (uint32_t)m->limit;
}

void inspect_list(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        uint32_t max = page_size(m);
        ProtoMsg reply = { 0 }, rec;
        uint64_t last = m->after;
        Items it;

        if (proto_has(m, PF_PREFIX) && !registry_prefix_valid(m->prefix.ptr, m->prefix.len)) {
                request_reply_error(ctx->out, p, m->id, PROTO_STATUS_INVALID, "not a valid name prefix");
                return;
        }
        items_init(&it);
        for (RegBuffer *b = registry_buffer_after(ctx->reg, m->after); b; b = registry_buffer_next(ctx->reg, b)) {
                const char *name = registry_buffer_name(b);

                if (m->prefix.len && strncmp(name, m->prefix.ptr, m->prefix.len) != 0)
                        continue;
                registry_buffer_describe(b, &rec);
                if (!sees_buffer(ctx, p, name, (uint32_t)rec.uid))
                        continue;
                /* Listings show what a buffer is, not how to open it. */
                rec.has &= ~PROTO_BIT(PF_HANDLE);
                if (!items_add(&it, &rec, max))
                        break;
                last = registry_buffer_cursor(b);
        }
        reply.more = it.full;
        reply.after = last;
        reply.has = PROTO_BIT(PF_MORE) | PROTO_BIT(PF_AFTER);
        reply_items(ctx, p, m, &it, &reply);
}

/* A holder as stat lists it; collected first, since the registry keeps holders in attach order
 * and pages go by peer id. */
typedef struct Holder {
        uint64_t peer;
        uint32_t pid, uid, refs;
} Holder;

typedef struct Holders {
        const RequestCtx *ctx;
        const RegPeer *asker;
        uint64_t after;
        Holder *v;
        size_t n, cap;
} Holders;

static void collect_holder(const RegPeer *peer, uint32_t refs, void *ud)
{
        Holders *hs = ud;
        const PeerCreds *c = registry_peer_creds(peer);

        if (registry_peer_id(peer) <= hs->after || !sees_peer(hs->ctx, hs->asker, peer) || hs->n == hs->cap)
                return;
        hs->v[hs->n++] = (Holder){ registry_peer_id(peer), c->pid, c->uid, refs };
}

static int holder_cmp(const void *a, const void *b)
{
        const Holder *x = a, *y = b;
        return x->peer < y->peer ? -1 : x->peer > y->peer;
}

void inspect_stat(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        char name[PROTO_MAX_NAME + 1];
        Holders hs = { ctx, p, m->after, NULL, 0, 0 };
        uint32_t max = page_size(m);
        uint64_t last = m->after;
        RegBuffer *b = NULL;
        ProtoMsg reply, rec;
        Items it;

        if (proto_has(m, PF_BUFFER)) {
                b = registry_buffer_by_id(ctx->reg, m->buffer);
        } else if (proto_has(m, PF_NAME)) {
                if (!registry_name_valid(m->name.ptr, m->name.len)) {
                        request_reply_error(ctx->out, p, m->id, PROTO_STATUS_INVALID, "not a valid buffer name");
                        return;
                }
                proto_str_copy(m->name, name, sizeof(name));
                b = registry_buffer_by_name(ctx->reg, name);
        } else {
                request_reply_error(ctx->out, p, m->id, PROTO_STATUS_BAD_REQUEST, "stat takes a name or a buffer id");
                return;
        }
        if (b) {
                registry_buffer_describe(b, &reply);
                if (!sees_buffer(ctx, p, registry_buffer_name(b), (uint32_t)reply.uid))
                        b = NULL; /* a buffer the peer may not see does not exist for it */
        }
        if (!b) {
                request_reply_error(ctx->out, p, m->id, PROTO_STATUS_NOT_FOUND, "no such buffer");
                return;
        }
        reply.has &= ~PROTO_BIT(PF_HANDLE);
        /* At most one holder per connection, and connections are bounded: one array for all. */
        hs.cap = reply.holders;
        hs.v = hs.cap ? calloc(hs.cap, sizeof(*hs.v)) : NULL;
        if (hs.cap && !hs.v) {
                registry_peer_mark_lost(p);
                return;
        }
        registry_buffer_holders(b, collect_holder, &hs);
        if (hs.n > 1)
                qsort(hs.v, hs.n, sizeof(*hs.v), holder_cmp);
        items_init(&it);
        for (size_t i = 0; i < hs.n; i++) {
                rec = (ProtoMsg){ .peer = hs.v[i].peer, .pid = hs.v[i].pid, .uid = hs.v[i].uid,
                                  .refs = hs.v[i].refs };
                rec.has = PROTO_BIT(PF_PEER) | PROTO_BIT(PF_PID) | PROTO_BIT(PF_UID) | PROTO_BIT(PF_REFS);
                if (!items_add(&it, &rec, max))
                        break;
                last = rec.peer;
        }
        free(hs.v);
        reply.more = it.full;
        reply.after = last;
        reply.has |= PROTO_BIT(PF_MORE) | PROTO_BIT(PF_AFTER);
        reply_items(ctx, p, m, &it, &reply);
}

void inspect_peers(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        uint32_t max = page_size(m);
        ProtoMsg reply = { 0 }, rec;
        uint64_t last = m->after;
        Items it;

        items_init(&it);
        for (RegPeer *q = registry_peer_first(ctx->reg); q; q = registry_peer_next(ctx->reg, q)) {
                if (registry_peer_id(q) <= m->after || !sees_peer(ctx, p, q))
                        continue;
                registry_peer_describe(q, &rec);
                if (!items_add(&it, &rec, max))
                        break;
                last = rec.peer;
        }
        reply.more = it.full;
        reply.after = last;
        reply.has = PROTO_BIT(PF_MORE) | PROTO_BIT(PF_AFTER);
        reply_items(ctx, p, m, &it, &reply);
}

/* ---- rings ---- */

/* A listing of rings maps at most about this many pages of shared memory per reply (a ring's
 * control page and one page per taken seat: 4 rings of 64 members, or 128 rings of one), and stops
 * after the ring that crosses it (more: true). Mapping, reading and unmapping a page costs about
 * 13 us on a 2-core VM (mmap and munmap dominate), so a page of the listing keeps the broker from
 * everyone else for about 3 ms at most; the rest comes in later requests, between other peers'. */
#define RINGS_PAGE_BUDGET 256

/* A ring is shown to the peers that would see a buffer of its name and its producer's uid. */
static bool sees_ring(const RequestCtx *ctx, const RegPeer *p, const RegRingView *g)
{
        return sees_buffer(ctx, p, g->name, registry_peer_creds(g->owner)->uid);
}

/* The ring's description; the slowest seated member's lag in `lag`. m points into g and v. */
static void ring_describe(const RegRingView *g, const RingView *v, ProtoMsg *m)
{
        const PeerCreds *c = registry_peer_creds(g->owner);
        bool any = false;

        memset(m, 0, sizeof(*m));
        m->name = proto_str(g->name);
        m->kind = g->kind;
        m->size = g->slot_size;
        m->slots = g->n_slots;
        m->members = g->n_members;
        m->mode = g->mode;
        m->timeout_ms = g->lease_ms;
        m->owner = registry_peer_id(g->owner);
        m->uid = c->uid;
        m->pid = c->pid;
        m->taken = g->taken;
        m->has = PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE) | PROTO_BIT(PF_SLOTS) |
                 PROTO_BIT(PF_MEMBERS) | PROTO_BIT(PF_MODE) | PROTO_BIT(PF_TIMEOUT_MS) | PROTO_BIT(PF_OWNER) |
                 PROTO_BIT(PF_UID) | PROTO_BIT(PF_PID) | PROTO_BIT(PF_TAKEN);
        if (g->device) {
                m->device = proto_str(g->device);
                proto_set(m, PF_DEVICE);
        }
        if (!g->complete) {
                m->pending = true; /* still being set up: not joinable yet */
                proto_set(m, PF_PENDING);
        }
        if (!v->reading.ctl_valid) {
                m->reason = proto_str(v->why);
                proto_set(m, PF_REASON);
                return;
        }
        m->head = v->reading.head;
        proto_set(m, PF_HEAD);
        for (uint32_t i = 0; i < g->n_members && i < RING_MAX_MEMBERS; i++) {
                const RingSeatReading *s = &v->reading.seat[i];

                if (g->seats[i].epoch && s->seated) {
                        m->lag = any ? MAX(m->lag, s->lag) : s->lag;
                        any = true;
                }
        }
        if (any)
                proto_set(m, PF_LAG);
}

static ProtoSeat seat_state(const RegRingSeatView *s, const RingSeatReading *r)
{
        if (s->reserved)
                return PROTO_SEAT_WAITING;
        if (!r->seated)
                return PROTO_SEAT_JOINED;
        return r->confirmed ? PROTO_SEAT_SEATED : PROTO_SEAT_UNCONFIRMED;
}

/* Seat i of a ring as a record; its member's identity only for a peer that may see it in peers. */
static void seat_record(const RequestCtx *ctx, const RegPeer *p, const RegRingView *g, const RingView *v, uint32_t i,
                        ProtoMsg *rec)
{
        const RegRingSeatView *s = &g->seats[i];
        const RingSeatReading *r = &v->reading.seat[i];

        memset(rec, 0, sizeof(*rec));
        rec->index = i;
        rec->generation = s->epoch;
        rec->seat = seat_state(s, r);
        rec->has = PROTO_BIT(PF_INDEX) | PROTO_BIT(PF_GENERATION) | PROTO_BIT(PF_SEAT);
        if (s->member && sees_peer(ctx, p, s->member)) {
                const PeerCreds *c = registry_peer_creds(s->member);

                rec->peer = registry_peer_id(s->member);
                rec->pid = c->pid;
                rec->uid = c->uid;
                rec->label = proto_str(registry_peer_label(s->member));
                rec->has |= PROTO_BIT(PF_PEER) | PROTO_BIT(PF_PID) | PROTO_BIT(PF_UID) | PROTO_BIT(PF_LABEL);
        }
        if (v->reading.ctl_valid && r->seated) {
                rec->position = r->position;
                rec->lag = r->lag;
                rec->has |= PROTO_BIT(PF_POSITION) | PROTO_BIT(PF_LAG);
        }
}

void inspect_rings(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        uint32_t max = page_size(m);
        ProtoMsg reply = { 0 }, rec;
        uint64_t last = m->after;
        unsigned pages = 0;
        RegRingView g;
        RingView v;
        Items it;

        if (proto_has(m, PF_PREFIX) && !registry_prefix_valid(m->prefix.ptr, m->prefix.len)) {
                request_reply_error(ctx->out, p, m->id, PROTO_STATUS_INVALID, "not a valid name prefix");
                return;
        }
        items_init(&it);
        for (RegRing *r = registry_ring_after(ctx->reg, m->after); r; r = registry_ring_next(ctx->reg, r)) {
                registry_ring_view(r, &g);
                if (m->prefix.len && strncmp(g.name, m->prefix.ptr, m->prefix.len) != 0)
                        continue;
                if (!sees_ring(ctx, p, &g))
                        continue;
                if (pages >= RINGS_PAGE_BUDGET) {
                        it.full = true;
                        break;
                }
                ringview_read(&g, &v);
                pages += v.pages;
                ring_describe(&g, &v, &rec);
                if (!items_add(&it, &rec, max))
                        break;
                last = registry_ring_cursor(r);
        }
        reply.more = it.full;
        reply.after = last;
        reply.has = PROTO_BIT(PF_MORE) | PROTO_BIT(PF_AFTER);
        reply_items(ctx, p, m, &it, &reply);
}

void inspect_ring_stat(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        char name[PROTO_MAX_NAME + 1];
        ProtoMsg reply, rec;
        RegRingView g;
        RingView v;
        RegRing *r;
        Items it;

        if (!registry_name_valid(m->name.ptr, m->name.len)) {
                request_reply_error(ctx->out, p, m->id, PROTO_STATUS_INVALID, "not a valid ring name");
                return;
        }
        proto_str_copy(m->name, name, sizeof(name));
        r = registry_ring_by_name(ctx->reg, name);
        if (r)
                registry_ring_view(r, &g);
        if (!r || !sees_ring(ctx, p, &g)) {
                char why[PROTO_MAX_NAME + 32];

                snprintf(why, sizeof(why), "no ring named '%s'", name);
                request_reply_error(ctx->out, p, m->id, PROTO_STATUS_NOT_FOUND, why);
                return;
        }
        ringview_read(&g, &v);
        ring_describe(&g, &v, &reply);
        /* At most 64 seats of a few hundred bytes each: they always fit one reply. */
        items_init(&it);
        for (uint32_t i = 0; i < g.n_members && i < RING_MAX_MEMBERS; i++) {
                if (!g.seats[i].epoch)
                        continue;
                seat_record(ctx, p, &g, &v, i, &rec);
                items_add(&it, &rec, PROTO_MAX_ITEMS);
        }
        reply_items(ctx, p, m, &it, &reply);
}

static void add_stat(Items *it, const char *name, uint64_t value)
{
        ProtoMsg rec = { 0 };

        rec.name = proto_str(name);
        rec.value = value;
        rec.has = PROTO_BIT(PF_NAME) | PROTO_BIT(PF_VALUE);
        items_add(it, &rec, PROTO_MAX_ITEMS);
}

/* Replies sent with each error status: records named request_errors_total whose "error" is the
 * status's name, one per status (zeros included, so that the series exist from the start). */
static void add_failed_replies(Items *it, const Outbox *o)
{
        for (unsigned status = 1; status < _PROTO_STATUS_MAX; status++) {
                ProtoMsg rec = { 0 };

                rec.name = proto_str("request_errors_total");
                rec.error = proto_str(proto_status_name(status));
                rec.value = o->failed_replies[status];
                rec.has = PROTO_BIT(PF_NAME) | PROTO_BIT(PF_ERROR) | PROTO_BIT(PF_VALUE);
                items_add(it, &rec, PROTO_MAX_ITEMS);
        }
}

/* A histogram as records: NAME_bucket with "le_us" (the bound) and the cumulative count, for each
 * bound in ascending order, then NAME_count (every observation: the +Inf bucket) and NAME_sum. */
static void add_histogram(Items *it, const char *name, const Histogram *h)
{
        char bucket[64], count[64], sum[64];

        snprintf(bucket, sizeof(bucket), "%s_bucket", name);
        snprintf(count, sizeof(count), "%s_count", name);
        snprintf(sum, sizeof(sum), "%s_sum", name);
        for (size_t i = 0; i < h->n_bounds; i++) {
                ProtoMsg rec = { 0 };

                rec.name = proto_str(bucket);
                rec.le_us = h->bounds_us[i];
                rec.value = histogram_cumulative(h, i);
                rec.has = PROTO_BIT(PF_NAME) | PROTO_BIT(PF_LE_US) | PROTO_BIT(PF_VALUE);
                items_add(it, &rec, PROTO_MAX_ITEMS);
        }
        add_stat(it, count, h->count);
        add_stat(it, sum, h->sum_us);
}

/* Names follow Prometheus conventions (gpuipcctl metrics prefixes them with gpuipc_). */
void inspect_stats(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        const RegCounters *c = registry_counters(ctx->reg);
        const ServerStats *s = ctx->stats;
        ProtoMsg reply = { 0 };
        RegGauges g;
        Items it;

        registry_gauges(ctx->reg, &g);
        items_init(&it);
        add_stat(&it, "peers", g.peers);
        add_stat(&it, "buffers", g.buffers);
        add_stat(&it, "buffers_live", g.live);
        add_stat(&it, "buffers_retired", g.retired);
        add_stat(&it, "buffers_idle", g.idle);
        add_stat(&it, "buffers_orphaned", g.orphaned);
        add_stat(&it, "references", g.refs);
        add_stat(&it, "held_fds", g.fds);
        add_stat(&it, "waits", g.waits);
        add_stat(&it, "subscriptions", g.subs);
        add_stat(&it, "groups", g.groups);
        add_stat(&it, "names", g.names);
        add_stat(&it, "restart_grace", registry_in_grace(ctx->reg));
        add_stat(&it, "buffers_restored", g.restored);
        add_stat(&it, "claims_pending", g.claims_pending);
        add_stat(&it, "rings", g.rings);
        add_stat(&it, "ring_members", g.ring_members);
        add_stat(&it, "open_fds", s->open_fds);
        add_stat(&it, "open_fds_limit", s->open_fds_limit);
        add_stat(&it, "uptime_ms", ctx->now_ms - s->started_ms);
        add_stat(&it, "publishes_total", c->publishes);
        add_stat(&it, "republishes_total", c->republishes);
        add_stat(&it, "attaches_total", c->attaches);
        add_stat(&it, "attaches_cached_total", c->attaches_cached);
        add_stat(&it, "attach_waits_total", c->attach_waits);
        add_stat(&it, "timeouts_total", c->timeouts);
        add_stat(&it, "releases_total", c->releases);
        add_stat(&it, "retires_total", c->retires);
        add_stat(&it, "drains_total", c->drains);
        add_stat(&it, "revokes_total", c->revokes);
        add_stat(&it, "frees_total", c->frees);
        add_stat(&it, "events_total", c->events);
        add_stat(&it, "groups_completed_total", c->groups_completed);
        add_stat(&it, "groups_failed_total", c->groups_failed);
        add_stat(&it, "reclaims_total", c->reclaims);
        add_stat(&it, "reclaims_refused_total", c->reclaims_refused);
        add_stat(&it, "claims_revoked_total", c->claims_revoked);
        add_stat(&it, "connections_total", s->connections_total);
        add_stat(&it, "connections_refused_total", s->connections_refused);
        add_stat(&it, "frames_in_total", s->frames_in);
        add_stat(&it, "frames_out_total", s->frames_out);
        add_stat(&it, "bytes_in_total", s->bytes_in);
        add_stat(&it, "bytes_out_total", s->bytes_out);
        add_stat(&it, "fds_in_total", s->fds_in);
        add_stat(&it, "fds_out_total", s->fds_out);
        add_stat(&it, "protocol_errors_total", s->protocol_errors);
        add_stat(&it, "slow_peers_dropped_total", s->slow_peers_dropped);
        add_stat(&it, "peer_cleanup_us_last", s->peer_cleanup_us_last);
        add_stat(&it, "peer_cleanup_us_max", s->peer_cleanup_us_max);
        add_stat(&it, "peer_cleanup_refs_last", s->peer_cleanup_refs_last);
        add_failed_replies(&it, ctx->out);
        add_histogram(&it, "request_duration_us", &s->request_us);
        add_histogram(&it, "peer_cleanup_duration_us", &s->peer_cleanup_us);
        reply_items(ctx, p, m, &it, &reply);
}
