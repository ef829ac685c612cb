/* Peer death: kill -9 of a consumer drops its references (and its waits), kill -9 of a producer
 * revokes its buffers and tells their holders, and a broker-held memfd buffer outlives its producer
 * until retired and drained. */
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

typedef struct PeerArg {
        const HBroker *broker;
        const char *name, *name2;
        size_t size;
        uint64_t seed;
        bool broker_held;
} PeerArg;

/* Publishes name, reports 'p' with its id, then does nothing until it is killed. */
static int producer(HChan *ch, void *arg)
{
        const PeerArg *a = arg;
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .broker_held = a->broker_held };
        gpuipc_t *c = h_connect(a->broker, "doomed-producer");
        gpuipc_buffer_t *b = h_publish(c, a->name, a->size, a->seed, &po);

        h_report(ch, 'p', "%" PRIu64, gpuipc_buffer_id(b));
        h_await(ch, 'x', 120000);
        return 0;
}

/* Attaches name twice and name2 once, reports 'a', then does nothing until it is killed. */
static int greedy_consumer(HChan *ch, void *arg)
{
        const PeerArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "doomed-consumer");

        h_attach_verify(c, a->name, H_SOON_MS, a->seed);
        h_attach_verify(c, a->name, H_SOON_MS, a->seed);
        h_attach_verify(c, a->name2, H_SOON_MS, a->seed);
        h_report(ch, 'a', "holding");
        h_await(ch, 'x', 120000);
        return 0;
}

/* Attaches and verifies, reports 'a', releases when told 'r' and reports 'd'. */
static int holder(HChan *ch, void *arg)
{
        const PeerArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "holder");
        gpuipc_buffer_t *b = h_attach_verify(c, a->name, H_SOON_MS, a->seed);

        h_report(ch, 'a', "%" PRIu64, gpuipc_buffer_id(b));
        h_await(ch, 'r', 120000);
        h_verify(b, a->seed);
        CHECK_OK(c, gpuipc_release(c, b));
        h_report(ch, 'd', "released");
        gpuipc_close(c);
        return 0;
}

/* Waits for a name that never comes (reports 'w' first). */
static int waiter(HChan *ch, void *arg)
{
        const PeerArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "doomed-waiter");
        gpuipc_buffer_t *b = NULL;

        h_report(ch, 'w', "waiting");
        gpuipc_attach(c, a->name, 120000, &b);
        return 1;
}

/* Attaches and verifies, reports 'a', then waits for the revoke of that buffer and checks what a
 * revoked buffer looks like before reporting 'R' with the reason. */
static int revokee(HChan *ch, void *arg)
{
        const PeerArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "revokee");
        gpuipc_buffer_t *b = h_attach_verify(c, a->name, H_SOON_MS, a->seed), *again = NULL;
        gpuipc_event_t ev;
        uint8_t byte;

        h_report(ch, 'a', "%" PRIu64, gpuipc_buffer_id(b));
        CHECK_OK(c, h_next_event_of(c, GPUIPC_EVENT_REVOKED, 60000, &ev));
        CHECK_EQ(ev.buffer, gpuipc_buffer_id(b));
        CHECK_EQ(ev.subscription, 0);
        CHECK(strcmp(ev.name, a->name) == 0);
        CHECKF(ev.reason[0], "the revoke event carries no reason");
        CHECK(gpuipc_buffer_revoked(b));
        CHECK_ERR(c, gpuipc_buffer_read(b, 0, &byte, 1), GPUIPC_E_REVOKED);
        /* Releasing a revoked buffer is fine (the broker already dropped the reference). */
        CHECK_OK(c, gpuipc_release(c, b));
        CHECK_ERR(c, gpuipc_attach(c, a->name, 0, &again), GPUIPC_E_NOT_FOUND);
        CHECK_OK(c, gpuipc_ping(c, H_SOON_MS));
        h_report(ch, 'R', "%s", ev.reason);
        gpuipc_close(c);
        return 0;
}

static uint64_t expect_id(HChild *c, char tag)
{
        char text[256];

        h_child_expect(c, tag, H_SOON_MS, text, sizeof(text));
        return strtoull(text, NULL, 10);
}

static uint64_t refs_of(gpuipc_t *obs, uint64_t id)
{
        HStat st;

        CHECK_OK(obs, h_stat_id(obs, id, &st));
        return st.refs;
}

/* A SIGKILLed consumer's references are released by the broker, so a retired buffer it held drains and the producer
 * hears drained. */
static void test_consumer_kill9_releases_refs(void)
{
        PeerArg arg;
        gpuipc_t *prod;
        gpuipc_buffer_t *a, *b;
        gpuipc_event_t ev;
        HChild *victim, *ls;
        HStat st;
        HCase k;
        char *out;
        uint64_t peers;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "producer");
        a = h_publish(prod, "death/a", 64 << 10, 11, NULL);
        b = h_publish(prod, "death/b", 64 << 10, 11, NULL);
        peers = h_stats(k.obs, "peers");
        arg = (PeerArg){ k.broker, "death/a", "death/b", 0, 11, false };
        victim = h_spawn("victim", greedy_consumer, &arg);
        h_child_expect(victim, 'a', H_SOON_MS, NULL, 0);
        CHECK_OK(k.obs, h_stat(k.obs, "death/a", &st));
        CHECK_EQ(st.refs, 2);
        CHECK_EQ(st.holders, 1);
        CHECK_EQ(refs_of(k.obs, gpuipc_buffer_id(b)), 1);
        /* Retired while the victim holds it: drained only once the victim is gone. */
        CHECK_OK(prod, gpuipc_retire(prod, b));
        CHECK_ERR(prod, gpuipc_wait_drained(prod, b, 50), GPUIPC_E_TIMEOUT);

        h_child_kill9(victim);
        h_child_free(victim);
        WAIT_UNTIL(refs_of(k.obs, gpuipc_buffer_id(a)) == 0, H_SOON_MS);
        CHECK_OK(prod, h_next_event_of(prod, GPUIPC_EVENT_DRAINED, H_SOON_MS, &ev));
        CHECK_EQ(ev.buffer, gpuipc_buffer_id(b));
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, 0));
        CHECK_OK(k.obs, h_stat(k.obs, "death/a", &st));
        CHECK_EQ(st.holders, 0);
        CHECK_EQ(st.state, PROTO_STATE_LIVE);
        CHECK_EQ(h_stats(k.obs, "peers"), peers);
        CHECK_EQ(h_stats(k.obs, "references"), 1); /* the bystander's */

        /* gpuipcctl ls agrees. */
        ls = h_spawn_ctl(k.broker, "ctl-ls", "--json", "ls", "--prefix", "death/", NULL);
        h_child_wait_ok(ls, H_SOON_MS);
        out = h_child_output(ls);
        CHECKF(strstr(out, "\"name\":\"death/a\"") && strstr(out, "\"refs\":0") &&
                       !strstr(out, "\"refs\":1") && !strstr(out, "\"refs\":2"),
               "gpuipcctl ls: %s", out);
        free(out);
        h_child_free(ls);

        CHECK_OK(prod, gpuipc_buffer_free(prod, b));
        CHECK_OK(prod, gpuipc_retire(prod, a));
        CHECK_OK(prod, gpuipc_wait_drained(prod, a, H_SOON_MS));
        CHECK_OK(prod, gpuipc_buffer_free(prod, a));
        gpuipc_close(prod);
        h_case_end(&k);
}

/* A consumer SIGKILLed while waiting for a name leaves no wait behind, and a later publish hands it no reference. */
static void test_waiting_consumer_kill9(void)
{
        PeerArg arg = { 0 };
        gpuipc_t *prod;
        gpuipc_buffer_t *b;
        HChild *w;
        HStat st;
        HCase k;
        uint64_t names;

        h_case_begin(&k, NULL);
        names = h_stats(k.obs, "names");
        arg = (PeerArg){ k.broker, "death/awaited", NULL, 0, 5, false };
        w = h_spawn("waiter", waiter, &arg);
        h_child_expect(w, 'w', H_SOON_MS, NULL, 0);
        WAIT_UNTIL(h_stats(k.obs, "waits") == 1, H_SOON_MS);
        h_child_kill9(w);
        h_child_free(w);
        WAIT_UNTIL(h_stats(k.obs, "waits") == 0, H_SOON_MS);
        CHECK_EQ(h_stats(k.obs, "names"), names);
        /* Publishing now hands no reference to the dead waiter. */
        prod = h_connect(k.broker, "producer");
        b = h_publish(prod, "death/awaited", 4096, 5, NULL);
        CHECK_OK(k.obs, h_stat(k.obs, "death/awaited", &st));
        CHECK_EQ(st.refs, 0);
        CHECK_OK(prod, gpuipc_retire(prod, b));
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
        gpuipc_close(prod); /* frees its buffers */
        h_case_end(&k);
}

/* A SIGKILLed producer's buffer (not broker-held) is revoked: every holder and subscriber is told why, and the
 * buffer and its fd are gone. */
static void test_producer_kill9_revokes(void)
{
        PeerArg arg;
        HChild *prod, *kids[2];
        gpuipc_t *watcher;
        gpuipc_event_t ev;
        uint64_t id, sub, held;
        HStat st;
        HCase k;
        char reason[256];

        h_case_begin(&k, NULL);
        watcher = h_connect(k.broker, "watcher");
        CHECK_OK(watcher, gpuipc_subscribe(watcher, "doomed/", &sub));
        held = h_stats(k.obs, "held_fds");
        arg = (PeerArg){ k.broker, "doomed/x", NULL, 128 << 10, 0xd00d, false };
        prod = h_spawn("producer", producer, &arg);
        id = expect_id(prod, 'p');
        CHECK_EQ(h_stats(k.obs, "held_fds"), held + 1);
        kids[0] = h_spawn("revokee-0", revokee, &arg);
        kids[1] = h_spawn("revokee-1", revokee, &arg);
        CHECK_EQ(expect_id(kids[0], 'a'), id);
        CHECK_EQ(expect_id(kids[1], 'a'), id);
        CHECK_EQ(refs_of(k.obs, id), 2);

        h_child_kill9(prod);
        h_child_free(prod);
        for (int i = 0; i < 2; i++) {
                h_child_expect(kids[i], 'R', H_SOON_MS, reason, sizeof(reason));
                CHECKF(strstr(reason, "disconnected") || strstr(reason, "died") || strstr(reason, "exited"),
                       "revoke reason: %s", reason);
                h_child_wait_ok(kids[i], H_SOON_MS);
                h_child_free(kids[i]);
        }
        /* The subscriber heard of it too; the buffer and its fd are gone. */
        CHECK_OK(watcher, h_next_event_of(watcher, GPUIPC_EVENT_REVOKED, H_SOON_MS, &ev));
        CHECK_EQ(ev.buffer, id);
        CHECK_EQ(ev.subscription, sub);
        CHECK_EQ(h_stat_id(k.obs, id, &st), GPUIPC_E_NOT_FOUND);
        CHECK_EQ(h_list_count(k.obs, "doomed/"), 0);
        CHECK_EQ(h_stats(k.obs, "held_fds"), held);
        CHECK_EQ(h_stats(k.obs, "revokes_total"), 1);
        gpuipc_close(watcher);
        h_case_end(&k);
}

/* A broker-held buffer outlives its SIGKILLed producer: still attachable with the producer's data, retirable by a
 * peer of its uid, and forgotten once its consumers let go. */
static void test_broker_held_survives_producer(void)
{
        PeerArg arg;
        HChild *prod, *kids[2], *retire;
        gpuipc_t *watcher;
        gpuipc_event_t ev;
        uint64_t id, sub, held;
        HStat st;
        HCase k;
        char *out;

        h_case_begin(&k, NULL);
        watcher = h_connect(k.broker, "watcher");
        CHECK_OK(watcher, gpuipc_subscribe(watcher, "held/", &sub));
        held = h_stats(k.obs, "held_fds");
        arg = (PeerArg){ k.broker, "held/x", NULL, 1 << 20, 0x4e1d, true };
        prod = h_spawn("producer", producer, &arg);
        id = expect_id(prod, 'p');
        h_child_kill9(prod);
        h_child_free(prod);

        /* The producer is gone; its buffer is not. */
        WAIT_UNTIL(h_stats(k.obs, "buffers_orphaned") == 1, H_SOON_MS);
        CHECK_OK(k.obs, h_stat(k.obs, "held/x", &st));
        CHECK_EQ(st.buffer, id);
        CHECK_EQ(st.state, PROTO_STATE_LIVE);
        CHECK_EQ(st.owner, 0);
        CHECK(st.broker_held);
        CHECK_EQ(h_stats(k.obs, "held_fds"), held + 1);
        CHECK_EQ(h_list_count(k.obs, "held/"), 1);

        /* New consumers attach and see the producer's data. */
        kids[0] = h_spawn("late-consumer-0", holder, &arg);
        kids[1] = h_spawn("late-consumer-1", holder, &arg);
        CHECK_EQ(expect_id(kids[0], 'a'), id);
        CHECK_EQ(expect_id(kids[1], 'a'), id);

        /* A peer of the producer's uid retires it. */
        retire = h_spawn_ctl(k.broker, "ctl-retire", "retire", "held/x", NULL);
        h_child_wait_ok(retire, H_SOON_MS);
        out = h_child_output(retire);
        CHECKF(strstr(out, "retired"), "gpuipcctl retire said: %s", out);
        free(out);
        h_child_free(retire);
        CHECK_OK(k.obs, h_stat_id(k.obs, id, &st));
        CHECK_EQ(st.state, PROTO_STATE_RETIRED);
        CHECK_EQ(st.refs, 2);
        CHECK_EQ(h_stats(k.obs, "held_fds"), held + 1);

        /* One consumer releases, the other dies: then it drains and the broker forgets it. */
        h_child_tell(kids[0], 'r');
        h_child_expect(kids[0], 'd', H_SOON_MS, NULL, 0);
        h_child_wait_ok(kids[0], H_SOON_MS);
        CHECK_EQ(refs_of(k.obs, id), 1);
        CHECK_EQ(h_list_count(k.obs, "held/"), 1);
        h_child_kill9(kids[1]);
        WAIT_UNTIL(h_list_count(k.obs, "held/") == 0, H_SOON_MS);
        CHECK_EQ(h_stat_id(k.obs, id, &st), GPUIPC_E_NOT_FOUND);
        CHECK_EQ(h_stats(k.obs, "held_fds"), held);
        CHECK_EQ(h_stats(k.obs, "buffers_orphaned"), 0);
        for (int i = 0; i < 2; i++)
                h_child_free(kids[i]);

        CHECK_OK(watcher, h_next_event_of(watcher, GPUIPC_EVENT_RETIRED, H_SOON_MS, &ev));
        CHECK_EQ(ev.buffer, id);
        CHECK_OK(watcher, h_next_event_of(watcher, GPUIPC_EVENT_DRAINED, H_SOON_MS, &ev));
        CHECK_EQ(ev.buffer, id);
        gpuipc_close(watcher);
        h_case_end(&k);
}

/* Attaches, then forks a process that keeps a copy of the connection open (and stays when we
 * die), reports 'a' with that process's pid, and waits to be killed. */
static int consumer_with_heir(HChan *ch, void *arg)
{
        const PeerArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "consumer-with-heir");
        pid_t heir;

        h_attach_verify(c, a->name, H_SOON_MS, a->seed);
        heir = fork();
        CHECK(heir >= 0);
        if (heir == 0) {
                for (;;)
                        pause();
        }
        h_report(ch, 'a', "%d", (int)heir);
        h_await(ch, 'x', 120000);
        return 0;
}

/* The connection outlives the process (a forked child holds it): the broker learns of the death
 * from the pidfd, not from the socket. */
static void test_consumer_kill9_socket_outlives_it(void)
{
        PeerArg arg;
        gpuipc_t *prod;
        gpuipc_buffer_t *b;
        HChild *victim;
        HStat st;
        HCase k;
        char text[32];
        pid_t heir;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "producer");
        b = h_publish(prod, "heir/x", 4096, 3, NULL);
        arg = (PeerArg){ k.broker, "heir/x", NULL, 0, 3, false };
        victim = h_spawn("victim", consumer_with_heir, &arg);
        h_child_expect(victim, 'a', H_SOON_MS, text, sizeof(text));
        heir = (pid_t)atoi(text);
        CHECK(heir > 0);
        CHECK_OK(k.obs, h_stat(k.obs, "heir/x", &st));
        CHECK_EQ(st.refs, 1);
        h_child_kill9(victim);
        h_child_free(victim);
        WAIT_UNTIL(h_stat(k.obs, "heir/x", &st) == 0 && st.refs == 0, H_SOON_MS);
        CHECK_OK(prod, gpuipc_retire(prod, b));
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
        CHECK(kill(heir, SIGKILL) == 0);
        gpuipc_close(prod);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_consumer_kill9_releases_refs),      H_TEST(test_waiting_consumer_kill9),
                H_TEST(test_consumer_kill9_socket_outlives_it), H_TEST(test_producer_kill9_revokes),
                H_TEST(test_broker_held_survives_producer),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
