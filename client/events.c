/* Events and what produces them: the queue the caller reads (gpuipc_next_event, or
 * gpuipc_process for event loops), subscriptions (whose ids stay what the caller knows across a
 * reconnect) and rendezvous groups. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "macro.h"

void client_queue_event(gpuipc_t *c, const gpuipc_event_t *ev)
{
        if (c->ev_count == CLIENT_EVENT_QUEUE_MAX) {
                /* Nobody reads events: keep the newest ones and count what was lost. */
                c->ev_head = (c->ev_head + 1) % CLIENT_EVENT_QUEUE_MAX;
                c->ev_count--;
                c->events_lost++;
        }
        c->events[(c->ev_head + c->ev_count) % CLIENT_EVENT_QUEUE_MAX] = *ev;
        c->ev_count++;
}

static bool take_event(gpuipc_t *c, gpuipc_event_t *ret)
{
        if (!c->ev_count)
                return false;
        *ret = c->events[c->ev_head];
        c->ev_head = (c->ev_head + 1) % CLIENT_EVENT_QUEUE_MAX;
        c->ev_count--;
        if (!c->ev_count)
                client_news_clear(c); /* gpuipc_fd() has nothing more to say about queued events */
        return true;
}

/* Only the connection's own events about buffer (subscription 0): a subscription's copy of the
 * same event is what another part of the program asked for, and stays. Order is kept. */
void client_drop_events(gpuipc_t *c, gpuipc_event_type_t type, uint64_t buffer)
{
        size_t n = c->ev_count, kept = 0;

        for (size_t i = 0; i < n; i++) {
                gpuipc_event_t ev = c->events[(c->ev_head + i) % CLIENT_EVENT_QUEUE_MAX];
                if (ev.type == type && ev.buffer == buffer && ev.subscription == 0)
                        continue;
                c->events[(c->ev_head + kept++) % CLIENT_EVENT_QUEUE_MAX] = ev;
        }
        c->ev_count = kept;
}

_public_ int gpuipc_next_event(gpuipc_t *c, int timeout_ms, gpuipc_event_t *ret)
{
        CLIENT_LOCKED(c);
        uint64_t deadline = client_deadline(timeout_ms);
        bool pumped = false;

        for (;;) {
                int left, r;

                if (take_event(c, ret))
                        return 0;
                /* At least one pump even with timeout 0: a poll for events must read what the
                 * broker already sent, or it would never see anything. */
                left = client_remaining_ms(deadline);
                if (left == 0 && pumped)
                        return GPUIPC_E_TIMEOUT;
                r = client_pump(c, left);
                if (r < 0)
                        return r;
                pumped = true;
        }
}

/* An epoll fd, not the socket: it also wakes for queued events, ring news and the reconnect
 * timer, and stays the same fd across reconnects, so an event loop registers it once. */
_public_ int gpuipc_fd(const gpuipc_t *c)
{
        return c->epfd;
}

_public_ int gpuipc_process(gpuipc_t *c)
{
        CLIENT_LOCKED(c);
        /* While the broker is away, each wake-up of the retry timer is one attempt (client_pump
         * with no time to wait tries once and says nothing when nobody listens yet). */
        int r = client_pump(c, 0);

        if (!c->ev_count)
                client_news_clear(c);
        return r < 0 ? r : (int)c->ev_count;
}

_public_ int gpuipc_subscribe(gpuipc_t *c, const char *prefix, uint64_t *ret_subscription)
{
        CLIENT_LOCKED(c);
        ProtoMsg req;
        Frame f = { .fd = -1 };
        Subscription *s;
        int r;

        r = client_check_name(c, prefix, "name prefix", true, 0);
        if (r < 0)
                return r;
        s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        proto_request_init(&req, PROTO_OP_SUBSCRIBE);
        proto_set_prefix(&req, proto_str(prefix));
        r = client_request(c, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, &f);
        if (r < 0) {
                free(s);
                return r;
        }
        /* The caller gets an id of ours, not the broker's: the broker's changes when a reconnect
         * subscribes again (client_resubscribe), ours never does. */
        s->broker_id = f.msg.sub;
        s->id = ++c->next_sub;
        snprintf(s->prefix, sizeof(s->prefix), "%s", prefix);
        list_append(&c->subs, &s->link);
        frame_free(&f);
        if (ret_subscription)
                *ret_subscription = s->id;
        return 0;
}

_public_ int gpuipc_unsubscribe(gpuipc_t *c, uint64_t subscription)
{
        CLIENT_LOCKED(c);
        list_for_each(pos, &c->subs) {
                Subscription *s = list_entry(pos, Subscription, link);
                ProtoMsg req;
                Frame f = { .fd = -1 };
                int r;

                if (s->id != subscription)
                        continue;
                proto_request_init(&req, PROTO_OP_UNSUBSCRIBE);
                proto_set_sub(&req, s->broker_id);
                /* Forgotten here whatever the broker said: a broker that does not know the
                 * subscription (it restarted meanwhile) sends it no events either. */
                r = client_request(c, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, &f);
                if (r == 0)
                        frame_free(&f);
                list_unlink(&s->link);
                free(s);
                return r;
        }
        return GPUIPC_E_NOT_FOUND;
}

int client_resubscribe(gpuipc_t *c)
{
        list_for_each(pos, &c->subs) {
                Subscription *s = list_entry(pos, Subscription, link);
                ProtoMsg req;
                Frame f = { .fd = -1 };
                int r;

                proto_request_init(&req, PROTO_OP_SUBSCRIBE);
                proto_set_prefix(&req, proto_str(s->prefix));
                r = client_request(c, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, &f);
                if (r < 0)
                        return r;
                s->broker_id = f.msg.sub;
                frame_free(&f);
        }
        return 0;
}

void events_on_late_subscribe(gpuipc_t *c, const ProtoMsg *reply)
{
        ProtoMsg req;

        if (!proto_has(reply, PF_SUB))
                return;
        proto_request_init(&req, PROTO_OP_UNSUBSCRIBE);
        proto_set_sub(&req, reply->sub);
        (void)client_send_nowait(c, &req);
}

uint64_t client_subscription_id(gpuipc_t *c, uint64_t broker_id)
{
        list_for_each(pos, &c->subs) {
                Subscription *s = list_entry(pos, Subscription, link);
                if (s->broker_id == broker_id)
                        return s->id;
        }
        return 0;
}

_public_ int gpuipc_group_join(gpuipc_t *c, const char *group, unsigned members, int timeout_ms)
{
        CLIENT_LOCKED(c);
        ProtoMsg req;
        Frame f = { .fd = -1 };
        int r;

        if (!group || timeout_ms == 0)
                return GPUIPC_E_INVALID;
        r = client_check_name(c, group, "group name", false, 0);
        if (r < 0)
                return r;
        proto_request_init(&req, PROTO_OP_GROUP_JOIN);
        proto_set_group(&req, proto_str(group));
        proto_set_members(&req, members);
        proto_set_timeout_ms(&req, timeout_ms < 0 ? PROTO_TIMEOUT_INFINITE : (uint64_t)timeout_ms);
        r = client_request(c, &req, -1, client_reply_deadline_ms(timeout_ms), &f);
        if (r == 0)
                frame_free(&f);
        return r;
}
