/* Attaching and waiting, wholly: attach (by id or by name, at once or waiting for a publish),
 * rendezvous groups, and every deadline (the waits', the groups' and the restart grace's). Only the
 * requests that wait keep their request id, in their Wait, and are answered here when the wait ends.
 * A wait ends once (a publish or its group's completion, its deadline, its peer leaving, the broker
 * stopping) and must then be gone from its name's list and the timer heap alike (reg_wait_free).
 * Layer: calls rings (which parts a peer may attach; the grace's end), claims (the grace's end) and
 * the core; called by peers and registry.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry-claims.h"
#include "registry-core.h"
#include "registry-rings-core.h"
#include "registry-waits.h"

/* A wait by name holds a reference on the name's entry, which keeps the name known while someone
 * waits for it; it is given back here with the wait's timer and its charge. */
void reg_wait_free(Registry *r, Wait *w)
{
        if (w->name) {
                list_unlink(&w->link);
                heap_remove(&r->timers, &w->timer.node);
                reg_name_put(r, w->name);
        }
        list_unlink(&w->peer_link);
        w->peer->n_waits--;
        r->n_waits--;
        reg_uncharge(r, w->peer->creds.uid, w->cost);
        free(w);
}

static RegGroup *group_lookup(const Registry *r, const char *name)
{
        return HMAP_FIND(&r->groups, hash_str(name), RegGroup, node, g, strcmp(g->name, name) == 0);
}

void reg_group_free(Registry *r, RegGroup *g)
{
        heap_remove(&r->timers, &g->timer.node);
        hmap_remove(&r->groups, &g->node);
        r->n_groups--;
        free(g);
}

void reg_join_free(Registry *r, Wait *w)
{
        list_unlink(&w->link);
        w->group->joined--;
        reg_wait_free(r, w);
}

/* A group's one timer is its earliest member's deadline: the group fails for everyone when the
 * most impatient member gives up, so a member that left takes its deadline with it (rearm). */
int reg_group_rearm(Registry *r, RegGroup *g)
{
        uint64_t earliest = UINT64_MAX;

        list_for_each(pos, &g->joins)
                earliest = MIN(earliest, list_entry(pos, Wait, link)->deadline);
        heap_remove(&r->timers, &g->timer.node);
        if (earliest == UINT64_MAX)
                return 0;
        return heap_push(&r->timers, &g->timer.node, earliest);
}

/* Whether p still has b mapped from an earlier attach: then the reply says "cached" and sends no
 * fd, which saves the consumer a second mapping of the same memory. */
static bool hold_mapped(const Registry *r, const RegPeer *p, const RegBuffer *b)
{
        const Hold *h = reg_hold_lookup(r, p, b);
        return h && h->mapped;
}

/* Takes a reference for a's peer on live buffer b and says so to a, before any event the attach
 * causes (retire_after used up retires b right after). 0, a code with why, or -ENOMEM. */
static int attach_now(Registry *r, RegAsker a, RegBuffer *b, RegWhy *why, RegSink *o)
{
        RegPeer *p = a.peer;
        bool cached;
        int e;

        e = reg_attach_diagnose(b, p, why);
        if (e == 0)
                e = reg_ring_attach_check(b, p, why);
        if (e != 0)
                return e;
        if (p->n_refs + p->n_claim_refs >= r->limits.refs_per_peer)
                return reg_fail(why, (RegWhy){ REG_E_REFS_FULL, .refs_full = { p->n_refs + p->n_claim_refs } });
        /* The fd travels once per peer: afterwards the peer's cached mapping serves, until it says
         * unmap. A legacy handle has no fd and is always in the reply itself. */
        cached = hold_mapped(r, p, reg_memory_of(b));
        e = reg_hold_add(r, p, b, 1, reg_memory_of(b)->fd >= 0, why);
        if (e != 0)
                return e;
        b->attaches++;
        r->counters.attaches++;
        if (cached)
                r->counters.attaches_cached++;
        reg_succeed(o, a, (RegChange){ .reply = REG_RE_ATTACHED, .buffer = b, .flag = cached });
        if (b->retire_after && b->attaches >= b->retire_after)
                reg_buffer_retire(r, b, o);
        return 0;
}

/* Hands a newly published buffer to everyone waiting for its name, oldest first, for as long as
 * it stays published (retire_after may retire it half-way). */
void reg_waiters_wake(Registry *r, RegName *e, RegSink *o)
{
        RegBuffer *b = e->live;

        /* b stays valid throughout (each attach adds a reference), but e is freed if b gets
         * retired and nobody else waits, so test b before touching e. */
        while (b && b->published == e && !list_empty(&e->waits)) {
                Wait *w = list_entry(e->waits.next, Wait, link);
                RegAsker a = { w->peer, true, w->req_id };
                RegWhy why;
                int err;

                /* Keep the name entry alive across reg_wait_free: it still has a live buffer. */
                reg_wait_free(r, w);
                err = attach_now(r, a, b, &why, o);
                if (err < 0)
                        registry_peer_mark_lost(a.peer);
                else if (err > 0)
                        reg_answer_error(o, a.peer, a.req, why);
        }
}

/* By id never waits: only a live buffer is attached; a retired one would grant memory its producer
 * has asked to drain. */
int registry_buffer_attach(Registry *r, RegPeer *p, RegBuffer *b, RegWhy *why, RegSink *out)
{
        if (b->state != PROTO_STATE_LIVE)
                return reg_fail(why, (RegWhy){ REG_E_NOT_LIVE,
                                               .not_live = { .buffer = b->id, .state = b->state, .name = b->name } });
        return attach_now(r, reg_asker(p), b, why, out);
}

int registry_attach(Registry *r, RegPeer *p, uint64_t id, const char *name, uint64_t buffer, uint32_t timeout_ms,
                    uint64_t now_ms, RegWhy *why, RegSink *out)
{
        uint64_t cost;
        RegName *e;
        RegBuffer *b;
        Wait *w;
        int err;

        if (!name) {
                err = registry_request_buffer(r, buffer, &b, why);
                return err ? err : registry_buffer_attach(r, p, b, why, out);
        }

        e = reg_name_lookup(r, name);
        if (e && e->live)
                return attach_now(r, reg_asker(p), e->live, why, out);
        if (timeout_ms == 0)
                return reg_fail(why, (RegWhy){ REG_E_NOTHING_UNDER, .nothing_under = { name } });
        if (p->n_waits >= r->limits.waits_per_peer)
                return reg_fail(why, (RegWhy){ REG_E_WAITS_LIMIT, .waits_limit = { p->n_waits } });
        cost = reg_wait_cost(sizeof(RegName), strlen(name));
        err = reg_charge(r, p->creds.uid, cost, why);
        if (err != 0)
                return err;
        e = reg_name_get(r, name);
        w = calloc(1, sizeof(*w));
        if (!e || !w) {
                free(w);
                reg_name_put(r, e);
                reg_uncharge(r, p->creds.uid, cost);
                return -ENOMEM;
        }
        timeout_ms = MIN(timeout_ms, r->limits.max_timeout_ms);
        *w = (Wait){ .timer = { HEAP_NODE_INIT, TIMER_WAIT }, .peer = p, .req_id = id,
                     .deadline = now_ms + timeout_ms, .name_publishes = e->publishes, .name = e,
                     .cost = (uint32_t)cost };
        if (heap_push(&r->timers, &w->timer.node, w->deadline) < 0) {
                free(w);
                reg_name_put(r, e);
                reg_uncharge(r, p->creds.uid, cost);
                return -ENOMEM;
        }
        list_append(&e->waits, &w->link);
        list_append(&p->waits, &w->peer_link);
        p->n_waits++;
        r->n_waits++;
        r->counters.attach_waits++;
        return 0;
}

/* Answers every member at once (all-or-nothing) and dissolves the group. */
static void group_finish(Registry *r, RegGroup *g, bool complete, RegSink *o)
{
        uint32_t joined = g->joined;

        while (!list_empty(&g->joins)) {
                Wait *w = list_entry(g->joins.next, Wait, link);
                RegAsker a = { w->peer, true, w->req_id };

                reg_join_free(r, w);
                if (!complete) {
                        reg_answer_error(o, a.peer, a.req,
                                         (RegWhy){ REG_E_GROUP_TIMEOUT,
                                                   .group_timeout = { g->name, joined, g->members } });
                        continue;
                }
                reg_succeed(o, a, (RegChange){ .reply = REG_RE_GROUP, .str = g->name, .n = g->members });
        }
        if (complete)
                r->counters.groups_completed++;
        else
                r->counters.groups_failed++;
        reg_group_free(r, g);
}

int registry_group_join(Registry *r, RegPeer *p, uint64_t id, const char *group, uint32_t members,
                        uint32_t timeout_ms, uint64_t now_ms, RegWhy *why, RegSink *out)
{
        RegGroup *g = group_lookup(r, group);
        size_t len = strlen(group);
        uint64_t cost = reg_wait_cost(sizeof(RegGroup), len);
        Wait *w;
        int e;

        if (members == 0)
                return reg_fail(why, (RegWhy){ REG_E_GROUP_EMPTY });
        if (g && g->members != members)
                return reg_fail(why, (RegWhy){ REG_E_GROUP_MISMATCH,
                                               .group_mismatch = { group, g->members, members } });
        if (g) {
                list_for_each(pos, &g->joins)
                        if (list_entry(pos, Wait, link)->peer == p)
                                return reg_fail(why, (RegWhy){ REG_E_GROUP_JOINED, .group_joined = { group } });
        }
        if (p->n_waits >= r->limits.waits_per_peer)
                return reg_fail(why, (RegWhy){ REG_E_WAITS_LIMIT, .waits_limit = { p->n_waits } });
        e = reg_charge(r, p->creds.uid, cost, why);
        if (e != 0)
                return e;
        if (!g) {
                g = calloc(1, sizeof(*g) + len + 1);
                if (!g || hmap_insert(&r->groups, &g->node, hash_str(group)) < 0) {
                        free(g);
                        reg_uncharge(r, p->creds.uid, cost);
                        return -ENOMEM;
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
                        reg_group_free(r, g);
                reg_uncharge(r, p->creds.uid, cost);
                return -ENOMEM;
        }
        timeout_ms = MIN(timeout_ms, r->limits.max_timeout_ms);
        *w = (Wait){ .timer = { HEAP_NODE_INIT, TIMER_WAIT }, .peer = p, .req_id = id,
                     .deadline = now_ms + timeout_ms, .group = g, .cost = (uint32_t)cost };
        list_append(&g->joins, &w->link);
        list_append(&p->waits, &w->peer_link);
        g->joined++;
        p->n_waits++;
        r->n_waits++;
        if (g->joined == g->members) {
                group_finish(r, g, true, out);
                return 0;
        }
        /* Without its timer the group could wait for ever: the joiner is cut off (its wait goes
         * with it). */
        return reg_group_rearm(r, g) < 0 ? -ENOMEM : 0;
}

/* The restart grace is over: nobody comes back from the broker's predecessor any more. Seats and the
 * members that wait for their rings are let go first, then claims and restored buffers. */
static void grace_end(Registry *r, RegSink *o)
{
        r->in_grace = false;
        reg_rings_grace_end(r, o);
        reg_claims_grace_end(r, o);
}

void registry_expire(Registry *r, uint64_t now_ms, RegSink *out)
{
        HeapNode *top;

        while ((top = heap_top(&r->timers)) && top->key <= now_ms) {
                Timer *t = container_of(top, Timer, node);

                if (t->type == TIMER_GROUP) {
                        group_finish(r, container_of(t, RegGroup, timer), false, out);
                } else if (t->type == TIMER_GRACE) {
                        heap_remove(&r->timers, &t->node);
                        grace_end(r, out);
                } else {
                        Wait *w = container_of(t, Wait, timer);
                        RegPeer *p = w->peer;
                        uint64_t req = w->req_id, missed = w->name->publishes - w->name_publishes;
                        char name[PROTO_MAX_NAME + 1];

                        copy_str(name, sizeof(name), w->name->name);
                        reg_wait_free(r, w);
                        r->counters.timeouts++;
                        /* Publications this wait saw come and go went to earlier waiters (retire_after)
                         * or were retired before its turn: saying "nothing was published" would mislead. */
                        reg_answer_error(out, p, req,
                                         missed ? (RegWhy){ REG_E_WAIT_MISSED, .wait_missed = { name, missed } }
                                                : (RegWhy){ REG_E_WAIT_TIMEOUT, .wait_timeout = { name } });
                }
        }
}

void registry_cancel_waits(Registry *r, RegSink *out)
{
        RegPeer *p;

        for (p = registry_peer_first(r); p; p = registry_peer_next(r, p)) {
                while (!list_empty(&p->waits)) {
                        Wait *w = list_entry(p->waits.next, Wait, peer_link);
                        RegGroup *g = w->group;
                        uint64_t req = w->req_id;

                        if (g) {
                                reg_join_free(r, w);
                                if (g->joined == 0)
                                        reg_group_free(r, g);
                        } else {
                                reg_wait_free(r, w);
                        }
                        reg_answer_error(out, p, req, (RegWhy){ REG_E_STOPPING });
                }
        }
}

uint64_t registry_next_deadline(const Registry *r)
{
        HeapNode *top = heap_top(&r->timers);
        return top ? top->key : UINT64_MAX;
}
