/* The broker going away: a restart (clean, and after kill -9) that reconnecting clients survive by
 * publishing their live buffers again, and SIGTERM while peers are connected and waits pending. */
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static gpuipc_t *connect_reconnecting(const HBroker *b, const char *label)
{
        gpuipc_options_t o = { .label = label, .reconnect = 1, .connect_timeout_ms = H_SOON_MS };
        gpuipc_t *c = NULL;
        int r = h_try_connect(b, &o, &c);

        CHECKF(r == 0, "connect: %s [%s]", gpuipc_strerror(r), gpuipc_errmsg(NULL));
        return c;
}

/* The first call after the broker went away may report the loss (with the broker's reason when
 * it said goodbye: shutdown); the next one reconnects. */
static void ping_through_restart(gpuipc_t *c)
{
        int r = gpuipc_ping(c, H_SOON_MS);

        if (r == GPUIPC_E_DISCONNECTED || r == GPUIPC_E_SHUTDOWN) {
                h_log("first call after the restart: disconnected (%s)", gpuipc_errmsg(c));
                r = gpuipc_ping(c, H_SOON_MS);
        }
        CHECKF(r == 0, "ping after the restart: %d %s [%s]", r, gpuipc_strerror(r), gpuipc_errmsg(c));
}

typedef struct Events {
        bool reconnected, drained, published;
        uint64_t drained_gen, published_sub;
} Events;

static void take_events(gpuipc_t *c, Events *e)
{
        gpuipc_event_t ev;

        while (gpuipc_next_event(c, &ev, 0) == 0) {
                h_log("event %d on '%s' (sub %" PRIu64 ", reason '%s')", ev.type, ev.name, ev.subscription,
                      ev.reason);
                if (ev.type == GPUIPC_EVENT_RECONNECTED)
                        e->reconnected = true;
                if (ev.type == GPUIPC_EVENT_DRAINED && ev.subscription == 0) {
                        e->drained = true;
                        e->drained_gen = ev.generation;
                }
                if (ev.type == GPUIPC_EVENT_PUBLISHED) {
                        e->published = true;
                        e->published_sub = ev.subscription;
                }
        }
}

/* Restarts the broker (cleanly, or after kill -9) under clients of both kinds and checks what
 * each of them sees. */
static void restart_case(bool crash)
{
        gpuipc_t *prod, *plain, *again, *fresh, *obs, *other;
        gpuipc_buffer_t *live, *retired, *v_live, *v_ret, *v2, *v3, *pub;
        uint64_t old_id, sub, gen_retired;
        Events ev = { 0 };
        HBroker *b;
        HStat st;

        b = h_broker_start(NULL);
        prod = connect_reconnecting(b, "producer");
        again = connect_reconnecting(b, "reconnecting-consumer");
        plain = h_connect(b, "plain-consumer");
        CHECK_OK(prod, gpuipc_subscribe(prod, "restart/", &sub));
        live = h_publish(prod, "restart/live", 256 << 10, 0x11fe, NULL);
        retired = h_publish(prod, "restart/retired", 4096, 0x2e71, NULL);
        gen_retired = gpuipc_buffer_generation(retired);
        old_id = gpuipc_buffer_id(live);
        v_live = h_attach_verify(plain, "restart/live", 0, 0x11fe);
        v_ret = h_attach_verify(plain, "restart/retired", 0, 0x2e71);
        v2 = h_attach_verify(again, "restart/live", 0, 0x11fe);
        CHECK_OK(prod, gpuipc_retire(prod, retired));
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        take_events(prod, &ev); /* publish events of its own subscription */

        if (crash) {
                h_broker_kill9(b); /* leaves its socket file behind */
                CHECKF(access(b->sock, F_OK) == 0, "a killed broker had no chance to remove its socket");
        } else {
                h_broker_stop(b);
        }
        h_broker_restart(b);

        /* The producer reconnects, publishes its live buffer again, hears of it. */
        ping_through_restart(prod);
        take_events(prod, &ev);
        CHECK(ev.reconnected);
        /* Its retired buffer's references went down with the old broker: drained, locally. */
        CHECK(ev.drained);
        CHECK_EQ(ev.drained_gen, gen_retired);
        CHECK_OK(prod, gpuipc_wait_drained(prod, retired, 0));
        CHECK(gpuipc_buffer_id(live) != 0);
        obs = h_connect(b, "observer");
        CHECK_OK(obs, h_stat(obs, "restart/live", &st));
        CHECK_EQ(st.buffer, gpuipc_buffer_id(live));
        CHECK_EQ(st.state, PROTO_STATE_LIVE);
        CHECK_EQ(st.refs, 0);
        CHECK_EQ(h_stat(obs, "restart/retired", &st), GPUIPC_E_NOT_FOUND);
        h_log("buffer id %" PRIu64 " before, %" PRIu64 " after the restart", old_id, gpuipc_buffer_id(live));

        /* A new consumer attaches the republished buffer and sees the same bytes. */
        fresh = h_connect(b, "new-consumer");
        v3 = h_attach_verify(fresh, "restart/live", H_SOON_MS, 0x11fe);

        /* The reconnecting consumer: its old handle is stale (release is harmless), a new attach works. */
        CHECK_OK(again, gpuipc_release(again, v2));
        ping_through_restart(again);
        v2 = h_attach_verify(again, "restart/live", 0, 0x11fe);

        /* A plain client reports the loss, every time, and can still tidy up. */
        CHECK_ERR(plain, gpuipc_ping(plain, H_SOON_MS), GPUIPC_E_DISCONNECTED);
        CHECK_ERR(plain, gpuipc_ping(plain, H_SOON_MS), GPUIPC_E_DISCONNECTED);
        CHECK(gpuipc_errmsg(plain)[0]);
        CHECK_OK(plain, gpuipc_release(plain, v_live));
        CHECK_OK(plain, gpuipc_release(plain, v_ret));
        gpuipc_close(plain);

        /* The subscription came along, under the id the producer knows. */
        other = h_connect(b, "other-producer");
        pub = h_publish(other, "restart/other", 4096, 5, NULL);
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        take_events(prod, &ev);
        CHECK(ev.published);
        CHECK_EQ(ev.published_sub, sub);
        (void)pub;
        gpuipc_close(other);

        /* And the lifetime contract holds on the new broker. */
        CHECK_OK(obs, h_stat(obs, "restart/live", &st));
        CHECK_EQ(st.refs, 2);
        CHECK_OK(prod, gpuipc_retire(prod, live));
        CHECK_OK(fresh, gpuipc_release(fresh, v3));
        CHECK_OK(again, gpuipc_release(again, v2));
        CHECK_OK(prod, gpuipc_wait_drained(prod, live, H_SOON_MS));
        gpuipc_close(fresh);
        gpuipc_close(again);
        gpuipc_close(prod);
        gpuipc_close(obs);
        h_broker_settle(b);
        h_broker_stop(b);
}

static void test_restart_republishes(void)
{
        restart_case(false);
}

static void test_crash_restart_republishes(void)
{
        restart_case(true);
}

typedef struct Arg {
        const HBroker *broker;
} Arg;

/* Each reports 'w' once its request is about to block, then 'r' with the result and how long
 * the call took after the broker was told to stop. */
static int attach_waiter(HChan *ch, void *arg)
{
        const Arg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "waiter");
        gpuipc_buffer_t *b = NULL;
        int r;

        h_report(ch, 'w', "waiting");
        r = gpuipc_attach(c, "stop/never", 60000, &b);
        h_report(ch, 'r', "%d %" PRIu64 " %s", r, h_now_ms(), gpuipc_errmsg(c));
        gpuipc_close(c);
        return 0;
}

static int group_waiter(HChan *ch, void *arg)
{
        const Arg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "group-member");
        int r;

        h_report(ch, 'w', "waiting");
        r = gpuipc_group_join(c, "stop/group", 5, 60000);
        h_report(ch, 'r', "%d %" PRIu64 " %s", r, h_now_ms(), gpuipc_errmsg(c));
        gpuipc_close(c);
        return 0;
}

static int event_waiter(HChan *ch, void *arg)
{
        const Arg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "holder");
        gpuipc_buffer_t *b = h_attach_verify(c, "stop/held", 0, 8);
        gpuipc_event_t ev;
        int r;

        h_report(ch, 'w', "waiting");
        r = gpuipc_next_event(c, &ev, 60000);
        h_report(ch, 'r', "%d %" PRIu64 " %s", r, h_now_ms(), gpuipc_errmsg(c));
        CHECK_OK(c, gpuipc_release(c, b));
        gpuipc_close(c);
        return 0;
}

static void test_sigterm_with_pending_waits(void)
{
        static const char *const flags[] = { "--max-queued-bytes", "1048576", NULL };
        HChildFn fns[] = { attach_waiter, attach_waiter, group_waiter, group_waiter, event_waiter };
        HChild *kids[5];
        gpuipc_t *prod;
        gpuipc_publish_options_t po = { .broker_held = 1 };
        ProtoMsg ping = { .op = PROTO_OP_PING };
        HBroker *b;
        Arg arg;
        uint64_t t_stop;
        unsigned took;
        int slow;

        b = h_broker_start(flags);
        arg.broker = b;
        prod = h_connect(b, "producer");
        h_publish(prod, "stop/held", 64 << 10, 8, &po);
        h_publish(prod, "stop/live", 64 << 10, 9, NULL);
        for (int i = 0; i < 5; i++) {
                char name[32];
                snprintf(name, sizeof(name), "pending-%d", i);
                kids[i] = h_spawn(name, fns[i], &arg);
                h_child_expect(kids[i], 'w', H_SOON_MS, NULL, 0);
        }
        WAIT_UNTIL(h_stats(prod, "waits") == 4, H_SOON_MS);
        /* And a peer that does not read what it asked for, so the broker has output queued. */
        slow = h_raw_connect(b);
        h_raw_hello(slow);
        for (int i = 0; i < 2000; i++) {
                ping.has = PROTO_BIT(PF_OP);
                if (h_raw_send_msg(slow, &ping, 0, NULL, 0) < 0)
                        break;
        }

        t_stop = h_now_ms();
        took = h_broker_stop(b); /* exit status 0 and no socket file, or it fails */
        h_log("the broker stopped %u ms after SIGTERM", took);
        CHECKF(took < 3000, "the broker took %u ms to stop", took);
        CHECK_EQ(h_broker_log_count(b, "\"msg\":\"stopped\""), 1);
        for (int i = 0; i < 5; i++) {
                char text[256];
                unsigned long long at = 0;
                int r = 0;

                h_child_expect(kids[i], 'r', H_SOON_MS, text, sizeof(text));
                CHECK(sscanf(text, "%d %llu", &r, &at) == 2);
                h_log("%s: %s", kids[i]->name, text);
                /* Pending requests are answered: shutdown. A peer only reading events may see the
                 * hang-up itself. */
                if (fns[i] == event_waiter)
                        CHECKF(r == GPUIPC_E_DISCONNECTED || r == GPUIPC_E_SHUTDOWN, "%s: %s", kids[i]->name,
                               text);
                else
                        CHECKF(r == GPUIPC_E_SHUTDOWN && strstr(text, "stopping"), "%s: %s", kids[i]->name,
                               text);
                CHECKF(at - t_stop < 3000, "%s returned %llu ms after SIGTERM", kids[i]->name, at - t_stop);
                h_child_wait_ok(kids[i], H_SOON_MS);
                h_child_free(kids[i]);
        }
        CHECKF(h_raw_wait_eof(slow, H_SOON_MS), "the slow peer's connection outlived the broker");
        close(slow);
        {
                int r = gpuipc_ping(prod, H_SOON_MS);
                CHECKF(r == GPUIPC_E_SHUTDOWN || r == GPUIPC_E_DISCONNECTED, "ping after the stop: %d %s", r,
                       gpuipc_strerror(r));
        }
        gpuipc_close(prod);
}

static void write_file(const char *path, const char *text)
{
        FILE *f = fopen(path, "we");

        CHECK(f);
        CHECK(fputs(text, f) >= 0);
        CHECK(fclose(f) == 0);
}

/* SIGHUP reloads the policy file (a runtime path under the seccomp filter); a broken file keeps
 * the old policy and the broker running. */
static void test_policy_reload_on_sighup(void)
{
        static char policy[160];
        static const char *flags[] = { "--policy", policy, NULL };
        gpuipc_t *c;
        gpuipc_buffer_t *b = NULL, *b2;
        HCase k;

        snprintf(policy, sizeof(policy), "%s/policy", h_case_dir());
        write_file(policy, "allow all any prefix=bystander/\n"
                           "allow publish,attach any prefix=open/\n");
        h_case_begin(&k, flags);
        c = h_connect(k.broker, "producer");
        CHECK_OK(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, 4096, 0, &b));
        CHECK_ERR(c, gpuipc_publish(c, b, "closed/x", NULL), GPUIPC_E_DENIED);
        CHECKF(strstr(gpuipc_errmsg(c), "closed/x"), "denied message: %s", gpuipc_errmsg(c));
        b2 = h_publish(c, "open/x", 4096, 1, NULL);

        write_file(policy, "allow all any\n");
        CHECK(kill(k.broker->pid, SIGHUP) == 0);
        WAIT_UNTIL(h_broker_log_count(k.broker, "policy reloaded") == 1, H_SOON_MS);
        CHECK_OK(c, gpuipc_publish(c, b, "closed/x", NULL));

        write_file(policy, "allow everything to everyone\n");
        CHECK(kill(k.broker->pid, SIGHUP) == 0);
        WAIT_UNTIL(h_broker_log_count(k.broker, "keeping the old policy") == 1, H_SOON_MS);
        CHECK_OK(c, gpuipc_ping(c, H_SOON_MS));
        CHECK_OK(c, gpuipc_retire(c, b));
        CHECK_OK(c, gpuipc_retire(c, b2));
        CHECK_OK(c, gpuipc_wait_drained(c, b, H_SOON_MS));
        CHECK_OK(c, gpuipc_wait_drained(c, b2, H_SOON_MS));
        gpuipc_close(c);
        h_case_end(&k);
}

/* SIGTERM while consumers hold a producer's buffers: removing the producer queues revoke events
 * for consumers that are removed right after it, in the same batch. Run under
 * GPUIPC_TEST_WRAPPER="valgrind -q --error-exitcode=99" to check nothing reads a removed peer. */
static void test_sigterm_with_holders(void)
{
        gpuipc_t *prod, *cons[3];
        gpuipc_buffer_t *a, *r;
        HBroker *b;

        b = h_broker_start(NULL);
        prod = h_connect(b, "producer");
        a = h_publish(prod, "hold/a", 4096, 1, NULL);
        r = h_publish(prod, "hold/r", 4096, 2, NULL);
        for (int i = 0; i < 3; i++) {
                cons[i] = h_connect(b, "consumer");
                h_attach_verify(cons[i], "hold/a", 0, 1);
                h_attach_verify(cons[i], "hold/r", 0, 2);
        }
        CHECK_OK(prod, gpuipc_retire(prod, r));
        h_broker_stop(b);
        for (int i = 0; i < 3; i++) {
                int e = gpuipc_ping(cons[i], H_SOON_MS);
                CHECKF(e == GPUIPC_E_DISCONNECTED || e == GPUIPC_E_SHUTDOWN, "ping after the stop: %d", e);
                gpuipc_close(cons[i]);
        }
        (void)a;
        gpuipc_close(prod);
}

/* After a restart another producer took one of the names first: that buffer cannot come back,
 * the others must, and so must the subscription and the RECONNECTED event. */
static void test_reconnect_with_name_taken(void)
{
        gpuipc_t *prod, *squatter, *obs, *other;
        gpuipc_buffer_t *one, *two;
        bool name_taken_leaked = false;
        Events ev = { 0 };
        uint64_t sub;
        HBroker *b;
        HStat st;
        int r = -1;

        b = h_broker_start(NULL);
        prod = connect_reconnecting(b, "producer");
        CHECK_OK(prod, gpuipc_subscribe(prod, "taken/", &sub));
        one = h_publish(prod, "taken/one", 4096, 1, NULL);
        two = h_publish(prod, "taken/two", 4096, 2, NULL);
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        take_events(prod, &ev);
        h_broker_stop(b);
        h_broker_restart(b);
        squatter = h_connect(b, "squatter");
        h_publish(squatter, "taken/one", 4096, 9, NULL);

        for (int i = 0; i < 3 && r != 0; i++) {
                r = gpuipc_ping(prod, H_SOON_MS);
                h_log("call %d after the restart: %d [%s]", i, r, gpuipc_errmsg(prod));
                name_taken_leaked |= r == GPUIPC_E_NAME_TAKEN;
        }
        CHECK_EQ(r, 0);
        /* The failure of one buffer is not the answer to an unrelated call. */
        CHECK(!name_taken_leaked);
        take_events(prod, &ev);
        CHECK(ev.reconnected);
        obs = h_connect(b, "observer");
        CHECK_OK(obs, h_stat(obs, "taken/one", &st));
        CHECK(st.buffer != gpuipc_buffer_id(one)); /* the squatter's */
        CHECK(h_stat(obs, "taken/two", &st) == 0 && st.buffer == gpuipc_buffer_id(two));
        other = h_connect(b, "other");
        h_publish(other, "taken/three", 4096, 3, NULL);
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        ev.published = false;
        take_events(prod, &ev);
        CHECK(ev.published && ev.published_sub == sub);
        gpuipc_close(other);
        gpuipc_close(squatter);
        gpuipc_close(obs);
        gpuipc_close(prod);
        h_broker_settle(b);
        h_broker_stop(b);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_restart_republishes),       H_TEST(test_crash_restart_republishes),
                H_TEST(test_reconnect_with_name_taken), H_TEST(test_sigterm_with_pending_waits),
                H_TEST(test_sigterm_with_holders),      H_TEST(test_policy_reload_on_sighup),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
