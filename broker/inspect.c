/* Listing replies. Each carries an "items" array of records; long listings are paged with
 * "after" (an opaque cursor: the position of the last record) and "more", so a reply always fits in
 * one frame. A peer sees only what the policy lets it see (docs/security.md "What listings show").
 *
 * What it must never do: change the registry, show a peer a buffer, peer or ring the policy hides
 * from it (sees_buffer, sees_peer, sees_ring decide, and a hidden buffer is "not found", not
 * "denied"), hand out how to open a buffer (a listing drops the legacy handle), or keep a ring's
 * memory mapped past the request that reads it (ringview.c). */
#include "inspect.h"
#include "reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "clock.h"
#include "macro.h"
#include "ringview.h"
#include "sort.h"

/* Records stop well before the frame limit, leaving room for the reply's own fields. */
#define ITEMS_BUDGET (PROTO_MAX_BODY - 1024)
#define DEFAULT_PAGE 256
/* A page of buffers or peers also ends once building it took this long (looked at every
 * PAGE_CLOCK_EVERY records, so at least that many per page): a listing's frame then costs the broker
 * about what one connection may take of its uid's turn (FAIR_CONN_QUANTUM_NS), and a client pinging
 * next to a loop of listings waits for that, not for 256 records (0.1 to 1 ms on a 2-core VM, where
 * it was the p99 of such clients). The asker pages on with `after`, as for a page cut by `limit`. */
#define PAGE_TIME_NS (50 * 1000)
#define PAGE_CLOCK_EVERY 16
/* The uids whose bytes shared and held stats report, at most: those the policy names, first come
 * (a policy may name thousands; a stats reply holds at most PROTO_MAX_ITEMS records). */
#define STATS_MAX_UIDS 64

/* One more record unless the page has max records already or the reply would outgrow its frame;
 * false once full (the encoding itself is proto's: proto_items_*). */
static bool items_add(ProtoItems *it, const ProtoMsg *rec, uint32_t max)
{
        if (it->count >= max)
                it->full = true;
        return !it->full && proto_items_add(it, rec);
}

/* Whether the page started at start_ns must end here for the time it took (see PAGE_TIME_NS); marks
 * it full (the reply says more) when it must. */
static bool page_out_of_time(ProtoItems *it, uint64_t start_ns)
{
        if (it->count % PAGE_CLOCK_EVERY == 0 && monotonic_ns() - start_ns >= PAGE_TIME_NS)
                it->full = true;
        return it->full;
}

/* Sends a listing's page; every listing ends here, so none can send a page that lost records to a
 * failed allocation. */
static void reply_items(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, ProtoItems *it, ProtoMsg *reply)
{
        if (it->failed) {
                registry_peer_mark_lost(p); /* out of memory: the peer is cut off rather than lied to */
        } else {
                proto_set_reply(reply, m->id);
                proto_set_status(reply, PROTO_STATUS_OK);
                proto_set_items(reply, proto_items_finish(it));
                outbox_send(ctx->out, p, reply, -1);
        }
        proto_items_free(it);
}

/* ---- who sees what ---- */

/* What the policy grants the asker on name, judged on its kernel credentials. */
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

/* The asker's limit, clamped to PROTO_MAX_ITEMS: a client cannot make one request cost the broker
 * (and every other peer waiting behind it) more than one bounded page. */
static uint32_t page_size(const ProtoMsg *m)
{
        if (!proto_has(m, PF_LIMIT) || m->limit == 0)
                return DEFAULT_PAGE;
        return m->limit > PROTO_MAX_ITEMS ? PROTO_MAX_ITEMS : (uint32_t)m->limit;
}

/* list: buffers in registration order from the cursor `after`, so paging is stable while buffers
 * come and go (a buffer registered meanwhile shows up on a later page, none shows twice). */
void inspect_list(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        uint32_t max = page_size(m);
        ProtoMsg reply = { 0 }, rec;
        uint64_t last = m->after, start = monotonic_ns();
        ProtoItems it;

        if (proto_has(m, PF_PREFIX) && !registry_prefix_valid(m->prefix.ptr, m->prefix.len)) {
                reply_error(ctx->out, p, m->id, PROTO_STATUS_INVALID, "not a valid name prefix");
                return;
        }
        proto_items_init(&it, ITEMS_BUDGET);
        for (RegBuffer *b = registry_buffer_after(ctx->reg, m->after); b; b = registry_buffer_next(ctx->reg, b)) {
                const char *name = registry_buffer_name(b);

                if (m->prefix.len && strncmp(name, m->prefix.ptr, m->prefix.len) != 0)
                        continue;
                reply_buffer_describe(b, &rec);
                if (!sees_buffer(ctx, p, name, (uint32_t)rec.uid))
                        continue;
                /* Listings show what a buffer is, not how to open it. */
                proto_unset(&rec, PF_HANDLE);
                if (!items_add(&it, &rec, max))
                        break;
                last = registry_buffer_cursor(b);
                if (page_out_of_time(&it, start))
                        break;
        }
        proto_set_more(&reply, it.full);
        proto_set_after(&reply, last);
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

/* Keeps holders past the cursor whose connection the asker may see (sees_peer); the others are
 * counted in the buffer's holders but not named. */
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
        ProtoItems it;

        if (proto_has(m, PF_BUFFER)) {
                b = registry_buffer_by_id(ctx->reg, m->buffer);
        } else if (proto_has(m, PF_NAME)) {
                if (!registry_name_valid(m->name.ptr, m->name.len)) {
                        reply_error(ctx->out, p, m->id, PROTO_STATUS_INVALID, "not a valid buffer name");
                        return;
                }
                proto_str_copy(m->name, name, sizeof(name));
                b = registry_buffer_by_name(ctx->reg, name);
        } else {
                reply_error(ctx->out, p, m->id, PROTO_STATUS_BAD_REQUEST, "stat takes a name or a buffer id");
                return;
        }
        if (b) {
                reply_buffer_describe(b, &reply);
                if (!sees_buffer(ctx, p, registry_buffer_name(b), (uint32_t)reply.uid))
                        b = NULL; /* a buffer the peer may not see does not exist for it */
        }
        if (!b) {
                reply_error(ctx->out, p, m->id, PROTO_STATUS_NOT_FOUND, "no such buffer");
                return;
        }
        proto_unset(&reply, PF_HANDLE);
        /* At most one holder per connection, and connections are bounded: one array for all. */
        hs.cap = reply.holders;
        hs.v = hs.cap ? calloc(hs.cap, sizeof(*hs.v)) : NULL;
        if (hs.cap && !hs.v) {
                registry_peer_mark_lost(p);
                return;
        }
        registry_buffer_holders(b, collect_holder, &hs);
        if (hs.n > 1)
                sort_array(hs.v, hs.n, sizeof(*hs.v), holder_cmp);
        proto_items_init(&it, ITEMS_BUDGET);
        for (size_t i = 0; i < hs.n; i++) {
                proto_record_init(&rec);
                proto_set_peer(&rec, hs.v[i].peer);
                proto_set_pid(&rec, hs.v[i].pid);
                proto_set_uid(&rec, hs.v[i].uid);
                proto_set_refs(&rec, hs.v[i].refs);
                if (!items_add(&it, &rec, max))
                        break;
                last = rec.peer;
        }
        free(hs.v);
        proto_set_more(&reply, it.full);
        proto_set_after(&reply, last);
        reply_items(ctx, p, m, &it, &reply);
}

void inspect_peers(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        uint32_t max = page_size(m);
        ProtoMsg reply = { 0 }, rec;
        uint64_t last = m->after, start = monotonic_ns();
        ProtoItems it;

        proto_items_init(&it, ITEMS_BUDGET);
        for (RegPeer *q = registry_peer_first(ctx->reg); q; q = registry_peer_next(ctx->reg, q)) {
                if (registry_peer_id(q) <= m->after || !sees_peer(ctx, p, q))
                        continue;
                reply_peer_describe(q, &rec);
                if (!items_add(&it, &rec, max))
                        break;
                last = rec.peer;
                if (page_out_of_time(&it, start))
                        break;
        }
        proto_set_more(&reply, it.full);
        proto_set_after(&reply, last);
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
        uint64_t lag = 0;
        bool any = false;

        proto_record_init(m);
        proto_set_name(m, proto_str(g->name));
        proto_set_kind(m, g->kind);
        proto_set_size(m, g->slot_size);
        proto_set_slots(m, g->n_slots);
        proto_set_members(m, g->n_members);
        proto_set_mode(m, g->mode);
        proto_set_timeout_ms(m, g->lease_ms);
        proto_set_owner(m, registry_peer_id(g->owner));
        proto_set_uid(m, c->uid);
        proto_set_pid(m, c->pid);
        proto_set_taken(m, g->taken);
        if (g->device)
                proto_set_device(m, proto_str(g->device));
        if (!g->complete)
                proto_set_pending(m, true); /* still being set up: not joinable yet */
        if (!v->reading.ctl_valid) {
                proto_set_reason(m, proto_str(v->why));
                return;
        }
        proto_set_head(m, v->reading.head);
        for (uint32_t i = 0; i < g->n_members && i < RING_MAX_MEMBERS; i++) {
                const RingSeatReading *s = &v->reading.seat[i];

                if (g->seats[i].epoch && s->seated) {
                        lag = any ? MAX(lag, s->lag) : s->lag;
                        any = true;
                }
        }
        if (any)
                proto_set_lag(m, lag);
}

/* The registry's view of a seat (reserved for a member coming back) first, then what the member
 * wrote on its page: a joined member that has not seated itself yet is not lagging, only starting. */
static ProtoSeat seat_state(const RegRingSeatView *s, const RingSeatReading *r)
{
        if (s->reserved)
                return PROTO_SEAT_WAITING;
        if (!r->seated)
                return PROTO_SEAT_JOINED;
        return r->confirmed ? PROTO_SEAT_SEATED : PROTO_SEAT_UNCONFIRMED;
}

/* Reads the ring's pages and counts the frames its members took since the last reading. */
static void ring_read_pages(RequestCtx *ctx, RegRing *r, const RegRingView *g, RingView *v)
{
        ringview_read(g, v);
        if (!v->reading.ctl_valid)
                return;
        for (uint32_t i = 0; i < g->n_members && i < RING_MAX_MEMBERS; i++)
                if (v->reading.seat[i].confirmed)
                        registry_ring_note_taken(ctx->reg, r, i, g->seats[i].epoch, v->reading.seat[i].taken);
}

/* Seat i of a ring as a record; its member's identity only for a peer that may see it in peers. */
static void seat_record(const RequestCtx *ctx, const RegPeer *p, const RegRingView *g, const RingView *v, uint32_t i,
                        ProtoMsg *rec)
{
        const RegRingSeatView *s = &g->seats[i];
        const RingSeatReading *r = &v->reading.seat[i];

        proto_record_init(rec);
        proto_set_index(rec, i);
        proto_set_generation(rec, s->epoch);
        proto_set_seat(rec, seat_state(s, r));
        if (s->member && sees_peer(ctx, p, s->member)) {
                const PeerCreds *c = registry_peer_creds(s->member);

                proto_set_peer(rec, registry_peer_id(s->member));
                proto_set_pid(rec, c->pid);
                proto_set_uid(rec, c->uid);
                proto_set_label(rec, proto_str(registry_peer_label(s->member)));
        }
        if (v->reading.ctl_valid && r->seated) {
                proto_set_position(rec, r->position);
                proto_set_lag(rec, r->lag);
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
        ProtoItems it;

        if (proto_has(m, PF_PREFIX) && !registry_prefix_valid(m->prefix.ptr, m->prefix.len)) {
                reply_error(ctx->out, p, m->id, PROTO_STATUS_INVALID, "not a valid name prefix");
                return;
        }
        proto_items_init(&it, ITEMS_BUDGET);
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
                ring_read_pages(ctx, r, &g, &v);
                pages += v.pages;
                ring_describe(&g, &v, &rec);
                if (!items_add(&it, &rec, max))
                        break;
                last = registry_ring_cursor(r);
        }
        proto_set_more(&reply, it.full);
        proto_set_after(&reply, last);
        reply_items(ctx, p, m, &it, &reply);
}

void inspect_ring_stat(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        char name[PROTO_MAX_NAME + 1];
        ProtoMsg reply, rec;
        RegRingView g;
        RingView v;
        RegRing *r;
        ProtoItems it;

        if (!registry_name_valid(m->name.ptr, m->name.len)) {
                reply_error(ctx->out, p, m->id, PROTO_STATUS_INVALID, "not a valid ring name");
                return;
        }
        proto_str_copy(m->name, name, sizeof(name));
        r = registry_ring_by_name(ctx->reg, name);
        if (r)
                registry_ring_view(r, &g);
        if (!r || !sees_ring(ctx, p, &g)) {
                char why[PROTO_MAX_NAME + 32];

                snprintf(why, sizeof(why), "no ring named '%s'", name);
                reply_error(ctx->out, p, m->id, PROTO_STATUS_NOT_FOUND, why);
                return;
        }
        ring_read_pages(ctx, r, &g, &v);
        ring_describe(&g, &v, &reply);
        /* At most 64 seats of a few hundred bytes each: they always fit one reply. */
        proto_items_init(&it, ITEMS_BUDGET);
        for (uint32_t i = 0; i < g.n_members && i < RING_MAX_MEMBERS; i++) {
                if (!g.seats[i].epoch)
                        continue;
                seat_record(ctx, p, &g, &v, i, &rec);
                items_add(&it, &rec, PROTO_MAX_ITEMS);
        }
        reply_items(ctx, p, m, &it, &reply);
}

static void add_stat(ProtoItems *it, const char *name, uint64_t value)
{
        ProtoMsg rec;

        proto_record_init(&rec);
        proto_set_name(&rec, proto_str(name));
        proto_set_value(&rec, value);
        items_add(it, &rec, PROTO_MAX_ITEMS);
}

/* Replies sent with each error status: records named request_errors_total whose "error" is the
 * status's name, one per status (zeros included, so that the series exist from the start). */
static void add_failed_replies(ProtoItems *it, const Outbox *o)
{
        for (unsigned status = 1; status < _PROTO_STATUS_MAX; status++) {
                ProtoMsg rec;

                proto_record_init(&rec);
                proto_set_name(&rec, proto_str("request_errors_total"));
                proto_set_error(&rec, proto_str(proto_status_name(status)));
                proto_set_value(&rec, o->failed_replies[status]);
                items_add(it, &rec, PROTO_MAX_ITEMS);
        }
}

/* A histogram as records: NAME_bucket with "le_us" (the bound) and the cumulative count, for each
 * bound in ascending order, then NAME_count (every observation: the +Inf bucket) and NAME_sum. */
static void add_histogram(ProtoItems *it, const char *name, const Histogram *h)
{
        char bucket[64], count[64], sum[64];

        snprintf(bucket, sizeof(bucket), "%s_bucket", name);
        snprintf(count, sizeof(count), "%s_count", name);
        snprintf(sum, sizeof(sum), "%s_sum", name);
        for (size_t i = 0; i < h->n_bounds; i++) {
                ProtoMsg rec;

                proto_record_init(&rec);
                proto_set_name(&rec, proto_str(bucket));
                proto_set_le_us(&rec, h->bounds_us[i]);
                proto_set_value(&rec, histogram_cumulative(h, i));
                items_add(it, &rec, PROTO_MAX_ITEMS);
        }
        add_stat(it, count, h->count);
        add_stat(it, sum, h->sum_us);
}

/* A series record told apart by its kind or its uid (stats of bytes shared and held). */
static void add_kind_stat(ProtoItems *it, const char *name, ProtoKind kind, uint64_t value)
{
        ProtoMsg rec;

        proto_record_init(&rec);
        proto_set_name(&rec, proto_str(name));
        proto_set_kind(&rec, kind);
        proto_set_value(&rec, value);
        items_add(it, &rec, PROTO_MAX_ITEMS);
}

static void add_uid_stat(ProtoItems *it, const char *name, uint32_t uid, uint64_t value)
{
        ProtoMsg rec;

        proto_record_init(&rec);
        proto_set_name(&rec, proto_str(name));
        proto_set_uid(&rec, uid);
        proto_set_value(&rec, value);
        items_add(it, &rec, PROTO_MAX_ITEMS);
}

/* Bytes shared and held: by kind (every kind, zeros included, so that the series exist from the
 * start), then for each uid the policy names (at most STATS_MAX_UIDS of them). */
static void add_bytes(ProtoItems *it, const RequestCtx *ctx, const RegGauges *g)
{
        uint32_t uids[STATS_MAX_UIDS];
        size_t n = policy_named_uids(ctx->policy, uids, STATS_MAX_UIDS);

        for (ProtoKind k = PROTO_KIND_NONE + 1; k < _PROTO_KIND_MAX; k++)
                add_kind_stat(it, "shared_bytes", k, g->shared_bytes[k]);
        for (ProtoKind k = PROTO_KIND_NONE + 1; k < _PROTO_KIND_MAX; k++)
                add_kind_stat(it, "held_bytes", k, g->held_bytes[k]);
        /* A series' records next to each other, as readers expect (docs/protocol.md). */
        for (size_t i = 0; i < n; i++) {
                uint64_t shared, held;

                registry_uid_bytes(ctx->reg, uids[i], &shared, &held);
                add_uid_stat(it, "uid_shared_bytes", uids[i], shared);
        }
        for (size_t i = 0; i < n; i++) {
                uint64_t shared, held;

                registry_uid_bytes(ctx->reg, uids[i], &shared, &held);
                add_uid_stat(it, "uid_held_bytes", uids[i], held);
        }
}

/* Names follow Prometheus conventions (gpuipcctl metrics prefixes them with gpuipc_). */
void inspect_stats(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        const RegCounters *c = registry_counters(ctx->reg);
        const ServerStats *s = ctx->stats;
        ProtoMsg reply = { 0 };
        RegGauges g;
        ProtoItems it;

        registry_gauges(ctx->reg, &g);
        proto_items_init(&it, ITEMS_BUDGET);
        add_stat(&it, "peers", g.peers);
        add_stat(&it, "buffers", g.buffers);
        add_stat(&it, "buffers_live", g.live);
        add_stat(&it, "buffers_retired", g.retired);
        add_stat(&it, "buffers_idle", g.idle);
        add_stat(&it, "buffers_orphaned", g.orphaned);
        add_stat(&it, "broker_held_bytes", g.held_memory);
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
        add_stat(&it, "ring_frames_taken_total", c->ring_frames_taken);
        add_stat(&it, "connections_total", s->connections_total);
        add_stat(&it, "connections_refused_total", s->connections_refused);
        add_stat(&it, "frames_in_total", s->frames_in);
        add_stat(&it, "frames_out_total", s->frames_out);
        add_stat(&it, "bytes_in_total", s->bytes_in);
        add_stat(&it, "bytes_out_total", s->bytes_out);
        add_stat(&it, "fds_in_total", s->fds_in);
        add_stat(&it, "fds_out_total", s->fds_out);
        add_stat(&it, "protocol_errors_total", s->protocol_errors);
        add_stat(&it, "seccomp_refused_total", s->seccomp_refused);
        add_stat(&it, "slow_peers_dropped_total", s->slow_peers_dropped);
        add_stat(&it, "audit_suppressed_total", audit_suppressed_total());
        add_stat(&it, "peer_cleanup_us_last", s->peer_cleanup_us_last);
        add_stat(&it, "peer_cleanup_us_max", s->peer_cleanup_us_max);
        add_stat(&it, "peer_cleanup_refs_last", s->peer_cleanup_refs_last);
        if (s->budget) {
                add_stat(&it, "memory_budget_bytes", s->budget->limit);
                add_stat(&it, "memory_uid_share_bytes", s->budget->uid_share);
                add_stat(&it, "memory_held_bytes", s->budget->used[BUDGET_HELD]);
                add_stat(&it, "memory_output_bytes", s->budget->used[BUDGET_OUTPUT]);
                add_stat(&it, "memory_peak_bytes", s->budget->peak);
                add_stat(&it, "memory_refused_total", s->budget->refused);
        }
        if (s->fair) {
                add_stat(&it, "cpu_limit_millicpus", s->fair->cfg.cpu_limit_milli);
                add_stat(&it, "frames_paced_total", s->fair->paced_total);
                add_stat(&it, "turns_skipped_total", s->fair->turns_skipped_total);
        }
        add_bytes(&it, ctx, &g);
        add_failed_replies(&it, ctx->out);
        add_histogram(&it, "request_duration_us", &s->request_us);
        add_histogram(&it, "peer_cleanup_duration_us", &s->peer_cleanup_us);
        reply_items(ctx, p, m, &it, &reply);
}
