/* Subscriptions: peers watching name prefixes, and the events they are sent. A prefix is a plain
 * byte prefix, so a subscriber never hears of a name outside it (and the policy checked the prefix
 * when it subscribed). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry-internal.h"

void reg_notify_subscribers(Registry *r, ProtoEvent ev, const RegBuffer *b, const char *reason, Outbox *o)
{
        list_for_each(pos, &r->subs) {
                Sub *s = list_entry(pos, Sub, link);
                ProtoMsg m;

                if (strncmp(b->name, s->prefix, s->prefix_len) != 0)
                        continue;
                reg_event_base(&m, ev, b);
                proto_set_sub(&m, s->id);
                if (reason)
                        proto_set_reason(&m, proto_str(reason));
                outbox_send(o, s->peer, &m, -1);
                r->counters.events++;
        }
}

void registry_subscribe(Registry *r, RegPeer *p, uint64_t id, const char *prefix, Outbox *out)
{
        size_t len = strlen(prefix);
        ProtoMsg m;
        Sub *s;

        if (p->n_subs >= r->limits.subs_per_peer) {
                reg_reply_err(out, p, id, PROTO_STATUS_QUOTA, "this connection has %u subscriptions (the limit)",
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

        proto_reply_init(&m, id, PROTO_STATUS_OK);
        proto_set_sub(&m, s->id);
        outbox_send(out, p, &m, -1);
}

void reg_sub_free(Registry *r, Sub *s)
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
                        reg_sub_free(r, s);
                        reg_reply_ok(out, p, id);
                        return;
                }
        }
        reg_reply_err(out, p, id, PROTO_STATUS_NOT_FOUND, "this connection has no subscription %llu",
                      (unsigned long long)sub);
}
