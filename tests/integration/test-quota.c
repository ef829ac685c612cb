/* Quotas: each --max-* limit refuses with status quota and a message that says which limit was hit,
 * takes nothing (no reference, no wait, no fd, no registration), and stops refusing once something
 * is given back. The bystander of every case counts against the per-uid limits (it owns a buffer
 * and three connections), so the limits below are set one or three higher than the case needs. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* The error names the limit it hit: the word "limit" (and, when given, the number). */
static void expect_quota_message(const char *msg, const char *number)
{
        CHECKF(msg && msg[0], "the quota error has no message");
        h_log("quota: %s", msg);
        CHECKF(strstr(msg, "limit"), "the quota message does not mention the limit: %s", msg);
        if (number)
                CHECKF(strstr(msg, number), "the quota message does not name the limit %s: %s", number, msg);
}

typedef struct Arg {
        const HBroker *broker;
} Arg;

/* Holds two references (the limit), then waits for "quota/later": when it is published the wait
 * must end with the quota error, not with a third reference. */
static int greedy_waiter(HChan *ch, void *arg)
{
        const Arg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "greedy");
        gpuipc_buffer_t *x[2], *later = NULL;

        x[0] = h_attach_verify(c, "quota/x", 0, 1);
        x[1] = h_attach_verify(c, "quota/x", 0, 1);
        h_report(ch, 'w', "waiting");
        CHECK_ERR(c, gpuipc_attach(c, "quota/later", H_SOON_MS, &later), GPUIPC_E_QUOTA);
        expect_quota_message(gpuipc_errmsg(c), "2");
        CHECK_OK(c, gpuipc_release(c, x[0]));
        CHECK_OK(c, gpuipc_release(c, x[1]));
        h_report(ch, 'd', "done");
        gpuipc_close(c);
        return 0;
}

/* --max-refs-per-peer refuses the attach over the limit (by name or id) without taking a reference; giving one back
 * restores the allowance, and a woken wait is charged then. */
static void test_max_refs_per_peer(void)
{
        static const char *const flags[] = { "--max-refs-per-peer", "2", NULL };
        gpuipc_t *prod, *c;
        gpuipc_buffer_t *y, *later, *v[3] = { 0 };
        HChild *greedy;
        HStat st;
        Arg arg;
        HCase k;

        h_case_begin(&k, flags);
        prod = h_connect(k.broker, "producer");
        h_publish(prod, "quota/x", 4096, 1, NULL);
        y = h_publish(prod, "quota/y", 4096, 1, NULL);
        c = h_connect(k.broker, "consumer");
        v[0] = h_attach_verify(c, "quota/x", 0, 1);
        v[1] = h_attach_verify(c, "quota/y", 0, 1);
        CHECK_ERR(c, gpuipc_attach(c, "quota/x", 0, &v[2]), GPUIPC_E_QUOTA);
        expect_quota_message(gpuipc_errmsg(c), "2");
        CHECK_ERR(c, gpuipc_attach_id(c, gpuipc_buffer_id(y), &v[2]), GPUIPC_E_QUOTA);
        CHECK(v[2] == NULL);
        CHECK_OK(k.obs, h_stat(k.obs, "quota/x", &st));
        CHECK_EQ(st.refs, 1);
        /* Another connection has its own allowance; giving one back restores ours. */
        h_bystander_check(&k);
        CHECK_OK(c, gpuipc_release(c, v[1]));
        v[1] = h_attach_verify(c, "quota/x", 0, 1);
        CHECK_OK(c, gpuipc_release(c, v[0]));
        CHECK_OK(c, gpuipc_release(c, v[1]));

        /* A wait that ends in a publish is charged when it wakes. */
        arg.broker = k.broker;
        greedy = h_spawn("greedy", greedy_waiter, &arg);
        h_child_expect(greedy, 'w', H_SOON_MS, NULL, 0);
        WAIT_UNTIL(h_stats(k.obs, "waits") == 1, H_SOON_MS);
        later = h_publish(prod, "quota/later", 4096, 2, NULL);
        h_child_expect(greedy, 'd', H_SOON_MS, NULL, 0);
        h_child_wait_ok(greedy, H_SOON_MS);
        h_child_free(greedy);
        CHECK_OK(k.obs, h_stat(k.obs, "quota/later", &st));
        CHECK_EQ(st.refs, 0);
        CHECK_EQ(h_stats(k.obs, "waits"), 0);
        CHECK_EQ(h_stats(k.obs, "references"), 1); /* the bystander's */
        (void)later;
        gpuipc_close(c);
        gpuipc_close(prod);
        h_case_end(&k);
}

/* --max-waits-per-peer counts attach waits and group joins together, refuses the one over the limit, and makes room
 * when a wait ends. */
static void test_max_waits_per_peer(void)
{
        static const char *const flags[] = { "--max-waits-per-peer", "1", NULL };
        ProtoMsg a1 = { .op = PROTO_OP_ATTACH, .name = proto_str("wait/a"), .timeout_ms = 20000 };
        ProtoMsg a2 = { .op = PROTO_OP_ATTACH, .name = proto_str("wait/b"), .timeout_ms = 20000 };
        ProtoMsg join = {
                .op = PROTO_OP_GROUP_JOIN, .group = proto_str("wait/g"), .members = 2, .timeout_ms = 20000
        };
        HFrame *f = h_frame_new();
        gpuipc_t *prod;
        gpuipc_buffer_t *b;
        char text[PROTO_MAX_TEXT + 1];
        int sock;
        HCase k;

        h_case_begin(&k, flags);
        a1.has = a2.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_TIMEOUT_MS);
        join.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_GROUP) | PROTO_BIT(PF_MEMBERS) | PROTO_BIT(PF_TIMEOUT_MS);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        /* One wait pending (its reply comes later), then a second attach and a group join. */
        CHECK_EQ(h_raw_send_msg(sock, &a1, 0, NULL, 0), 0);
        WAIT_UNTIL(h_stats(k.obs, "waits") == 1, H_SOON_MS);
        CHECK_EQ(h_raw_call(sock, &a2, -1, f), PROTO_STATUS_QUOTA);
        snprintf(text, sizeof(text), "%.*s", (int)f->msg.message.len, f->msg.message.ptr);
        expect_quota_message(text, "1");
        CHECK_EQ(h_raw_call(sock, &join, -1, f), PROTO_STATUS_QUOTA);
        CHECK_EQ(h_stats(k.obs, "waits"), 1);
        CHECK_EQ(h_stats(k.obs, "groups"), 0);
        /* A publish ends the first wait; then there is room for another. */
        prod = h_connect(k.broker, "producer");
        b = h_publish(prod, "wait/a", 4096, 3, NULL);
        CHECK_EQ(h_raw_recv(sock, H_SOON_MS, f), 1);
        CHECK_EQ(f->msg.reply, a1.id);
        CHECK_EQ(f->msg.status, PROTO_STATUS_OK);
        CHECK(f->fd >= 0); /* the memfd: closed with the frame */
        CHECK_EQ(h_stats(k.obs, "waits"), 0);
        a2.timeout_ms = 50;
        a2.has &= ~PROTO_BIT(PF_ID);
        CHECK_EQ(h_raw_call(sock, &a2, -1, f), PROTO_STATUS_TIMEOUT);
        close(sock);
        h_frame_free(f);
        CHECK_OK(prod, gpuipc_retire(prod, b));
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
        gpuipc_close(prod);
        h_case_end(&k);
}

/* --max-buffers-per-uid refuses a publish over the limit from any connection of that uid (saying which limit),
 * closes the refused memfd, and counts a retired buffer until it is freed. */
static void test_max_buffers_per_uid(void)
{
        static const char *const flags[] = { "--max-buffers-per-uid", "2", NULL };
        gpuipc_t *p1, *p2;
        gpuipc_buffer_t *a, *b = NULL, *c = NULL;
        HStat st;
        int fds;
        HCase k;

        h_case_begin(&k, flags);
        p1 = h_connect(k.broker, "producer-1");
        p2 = h_connect(k.broker, "producer-2");
        a = h_publish(p1, "buf/a", 4096, 1, NULL); /* with the bystander's: 2 of 2 */
        fds = h_broker_fds(k.broker);
        CHECK_OK(p1, gpuipc_buffer_alloc(p1, GPUIPC_KIND_MEMFD, 4096, 0, &b));
        CHECK_ERR(p1, gpuipc_publish(p1, b, "buf/b", NULL), GPUIPC_E_QUOTA);
        expect_quota_message(gpuipc_errmsg(p1), "2");
        CHECK_EQ(h_stat_id(k.obs, gpuipc_buffer_id(b), &st), GPUIPC_E_NOT_FOUND);
        /* Per uid: another connection of the same uid is refused too. */
        CHECK_OK(p2, gpuipc_buffer_alloc(p2, GPUIPC_KIND_MEMFD, 4096, 0, &c));
        CHECK_ERR(p2, gpuipc_publish(p2, c, "buf/c", NULL), GPUIPC_E_QUOTA);
        /* The refused memfds were closed, nothing was registered. */
        WAIT_UNTIL(h_broker_fds(k.broker) == fds, H_SOON_MS);
        CHECK_EQ(h_list_count(k.obs, "buf/"), 1);
        /* Retired and drained still counts (it stays registered for reuse); freed does not. */
        CHECK_OK(p1, gpuipc_retire(p1, a));
        CHECK_OK(p1, gpuipc_wait_drained(p1, a, H_SOON_MS));
        CHECK_ERR(p2, gpuipc_publish(p2, c, "buf/c", NULL), GPUIPC_E_QUOTA);
        CHECK_OK(p1, gpuipc_buffer_free(p1, a));
        CHECK_OK(p2, gpuipc_publish(p2, c, "buf/c", NULL));
        CHECK_ERR(p1, gpuipc_publish(p1, b, "buf/b", NULL), GPUIPC_E_QUOTA);
        /* A producer's disconnect gives its share back. */
        gpuipc_close(p2);
        WAIT_UNTIL(h_list_count(k.obs, "buf/") == 0, H_SOON_MS);
        CHECK_OK(p1, gpuipc_publish(p1, b, "buf/b", NULL));
        gpuipc_close(p1);
        h_case_end(&k);
}

/* --max-fds-per-uid refuses a publish that would hold one fd too many for that uid, and a freed buffer gives its fd
 * back. */
static void test_max_fds_per_uid(void)
{
        static const char *const flags[] = { "--max-fds-per-uid", "2", NULL };
        gpuipc_t *p;
        gpuipc_buffer_t *a, *b = NULL;
        HCase k;

        h_case_begin(&k, flags);
        p = h_connect(k.broker, "producer");
        a = h_publish(p, "fds/a", 4096, 1, NULL);
        CHECK_OK(p, gpuipc_buffer_alloc(p, GPUIPC_KIND_MEMFD, 4096, 0, &b));
        CHECK_ERR(p, gpuipc_publish(p, b, "fds/b", NULL), GPUIPC_E_QUOTA);
        expect_quota_message(gpuipc_errmsg(p), "2");
        CHECK_EQ(h_stats(k.obs, "held_fds"), 2);
        CHECK_OK(p, gpuipc_retire(p, a));
        CHECK_OK(p, gpuipc_wait_drained(p, a, H_SOON_MS));
        CHECK_OK(p, gpuipc_buffer_free(p, a));
        CHECK_OK(p, gpuipc_publish(p, b, "fds/b", NULL));
        gpuipc_close(p);
        h_case_end(&k);
}

/* --max-subs-per-peer refuses the subscription over the limit, and unsubscribing makes room again. */
static void test_max_subs_per_peer(void)
{
        static const char *const flags[] = { "--max-subs-per-peer", "1", NULL };
        gpuipc_t *c;
        uint64_t s1, s2 = 0;
        HCase k;

        h_case_begin(&k, flags);
        c = h_connect(k.broker, "watcher");
        CHECK_OK(c, gpuipc_subscribe(c, "a/", &s1));
        CHECK_ERR(c, gpuipc_subscribe(c, "b/", &s2), GPUIPC_E_QUOTA);
        expect_quota_message(gpuipc_errmsg(c), "1");
        CHECK_EQ(h_stats(k.obs, "subscriptions"), 1);
        CHECK_OK(c, gpuipc_unsubscribe(c, s1));
        CHECK_OK(c, gpuipc_subscribe(c, "b/", &s2));
        gpuipc_close(c);
        h_case_end(&k);
}

/* --max-connections-per-uid refuses the connection over the limit with a quota notice the client reports, counted
 * in connections_refused_total. */
static void test_max_connections_per_uid(void)
{
        /* The bystander and the observer hold three connections: three more fit. */
        static const char *const flags[] = { "--max-connections-per-uid", "6", NULL };
        gpuipc_t *c[3], *extra = NULL;
        gpuipc_options_t o = { .struct_size = sizeof(o), .label = "one-too-many" };
        const char *msg;
        char text[PROTO_MAX_TEXT + 1];
        HChild *ctl;
        char *out;
        int r, fds;
        HCase k;

        h_case_begin(&k, flags);
        for (int i = 0; i < 3; i++)
                c[i] = h_connect(k.broker, "filler");
        fds = h_broker_fds(k.broker);
        r = h_try_connect(k.broker, &o, &extra);
        msg = gpuipc_errmsg(NULL);
        h_log("refused connection: %d %s", r, msg);
        CHECK(extra == NULL);
        /* The broker answers a refused connection with a quota frame and hangs up; a client that
         * sends its hello after the hang-up must still read that frame rather than report a lost
         * broker. */
        CHECKF(r == GPUIPC_E_QUOTA || r == GPUIPC_E_DISCONNECTED, "the 7th connection: %d (%s)", r,
               gpuipc_strerror(r));
        CHECK(r == GPUIPC_E_QUOTA);
        if (r == GPUIPC_E_QUOTA) {
                CHECKF(msg[0] && strstr(msg, "connections"),
                       "the refusal does not say what was exceeded: '%s'", msg);
                CHECK(strstr(msg, "limit") && strstr(msg, "6"));
        }
        CHECK_EQ(h_stats(k.obs, "connections_refused_total"), 1);
        /* What the broker sends is right: a raw peer that waits before writing reads the refusal. */
        {
                int sock = h_raw_connect(k.broker);
                HFrame *f = h_frame_new();

                CHECK_EQ(h_raw_recv(sock, H_SOON_MS, f), 1);
                CHECK_EQ(f->msg.type, PROTO_REPLY);
                CHECK_EQ(f->msg.reply, 0);
                CHECK_EQ(f->msg.status, PROTO_STATUS_QUOTA);
                CHECK(f->msg.message.len > 0);
                snprintf(text, sizeof(text), "%.*s", (int)f->msg.message.len, f->msg.message.ptr);
                h_log("raw peer refused: %s", text);
                CHECKF(strstr(text, "connections"), "the refusal does not say what was exceeded: '%s'",
                       text);
                CHECK(strstr(text, "limit") && strstr(text, "6"));
                CHECK(h_raw_wait_eof(sock, H_SOON_MS));
                h_frame_free(f);
                close(sock);
        }
        /* The CLI says so as well. */
        ctl = h_spawn_ctl(k.broker, "ctl-ping", "ping", NULL);
        r = h_child_wait(ctl, H_SOON_MS);
        out = h_child_output(ctl);
        h_log("gpuipcctl ping exited %d: %s", r, out);
        CHECKF(r != 0, "gpuipcctl ping got through: %s", out);
        CHECK(strstr(out, "connections") != NULL);
        free(out);
        h_child_free(ctl);
        /* Nothing of the refused connections stayed open in the broker. */
        WAIT_UNTIL(h_broker_fds(k.broker) == fds, H_SOON_MS);
        /* One goes, another may come. */
        gpuipc_close(c[0]);
        WAIT_UNTIL(h_stats(k.obs, "peers") == 5, H_SOON_MS);
        c[0] = h_connect(k.broker, "filler");
        for (int i = 0; i < 3; i++)
                gpuipc_close(c[i]);
        /* A close reaches the broker later than the call returns: the case's own connection check
         * (h_case_end) would otherwise race the fillers' hang-ups for the sixth place. */
        WAIT_UNTIL(h_stats(k.obs, "peers") == 3, H_SOON_MS);
        h_case_end(&k);
}

/* A peer that sends requests and never reads the replies: once more than --max-queued-bytes wait
 * for it, the broker drops it instead of buffering without bound. */
static void test_slow_reader_dropped(void)
{
        static const char *const flags[] = { "--max-queued-bytes", "4096", NULL };
        ProtoMsg ping = { .op = PROTO_OP_PING, .has = PROTO_BIT(PF_OP) };
        int sock, sent = 0, r = 0;
        HCase k;

        h_case_begin(&k, flags);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        for (; sent < 20000; sent++) {
                ping.has = PROTO_BIT(PF_OP);
                r = h_raw_send_msg(sock, &ping, 0, NULL, 0);
                if (r < 0)
                        break;
                if (sent % 256 == 0 && h_broker_log_count(k.broker, "does not read"))
                        break;
        }
        h_log("sent %d pings without reading (last send: %s)", sent, r < 0 ? strerror(-r) : "ok");
        WAIT_UNTIL(h_broker_log_count(k.broker, "dropping a peer that does not read") == 1, H_SOON_MS);
        CHECKF(h_raw_wait_eof(sock, H_SOON_MS), "the slow reader's connection stayed open");
        close(sock);
        CHECK_EQ(h_stats(k.obs, "slow_peers_dropped_total"), 1);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_max_refs_per_peer),   H_TEST(test_max_waits_per_peer),
                H_TEST(test_max_buffers_per_uid), H_TEST(test_max_fds_per_uid),
                H_TEST(test_max_subs_per_peer),   H_TEST(test_max_connections_per_uid),
                H_TEST(test_slow_reader_dropped),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
