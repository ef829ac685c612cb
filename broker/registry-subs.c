/* Subscriptions: peers watching name prefixes, and the events they are sent. A prefix is a plain
 * byte prefix, so a subscriber never hears of a name outside it (and the policy checked the prefix
 * when it subscribed). The events themselves are the core's (reg_notify_subscribers), since they
 * follow a buffer's life. Layer: calls the core only. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry-core.h"
#include "registry-subs.h"

int registry_subscribe(Registry *r, RegPeer *p, const char *prefix, RegWhy *why, RegSink *out)
{
        size_t len = strlen(prefix);
        /* Each publication under the prefix makes the broker encode an event for it. */
        uint64_t cost = budget_alloc_cost(sizeof(Sub) + len + 1) + REG_FRAME_COST;
        Sub *s;
        int e;

        if (p->n_subs >= r->limits.subs_per_peer)
                return reg_fail(why, (RegWhy){ REG_E_SUBS_LIMIT, .subs_limit = { p->n_subs } });
        e = reg_charge(r, p->creds.uid, cost, why);
        if (e != 0)
                return e;
        s = calloc(1, sizeof(*s) + len + 1);
        if (!s) {
                reg_uncharge(r, p->creds.uid, cost);
                return -ENOMEM;
        }
        s->cost = (uint32_t)cost;
        s->id = ++r->next_sub_id;
        s->peer = p;
        s->prefix_len = (uint32_t)len;
        memcpy(s->prefix, prefix, len + 1);
        list_append(&r->subs, &s->link);
        list_append(&p->subs, &s->peer_link);
        p->n_subs++;
        r->n_subs++;
        reg_succeed(out, reg_asker(p), (RegChange){ .reply = REG_RE_SUB, .sub = s->id });
        return 0;
}

void reg_sub_free(Registry *r, Sub *s)
{
        list_unlink(&s->link);
        list_unlink(&s->peer_link);
        s->peer->n_subs--;
        r->n_subs--;
        reg_uncharge(r, s->peer->creds.uid, s->cost);
        free(s);
}

int registry_unsubscribe(Registry *r, RegPeer *p, uint64_t sub, RegWhy *why, RegSink *out)
{
        list_for_each(pos, &p->subs) {
                Sub *s = list_entry(pos, Sub, peer_link);

                if (s->id == sub) {
                        reg_sub_free(r, s);
                        reg_done(out, p);
                        return 0;
                }
        }
        return reg_fail(why, (RegWhy){ REG_E_NO_SUB, .no_sub = { sub } });
}
