/* The registry's top layer: publishing (new memory, views, an idle buffer again, restored buffers),
 * the operations of producers and holders on a buffer (release, unmap, retire, free), and the
 * registry's creation and end. It calls the parts below it: waits (a publish wakes the attaches that
 * wait for its name), claims (a publish takes over pending claims), peers (the end removes them) and
 * the core; none of them calls back. See registry.h for the contract; docs/protocol.md for what each
 * reply and event means.
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
#include "registry-waits.h"

static bool may_manage(const RegBuffer *b, const RegPeer *p)
{
        return b->owner ? b->owner == p : b->owner_uid == p->creds.uid;
}

/* The publish in progress succeeded: its reply carries b's id, generation and state. */
static void reply_published(RegSink *o, RegPeer *p, const RegBuffer *b)
{
        reg_succeed(o, reg_asker(p), (RegChange){ .reply = REG_RE_PUBLISHED, .buffer = b });
}

/* Puts b under its name and tells whoever waits or listens. A new publication gets a new
 * generation; a restored one keeps the generation its consumers know it by. */
static void publish_under_name(Registry *r, RegPeer *p, RegBuffer *b, RegName *e, bool restored, RegSink *o)
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
        reply_published(o, p, b);
        reg_claims_adopt(r, b, o);
        reg_notify_subscribers(r, PROTO_EV_PUBLISHED, b, (RegWhy){ REG_WHY_NONE }, o);
        /* Adopted claims counted as attaches may have used retire_after up; e may go with it. */
        if (reg_attaches_used_up(b)) {
                reg_buffer_retire(r, b, o);
                return;
        }
        reg_waiters_wake(r, e, o);
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

/* Checks the name is free for p: 0, or a code with why. */
static int publish_check_name(Registry *r, RegPeer *p, const char *name, const RegBuffer *self, RegWhy *why)
{
        const RegBuffer *live = name_blocker(r, p, name, self);

        if (!live)
                return 0;
        if (!live->owner)
                return reg_fail(why, (RegWhy){ REG_E_NAME_ORPHANED,
                                               .name_orphaned = { .name = name, .uid = live->owner_uid,
                                                                  .buffer = live->id } });
        return reg_fail(why, (RegWhy){ REG_E_NAME_TAKEN,
                                       .name_taken = { .name = name,
                                                       .owner = { live->owner_id, live->owner_pid,
                                                                  live->owner_uid } } });
}

/* Publishes p's idle buffer a->buffer again, under a->name. */
static int republish(Registry *r, RegPeer *p, RegPublish *a, RegWhy *why, RegSink *out)
{
        uint64_t cost;
        RegBuffer *b;
        char *name;
        RegName *e;
        int err;

        err = registry_request_buffer(r, a->buffer, &b, why);
        if (err != 0)
                return err;
        if (b->owner != p)
                return reg_fail(why, (RegWhy){ REG_E_OTHERS_BUFFER, .others_buffer = { a->buffer } });
        if (b->state != PROTO_STATE_IDLE)
                return reg_fail(why, (RegWhy){ REG_E_NOT_IDLE, .not_idle = { a->buffer, b->state } });
        err = publish_check_name(r, p, a->name, b, why);
        if (err != 0)
                return err;
        /* Another name or other metadata may cost more (or less) than the old. */
        cost = reg_buffer_cost(a->name, b->device, b->handle, a->has_meta ? a->meta_len : b->meta_len);
        err = cost > b->cost ? reg_charge(r, b->owner_uid, cost - b->cost, why) : 0;
        if (err != 0)
                return err;
        e = reg_name_get(r, a->name);
        name = strdup(a->name);
        if (!e || !name || (a->has_meta && reg_buffer_set_meta(b, a->meta, a->meta_len) < 0)) {
                free(name);
                reg_name_put(r, e);
                if (cost > b->cost)
                        reg_uncharge(r, b->owner_uid, cost - b->cost);
                return -ENOMEM;
        }
        if (cost < b->cost)
                reg_uncharge(r, b->owner_uid, b->cost - cost);
        b->cost = cost;
        free(b->name);
        b->name = name;
        b->retire_after = a->retire_after;
        b->free_on_drain = false;
        r->counters.republishes++;
        publish_under_name(r, p, b, e, false, out);
        return 0;
}

/* A producer that lost its connection to this broker instance registers a broker-held buffer of its
 * own again, which the broker kept as an orphan: it becomes the owner once more, and the broker
 * keeps the memory (and holds) it already has. True once the publish succeeded so. */
static bool adopt_orphan(Registry *r, RegPeer *p, const RegPublish *a, RegSink *out)
{
        RegBuffer *b = a->buffer ? reg_buffer_lookup(r, a->buffer) : NULL;

        if (!b || b->owner || b->owner_uid != p->creds.uid || !a->restored || b->generation != a->generation)
                return false;
        reg_buffer_set_owner(b, p);
        b->free_on_drain = false;
        list_append(&p->owned, &b->owner_link);
        r->n_orphaned--;
        reply_published(out, p, b);
        return true;
}

/* Whether the id a publish of new memory chose is free: 0, or REG_E_KEY_TAKEN with why. An orphan
 * its producer comes back for is adopted first (adopt_orphan). */
static int check_new_id(const Registry *r, const RegPublish *a, RegWhy *why)
{
        const RegBuffer *b = a->buffer ? reg_buffer_lookup(r, a->buffer) : NULL;

        if (!b)
                return 0;
        return reg_fail(why, (RegWhy){ REG_E_KEY_TAKEN,
                                       .key_taken = { a->buffer, .owner = { .peer = b->owner_id,
                                                                            .uid = b->owner_uid } } });
}

/* A restored buffer that was retired, or whose name another producer took while this one was away,
 * is registered without a name: its holders may reclaim it, and it drains when they are done. */
static void register_retired(Registry *r, RegPeer *p, RegBuffer *b, RegSink *out)
{
        reg_buffer_set_state(r, b, PROTO_STATE_RETIRED);
        reply_published(out, p, b);
        reg_claims_adopt(r, b, out);
        reg_buffer_drain_if_done(r, b, (RegWhy){ REG_R_RESTORED_UNHELD }, out);
}

/* The segment a view is published in: registered already (then an fd that came along is closed:
 * the segment's memory travels once), or registered now with the fd. Its producer's, and neither a
 * view nor a ring part. 0 with *ret, a code with why, or -ENOMEM. */
static int view_segment(Registry *r, RegPeer *p, const RegPublish *a, int *fd, RegBuffer **ret, RegWhy *why,
                        RegSink *out)
{
        RegBuffer *s = reg_buffer_lookup(r, a->info.segment);
        uint64_t size = s ? s->info.size : a->segment_size;
        RegPublish seg;
        int e;

        if (s && !s->owner && s->owner_uid == p->creds.uid && a->restored) {
                /* Broker-held and orphaned while its producer was away: it comes back with a view. */
                reg_buffer_set_owner(s, p);
                s->free_on_drain = false;
                list_append(&p->owned, &s->owner_link);
                r->n_orphaned--;
        }
        if (s && s->owner != p)
                return reg_fail(why, (RegWhy){ REG_E_OTHERS_SEGMENT, .others_segment = { s->id } });
        if (s && (s->segment || s->ring_part || s->info.kind != a->info.kind))
                return reg_fail(why, (RegWhy){ REG_E_NOT_A_SEGMENT,
                                               .not_a_segment = { s->id, s->segment     ? REG_SEGMENT_IS_VIEW
                                                                         : s->ring_part ? REG_SEGMENT_IS_RING_PART
                                                                                        : REG_SEGMENT_OTHER_KIND } });
        if (s && s->free_on_drain)
                return reg_fail(why, (RegWhy){ REG_E_SEGMENT_FREED, .segment_freed = { s->id } });
        if (!s && *fd < 0)
                return reg_fail(why, (RegWhy){ REG_E_NO_SEGMENT, .no_segment = { a->info.segment } });
        if (a->info.offset > size || a->info.size > size - a->info.offset)
                return reg_fail(why, (RegWhy){ REG_E_VIEW_OUTSIDE,
                                               .view_outside = { a->info.offset, a->info.size, size } });
        if (s) {
                if (*fd >= 0)
                        reg_close_fd(out, steal_fd(*fd));
                *ret = s;
                return 0;
        }
        /* No buffer has the segment's id (looked up above): it is registered as new memory. */
        seg = (RegPublish){ .name = "", .buffer = a->info.segment, .device = a->device, .fd = -1,
                            .info = { .kind = a->info.kind, .size = a->segment_size, .writable = a->info.writable,
                                      .broker_held = a->info.broker_held } };
        e = reg_buffer_register(r, p, &seg, fd, &s, why);
        if (e != 0)
                return e;
        reg_buffer_set_state(r, s, PROTO_STATE_IDLE); /* registered, under no name */
        *ret = s;
        return 0;
}

/* Registers and publishes a view: a range of a segment's memory under a name of its own. */
static int publish_view(Registry *r, RegPeer *p, RegPublish *a, int *fd, RegWhy *why, RegSink *out)
{
        RegBuffer *s, *v;
        RegPublish va;
        int none = -1, e;
        RegName *n;

        if (!a->restored) {
                e = publish_check_name(r, p, a->name, NULL, why);
                if (e != 0)
                        return e;
        }
        e = view_segment(r, p, a, fd, &s, why, out);
        if (e != 0)
                return e;
        /* What the memory is, the segment says; a view only names its range. */
        va = *a;
        va.info.kind = s->info.kind;
        va.info.writable = s->info.writable;
        va.info.broker_held = s->info.broker_held;
        va.device = s->device;
        n = reg_name_get(r, a->name);
        if (!n)
                return -ENOMEM;
        if (adopt_orphan(r, p, &va, out)) {
                reg_name_put(r, n);
                return 0;
        }
        e = check_new_id(r, &va, why);
        if (e == 0)
                e = reg_buffer_register(r, p, &va, &none, &v, why);
        if (e != 0) {
                reg_name_put(r, n);
                return e;
        }
        v->segment = s;
        list_append(&s->views, &v->view_link);
        s->n_views++;
        if (a->restored && (a->retired || name_blocker(r, p, a->name, NULL))) {
                reg_name_put(r, n);
                register_retired(r, p, v, out);
                return 0;
        }
        publish_under_name(r, p, v, n, a->restored, out);
        return 0;
}

int registry_publish(Registry *r, RegPeer *p, RegPublish *a, RegWhy *why, RegSink *out)
{
        _cleanup_close_ int fd = steal_fd(a->fd);
        RegBuffer *b;
        RegName *n;
        int e;

        if (a->again)
                return republish(r, p, a, why, out);
        if (a->restored && (a->generation == 0 || a->generation > r->generation))
                return reg_fail(why, (RegWhy){ REG_E_RESTORED_GENERATION, .restored_generation = { r->generation } });
        if (a->info.segment)
                return publish_view(r, p, a, &fd, why, out);
        /* A restored buffer never fails for its name: if another producer took it meanwhile, the
         * restored one is registered retired, so that its holders can still come back. */
        if (!a->restored) {
                e = publish_check_name(r, p, a->name, NULL, why);
                if (e != 0)
                        return e;
        }
        n = reg_name_get(r, a->name);
        if (!n)
                return -ENOMEM;
        if (adopt_orphan(r, p, a, out)) {
                reg_name_put(r, n);
                return 0;
        }
        e = check_new_id(r, a, why);
        if (e == 0)
                e = reg_buffer_register(r, p, a, &fd, &b, why);
        if (e != 0) {
                reg_name_put(r, n);
                return e;
        }
        if (a->restored && (a->retired || name_blocker(r, p, a->name, NULL))) {
                reg_name_put(r, n);
                register_retired(r, p, b, out);
                return 0;
        }
        publish_under_name(r, p, b, n, a->restored, out);
        return 0;
}

int registry_release(Registry *r, RegPeer *p, uint64_t buffer, RegWhy *why, RegSink *out)
{
        RegBuffer *b = reg_buffer_lookup(r, buffer);
        Hold *h = b ? reg_hold_lookup(r, p, b) : NULL;

        if ((!h || h->count == 0) && reg_claim_release(r, p, buffer)) {
                /* A reference reclaimed while its producer is still away: the claim shrinks. */
                r->counters.releases++;
                reg_done(out, p);
                return 0;
        }
        if (!h || h->count == 0)
                return reg_fail(why, (RegWhy){ REG_E_NOT_ATTACHED, .not_attached = { buffer } });
        h->count--;
        b->refs--;
        p->n_refs--;
        r->n_refs--;
        if (h->count == 0) {
                reg_holder_count(r, h, -1);
                if (!h->mapped)
                        reg_hold_drop(r, h);
        }
        r->counters.releases++;
        reg_done(out, p);
        reg_buffer_drain_if_done(r, b, (RegWhy){ REG_WHY_NONE }, out);
        return 0;
}

int registry_unmap(Registry *r, RegPeer *p, uint64_t buffer, RegWhy *why, RegSink *out)
{
        RegBuffer *b = reg_buffer_lookup(r, buffer);
        Hold *h = b ? reg_hold_lookup(r, p, b) : NULL;

        /* Unknown or never mapped: nothing to forget, and nothing wrong either (the buffer may
         * have been freed while the request travelled). */
        if (h) {
                h->mapped = false;
                if (h->count == 0)
                        reg_hold_drop(r, h);
        }
        reg_done(out, p);
        return 0;
}

/* Retire and free are for whoever may manage b (may_manage) or an admin: 0, or a code with why. */
static int managing(const RegPeer *p, const RegBuffer *b, bool as_admin, RegWhy *why)
{
        if (as_admin || may_manage(b, p))
                return 0;
        return reg_fail(why, (RegWhy){ REG_E_NOT_OWNER,
                                       .not_owner = { .buffer = b->id, .name = b->name,
                                                      .owner = { .peer = b->owner_id, .uid = b->owner_uid } } });
}

int registry_buffer_retire(Registry *r, RegPeer *p, RegBuffer *b, bool as_admin, RegWhy *why, RegSink *out)
{
        int e = managing(p, b, as_admin, why);

        if (e != 0)
                return e;
        /* Retiring twice is harmless: the drained event comes once. */
        reg_done(out, p);
        reg_buffer_retire(r, b, out);
        return 0;
}

int registry_buffer_free(Registry *r, RegPeer *p, RegBuffer *b, bool as_admin, RegWhy *why, RegSink *out)
{
        int e = managing(p, b, as_admin, why);

        if (e != 0)
                return e;
        reg_done(out, p);
        if (b->state == PROTO_STATE_IDLE) {
                /* A segment goes once its views went (reg_segment_release_if_done). */
                if (b->n_views)
                        b->free_on_drain = true;
                else
                        reg_buffer_destroy(r, b, out);
                return 0;
        }
        /* Still referenced: forget it once drained; the producer still gets its drained event. */
        b->free_on_drain = true;
        reg_buffer_retire(r, b, out);
        return 0;
}

int registry_retire(Registry *r, RegPeer *p, uint64_t buffer, bool as_admin, RegWhy *why, RegSink *out)
{
        RegBuffer *b;
        int e = registry_request_buffer(r, buffer, &b, why);

        return e ? e : registry_buffer_retire(r, p, b, as_admin, why, out);
}

int registry_free_buffer(Registry *r, RegPeer *p, uint64_t buffer, bool as_admin, RegWhy *why, RegSink *out)
{
        RegBuffer *b;
        int e = registry_request_buffer(r, buffer, &b, why);

        return e ? e : registry_buffer_free(r, p, b, as_admin, why, out);
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
