/* Waiting: attaches waiting for a name, rendezvous groups, and the deadlines of both. A wait ends
 * once (a publish or its group's completion, its deadline, its peer leaving, the broker stopping)
 * and must then be gone from its name's list and the timer heap alike (reg_wait_free). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry-claims.h"
#include "registry-core.h"
#include "registry-waits.h"

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

void registry_expire(Registry *r, uint64_t now_ms, RegSink *out)
{
        HeapNode *top;

        while ((top = heap_top(&r->timers)) && top->key <= now_ms) {
                Timer *t = container_of(top, Timer, node);

                if (t->type == TIMER_GROUP) {
                        group_finish(r, container_of(t, RegGroup, timer), false, out);
                } else if (t->type == TIMER_GRACE) {
                        heap_remove(&r->timers, &t->node);
                        reg_grace_end(r, out);
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
