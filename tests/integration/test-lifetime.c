/* The lifetime contract against the real broker: fan-out to many consumer processes, attach before
 * publish (the rendezvous) and its timeout, retire -> drained only after the last release, and
 * retire_after. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "internal.h"

#define FANOUT_CONSUMERS     32
#define FANOUT_CLI_CONSUMERS 4

typedef struct ConsumerArg {
        const HBroker *broker;
        const char *name;
        uint64_t seed;
        int timeout_ms;
        bool announce; /* report 'c' once connected, before attaching */
} ConsumerArg;

/* Attaches and verifies (reporting 'a' with the buffer id and when the attach returned), holds the
 * reference until told 'r', releases and reports 'd'. */
static int consumer(HChan *ch, void *arg)
{
        const ConsumerArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "consumer");
        gpuipc_buffer_t *b;
        uint64_t returned;

        if (a->announce)
                h_report(ch, 'c', "connected");
        b = h_attach_verify(c, a->name, a->timeout_ms, a->seed);
        returned = monotonic_ms();
        h_report(ch, 'a', "%" PRIu64 " %" PRIu64, gpuipc_buffer_id(b), returned);
        h_await(ch, 'r', 60000);
        CHECK(!gpuipc_buffer_revoked(b));
        h_verify(b, a->seed);
        CHECK_OK(c, gpuipc_release(c, b));
        CHECK_OK(c, gpuipc_ping(c, H_SOON_MS));
        h_report(ch, 'd', "released");
        gpuipc_close(c);
        return 0;
}

/* Expects the child's 'a' report for buffer id; *ret_at: when its attach returned (monotonic ms,
 * the same clock in every process). */
static void expect_attached(HChild *child, uint64_t id, uint64_t *ret_at)
{
        char text[256];
        unsigned long long got = 0, at = 0;

        h_child_expect(child, 'a', H_SOON_MS, text, sizeof(text));
        CHECK(sscanf(text, "%llu %llu", &got, &at) == 2);
        CHECK_EQ(got, id);
        if (ret_at)
                *ret_at = at;
}

/* Releases in the child and waits for it to exit cleanly. */
static void release_child(HChild *child)
{
        h_child_tell(child, 'r');
        h_child_expect(child, 'd', H_SOON_MS, NULL, 0);
        h_child_wait_ok(child, H_SOON_MS);
        h_child_free(child);
}

/* 32 consumers (processes and gpuipcctl) attach one buffer and verify its bytes; it drains only after every one
 * released it, and the broker then forgets it. */
static void test_fanout_32_consumers(void)
{
        const size_t size = 1u << 20;
        const uint64_t seed = 7;
        ConsumerArg arg;
        HChild *kids[FANOUT_CONSUMERS], *cli[FANOUT_CLI_CONSUMERS];
        gpuipc_t *prod;
        gpuipc_buffer_t *b;
        uint64_t id;
        HStat st;
        HCase k;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "producer");
        b = h_publish(prod, "fan/frame", size, seed, NULL);
        arg = (ConsumerArg){ k.broker, "fan/frame", seed, H_SOON_MS };
        for (int i = 0; i < FANOUT_CONSUMERS; i++) {
                char name[32];
                snprintf(name, sizeof(name), "consumer-%d", i);
                kids[i] = h_spawn(name, consumer, &arg);
        }
        for (int i = 0; i < FANOUT_CONSUMERS; i++)
                expect_attached(kids[i], gpuipc_buffer_id(b), NULL);
        CHECK_OK(k.obs, h_stat(k.obs, "fan/frame", &st));
        CHECK_EQ(st.refs, FANOUT_CONSUMERS);
        CHECK_EQ(st.holders, FANOUT_CONSUMERS);
        CHECK_EQ(h_stats(k.obs, "peers"), FANOUT_CONSUMERS + 4);

        /* gpuipcctl consumers alongside, with their own pattern check. */
        for (int i = 0; i < FANOUT_CLI_CONSUMERS; i++) {
                char name[32];
                snprintf(name, sizeof(name), "ctl-attach-%d", i);
                cli[i] = h_spawn_ctl(k.broker, name, "attach", "fan/frame", "--verify", "random:7",
                                     "--wait", "5000", NULL);
        }
        for (int i = 0; i < FANOUT_CLI_CONSUMERS; i++) {
                char *out;

                h_child_wait_ok(cli[i], H_SOON_MS);
                out = h_child_output(cli[i]);
                CHECKF(strstr(out, "verified 1048576 bytes"), "gpuipcctl attach said: %s", out);
                free(out);
                h_child_free(cli[i]);
        }
        CHECK_OK(k.obs, h_stat(k.obs, "fan/frame", &st));
        CHECK_EQ(st.refs, FANOUT_CONSUMERS);

        /* Retired with 32 references: not drained until every consumer let go. */
        CHECK_OK(prod, gpuipc_retire(prod, b));
        CHECK_ERR(prod, gpuipc_wait_drained(prod, b, 50), GPUIPC_E_TIMEOUT);
        for (int i = 0; i < FANOUT_CONSUMERS; i++)
                release_child(kids[i]);
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
        CHECK_OK(k.obs, h_stat_id(k.obs, gpuipc_buffer_id(b), &st));
        CHECK_EQ(st.state, PROTO_STATE_IDLE);
        CHECK_EQ(st.refs, 0);
        id = gpuipc_buffer_id(b);
        CHECK_OK(prod, gpuipc_buffer_free(prod, b));
        CHECK_EQ(h_stat_id(k.obs, id, &st), GPUIPC_E_NOT_FOUND);
        gpuipc_close(prod);
        h_case_end(&k);
}

/* Attaches for a name not yet published wait in the broker and return because of the publish, not before it, with
 * the data. */
static void test_attach_waits_for_publish(void)
{
        const uint64_t seed = 0xfeed;
        ConsumerArg arg;
        HChild *waiters[2];
        gpuipc_t *prod;
        gpuipc_buffer_t *b;
        uint64_t names, t_publish, returned;
        HStat st;
        HCase k;

        h_case_begin(&k, NULL);
        names = h_stats(k.obs, "names");
        arg = (ConsumerArg){ k.broker, "late/one", seed, 30000, true };
        waiters[0] = h_spawn("waiter-0", consumer, &arg);
        waiters[1] = h_spawn("waiter-1", consumer, &arg);
        h_child_expect(waiters[0], 'c', H_SOON_MS, NULL, 0);
        h_child_expect(waiters[1], 'c', H_SOON_MS, NULL, 0);
        /* Both are parked in the broker: two waits, one name, nothing published. */
        WAIT_UNTIL(h_stats(k.obs, "waits") == 2, H_SOON_MS);
        CHECK_EQ(h_stats(k.obs, "names"), names + 1);
        CHECK_EQ(h_stat(k.obs, "late/one", &st), GPUIPC_E_NOT_FOUND);
        CHECK_EQ(h_list_count(k.obs, "late/"), 0);
        CHECK(h_child_quiet(waiters[0]) && h_child_quiet(waiters[1]));

        prod = h_connect(k.broker, "late-producer");
        t_publish = monotonic_ms();
        b = h_publish(prod, "late/one", 200000, seed, NULL);
        for (int i = 0; i < 2; i++) {
                /* The attach returned because of the publish, not before it. */
                expect_attached(waiters[i], gpuipc_buffer_id(b), &returned);
                CHECK(returned >= t_publish);
        }
        CHECK_EQ(h_stats(k.obs, "waits"), 0);
        CHECK_OK(k.obs, h_stat(k.obs, "late/one", &st));
        CHECK_EQ(st.refs, 2);
        release_child(waiters[0]);
        release_child(waiters[1]);
        CHECK_OK(prod, gpuipc_retire(prod, b));
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
        CHECK_OK(prod, gpuipc_buffer_free(prod, b));
        gpuipc_close(prod);
        CHECK_EQ(h_stats(k.obs, "names"), names);
        h_case_end(&k);
}

/* An attach for a name nobody publishes times out after its timeout, naming the name, and leaves no wait behind: a
 * later publish gives it no reference (gpuipcctl reports the same). */
static void test_attach_timeout(void)
{
        gpuipc_t *c, *prod;
        gpuipc_buffer_t *b = NULL, *late;
        uint64_t names, t0, elapsed;
        HChild *ctl;
        HStat st;
        HCase k;
        char *out;

        h_case_begin(&k, NULL);
        names = h_stats(k.obs, "names");
        c = h_connect(k.broker, "impatient");
        t0 = monotonic_ms();
        CHECK_ERR(c, gpuipc_attach(c, "never/there", 300, &b), GPUIPC_E_TIMEOUT);
        elapsed = monotonic_ms() - t0;
        h_log("attach timed out after %" PRIu64 " ms (asked for 300)", elapsed);
        CHECKF(elapsed >= 250 && elapsed <= 300 + 3000, "attach with a 300 ms timeout took %" PRIu64 " ms",
               elapsed);
        CHECK(b == NULL);
        CHECKF(strstr(gpuipc_errmsg(c), "never/there"), "errmsg: %s", gpuipc_errmsg(c));
        /* The wait is gone, the name entry too, the connection still works. */
        CHECK_EQ(h_stats(k.obs, "waits"), 0);
        CHECK_EQ(h_stats(k.obs, "timeouts_total"), 1);
        CHECK_EQ(h_stats(k.obs, "names"), names);
        CHECK_OK(c, gpuipc_ping(c, H_SOON_MS));
        CHECK_ERR(c, gpuipc_attach(c, "never/there", 0, &b), GPUIPC_E_NOT_FOUND);

        /* Publishing the name afterwards gives the timed-out consumer no reference. */
        prod = h_connect(k.broker, "too-late-producer");
        late = h_publish(prod, "never/there", 4096, 3, NULL);
        CHECK_OK(k.obs, h_stat(k.obs, "never/there", &st));
        CHECK_EQ(st.refs, 0);
        CHECK_OK(prod, gpuipc_retire(prod, late));
        CHECK_OK(prod, gpuipc_wait_drained(prod, late, H_SOON_MS));
        CHECK_OK(prod, gpuipc_buffer_free(prod, late));
        gpuipc_close(prod);

        /* The CLI reports the same timeout, with the broker's reason. */
        t0 = monotonic_ms();
        ctl = h_spawn_ctl(k.broker, "ctl-attach", "attach", "never/cli", "--wait", "200", NULL);
        CHECK_EQ(h_child_wait(ctl, H_SOON_MS), 1);
        elapsed = monotonic_ms() - t0;
        out = h_child_output(ctl);
        CHECKF(strstr(out, "never/cli") && elapsed >= 150, "gpuipcctl attach (%" PRIu64 " ms) said: %s",
               elapsed, out);
        free(out);
        h_child_free(ctl);
        gpuipc_close(c);
        h_case_end(&k);
}

/* A retired buffer takes no new attaches and drains exactly when its last reference goes (never earlier);
 * subscribers see publish, retire, drain in order, and the memory may be published again. */
static void test_drained_after_last_release(void)
{
        const uint64_t seed = 42;
        ConsumerArg arg;
        HChild *kids[3];
        gpuipc_t *prod, *watcher, *c2;
        gpuipc_buffer_t *b, *again, *view = NULL;
        gpuipc_event_t ev;
        uint64_t sub, gen;
        HStat st;
        HCase k;
        int r;

        h_case_begin(&k, NULL);
        watcher = h_connect(k.broker, "watcher");
        CHECK_OK(watcher, gpuipc_subscribe(watcher, "drain/", &sub));
        prod = h_connect(k.broker, "producer");
        b = h_publish(prod, "drain/me", 256 << 10, seed, NULL);
        gen = gpuipc_buffer_generation(b);
        arg = (ConsumerArg){ k.broker, "drain/me", seed, H_SOON_MS };
        for (int i = 0; i < 3; i++) {
                char name[32];
                snprintf(name, sizeof(name), "holder-%d", i);
                kids[i] = h_spawn(name, consumer, &arg);
                expect_attached(kids[i], gpuipc_buffer_id(b), NULL);
        }
        CHECK_OK(prod, gpuipc_retire(prod, b));
        CHECK_OK(k.obs, h_stat_id(k.obs, gpuipc_buffer_id(b), &st));
        CHECK_EQ(st.state, PROTO_STATE_RETIRED);
        CHECK_EQ(st.refs, 3);
        /* Retired: no new attaches, by name or by id. */
        c2 = h_connect(k.broker, "latecomer");
        CHECK_ERR(c2, gpuipc_attach(c2, "drain/me", 0, &view), GPUIPC_E_NOT_FOUND);
        CHECK_ERR(c2, gpuipc_attach_id(c2, gpuipc_buffer_id(b), &view), GPUIPC_E_STATE);

        for (int i = 0; i < 3; i++) {
                h_child_tell(kids[i], 'r');
                h_child_expect(kids[i], 'd', H_SOON_MS, NULL, 0);
                /* A ping's reply comes after anything the broker sent us because of that release. */
                CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
                if (i < 2) {
                        CHECK_ERR(prod, gpuipc_wait_drained(prod, b, 0), GPUIPC_E_TIMEOUT);
                        while ((r = gpuipc_next_event(prod, 0, &ev)) == 0)
                                CHECKF(ev.type != GPUIPC_EVENT_DRAINED, "drained with %d references left",
                                       2 - i);
                        CHECK_OK(k.obs, h_stat_id(k.obs, gpuipc_buffer_id(b), &st));
                        CHECK_EQ(st.refs, 2 - i);
                        CHECK_EQ(st.state, PROTO_STATE_RETIRED);
                }
                h_child_wait_ok(kids[i], H_SOON_MS);
                h_child_free(kids[i]);
        }
        CHECK_OK(prod, h_next_event_of(prod, GPUIPC_EVENT_DRAINED, H_SOON_MS, &ev));
        CHECK_EQ(ev.buffer, gpuipc_buffer_id(b));
        CHECK_EQ(ev.generation, gen);
        CHECK_EQ(ev.subscription, 0);
        CHECK(strcmp(ev.name, "drain/me") == 0);
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, 0));

        /* The subscriber saw publish, retire, drain, in that order. */
        CHECK_OK(watcher, gpuipc_next_event(watcher, H_SOON_MS, &ev));
        CHECK_EQ(ev.type, GPUIPC_EVENT_PUBLISHED);
        CHECK_EQ(ev.subscription, sub);
        CHECK_OK(watcher, gpuipc_next_event(watcher, H_SOON_MS, &ev));
        CHECK_EQ(ev.type, GPUIPC_EVENT_RETIRED);
        CHECK_OK(watcher, gpuipc_next_event(watcher, H_SOON_MS, &ev));
        CHECK_EQ(ev.type, GPUIPC_EVENT_DRAINED);
        CHECK_EQ(ev.buffer, gpuipc_buffer_id(b));

        /* Drained memory may be reused: publish it again (new data, new generation). */
        h_pattern_fill(gpuipc_buffer_ptr(b), gpuipc_buffer_size(b), seed + 1);
        CHECK_OK(prod, gpuipc_publish(prod, b, "drain/again", NULL));
        CHECK(gpuipc_buffer_generation(b) > gen);
        again = h_attach_verify(c2, "drain/again", 0, seed + 1);
        CHECK_OK(prod, gpuipc_retire(prod, b));
        CHECK_ERR(prod, gpuipc_wait_drained(prod, b, 50), GPUIPC_E_TIMEOUT);
        CHECK_OK(c2, gpuipc_release(c2, again));
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
        CHECK_OK(prod, gpuipc_buffer_free(prod, b));
        gpuipc_close(c2);
        gpuipc_close(prod);
        gpuipc_close(watcher);
        h_case_end(&k);
}

/* retire_after=3 retires a buffer on its third attach: a fourth consumer finds nothing, and it drains once the
 * three release. */
static void test_retire_after(void)
{
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .retire_after = 3 };
        gpuipc_t *prod, *cons[4];
        gpuipc_buffer_t *b, *views[3], *extra = NULL;
        HStat st;
        HCase k;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "producer");
        b = h_publish(prod, "once/three", 8192, 9, &po);
        for (int i = 0; i < 4; i++)
                cons[i] = h_connect(k.broker, "consumer");
        for (int i = 0; i < 3; i++)
                views[i] = h_attach_verify(cons[i], "once/three", 0, 9);
        /* The third attach retired it. */
        CHECK_ERR(cons[3], gpuipc_attach(cons[3], "once/three", 0, &extra), GPUIPC_E_NOT_FOUND);
        CHECK_OK(k.obs, h_stat_id(k.obs, gpuipc_buffer_id(b), &st));
        CHECK_EQ(st.state, PROTO_STATE_RETIRED);
        CHECK_EQ(st.refs, 3);
        for (int i = 0; i < 3; i++)
                CHECK_OK(cons[i], gpuipc_release(cons[i], views[i]));
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
        CHECK_OK(prod, gpuipc_buffer_free(prod, b));
        for (int i = 0; i < 4; i++)
                gpuipc_close(cons[i]);
        gpuipc_close(prod);
        h_case_end(&k);
}

/* A consumer's mapping is cached: the buffer's fd travels to a peer once, until the peer drops
 * the mapping (unmap) or the broker forgets the buffer (freed event). */
static void test_fd_travels_once_per_peer(void)
{
        gpuipc_t *prod, *c;
        gpuipc_buffer_t *b, *v[3];
        uint64_t fds0;
        HCase k;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "producer");
        b = h_publish(prod, "cache/x", 64 << 10, 77, NULL);
        c = h_connect(k.broker, "consumer");
        fds0 = h_stats(k.obs, "fds_out_total");
        for (int i = 0; i < 3; i++)
                v[i] = h_attach_verify(c, "cache/x", 0, 77);
        CHECK_EQ(h_stats(k.obs, "fds_out_total"), fds0 + 1);
        CHECK_EQ(h_stats(k.obs, "attaches_cached_total"), 2);
        for (int i = 0; i < 3; i++)
                CHECK_OK(c, gpuipc_release(c, v[i]));
        /* Released but still mapped here: the next attach costs no fd either. */
        v[0] = h_attach_verify(c, "cache/x", 0, 77);
        CHECK_OK(c, gpuipc_release(c, v[0]));
        CHECK_EQ(h_stats(k.obs, "fds_out_total"), fds0 + 1);
        /* Dropping the cache tells the broker, which then sends the fd again. */
        gpuipc_cache_trim(c);
        CHECK_OK(c, gpuipc_ping(c, H_SOON_MS));
        v[0] = h_attach_verify(c, "cache/x", 0, 77);
        CHECK_OK(c, gpuipc_release(c, v[0]));
        CHECK_EQ(h_stats(k.obs, "fds_out_total"), fds0 + 2);
        /* The producer frees it: the consumer is told and drops its idle mapping. */
        CHECK_OK(prod, gpuipc_retire(prod, b));
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
        CHECK_OK(prod, gpuipc_buffer_free(prod, b));
        CHECK_OK(c, gpuipc_ping(c, H_SOON_MS));
        CHECK_EQ(c->n_idle, 0);
        CHECK_EQ(h_stats(k.obs, "held_fds"), 1); /* the bystander's */
        gpuipc_close(c);
        gpuipc_close(prod);
        h_case_end(&k);
}

/* A consumer has one way to drop a buffer, gpuipc_release: gpuipc_buffer_free (the producer's call)
 * on an attached buffer is refused, naming the right call, and leaves the reference in place. */
static void test_consumer_cannot_free(void)
{
        gpuipc_t *prod, *c;
        gpuipc_buffer_t *b, *v;
        HStat st;
        HCase k;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "producer");
        b = h_publish(prod, "drop/one-way", 4096, 5, NULL);
        c = h_connect(k.broker, "consumer");
        v = h_attach_verify(c, "drop/one-way", 0, 5);
        CHECK_ERR(c, gpuipc_buffer_free(c, v), GPUIPC_E_INVALID);
        CHECKF(strstr(gpuipc_errmsg(c), "gpuipc_release"), "errmsg: %s", gpuipc_errmsg(c));
        CHECK_OK(k.obs, h_stat(k.obs, "drop/one-way", &st));
        CHECK_EQ(st.refs, 1);
        CHECK_EQ(h_pattern_check(gpuipc_buffer_ptr(v), gpuipc_buffer_size(v), 5), SIZE_MAX); /* still mapped */
        CHECK_OK(c, gpuipc_release(c, v));
        CHECK_OK(k.obs, h_stat(k.obs, "drop/one-way", &st));
        CHECK_EQ(st.refs, 0);
        CHECK_OK(prod, gpuipc_buffer_free(prod, b));
        gpuipc_close(c);
        gpuipc_close(prod);
        h_case_end(&k);
}

/* gpuipc_errmsg names the cause of the call that failed: a message that the call found nothing to
 * say about is a failure too, and one that still speaks of "bad name" a stale one. */
static void check_fresh(gpuipc_t *c, const char *call, const char *needle)
{
        const char *msg = gpuipc_errmsg(c);

        CHECKF(msg[0] && !strstr(msg, "bad name"), "%s: errmsg '%s'", call, msg);
        CHECKF(strstr(msg, needle), "%s: errmsg '%s' does not say '%s'", call, msg, needle);
}

/* Every failing call says why in gpuipc_errmsg, never in an older failure's words: after an attach
 * refused for its name, calls refused by the library itself (no request made) each name their own
 * cause, and a call that succeeds leaves nothing behind. */
static void test_errmsg_never_stale(void)
{
        gpuipc_t *prod, *c;
        gpuipc_buffer_t *b = NULL, *own, *v;
        HCase k;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "producer");
        own = h_publish(prod, "errmsg/own", 4096, 3, NULL);
        c = h_connect(k.broker, "consumer");
        v = h_attach_verify(c, "errmsg/own", 0, 3);

        CHECK_ERR(c, gpuipc_attach(c, "bad name", 0, &b), GPUIPC_E_INVALID);
        CHECKF(strstr(gpuipc_errmsg(c), "bad name"), "errmsg: %s", gpuipc_errmsg(c));
        CHECK_ERR(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, SIZE_MAX, 0, &b), GPUIPC_E_INVALID);
        check_fresh(c, "alloc SIZE_MAX", "GPUIPC_MAX_BUFFER_SIZE");

        CHECK_ERR(c, gpuipc_attach(c, "bad name", 0, &b), GPUIPC_E_INVALID);
        CHECK_ERR(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, 0, 0, &b), GPUIPC_E_INVALID);
        check_fresh(c, "alloc 0", "at least 1 byte");

        CHECK_ERR(c, gpuipc_attach(c, "bad name", 0, &b), GPUIPC_E_INVALID);
        CHECK_ERR(c, gpuipc_publish(c, v, "errmsg/again", NULL), GPUIPC_E_INVALID);
        check_fresh(c, "publish of an attached buffer", "not this connection's own");

        CHECK_ERR(c, gpuipc_attach(c, "bad name", 0, &b), GPUIPC_E_INVALID);
        CHECK_ERR(c, gpuipc_retire(c, v), GPUIPC_E_INVALID);
        check_fresh(c, "retire of an attached buffer", "not this connection's own");

        CHECK_ERR(c, gpuipc_attach(c, "bad name", 0, &b), GPUIPC_E_INVALID);
        CHECK_ERR(c, gpuipc_set_device(c, -2), GPUIPC_E_INVALID);
        check_fresh(c, "set_device -2", "device -2");

        CHECK_ERR(c, gpuipc_attach(c, "bad name", 0, &b), GPUIPC_E_INVALID);
        CHECK_ERR(c, gpuipc_buffer_copy_in(v, NULL, 0, NULL), -EACCES);
        check_fresh(c, "copy into a read-only buffer", "read-only");

        CHECK_ERR(prod, gpuipc_attach(prod, "bad name", 0, &b), GPUIPC_E_INVALID);
        CHECK_ERR(prod, gpuipc_release(prod, own), GPUIPC_E_INVALID);
        check_fresh(prod, "release of an own buffer", "gpuipc_buffer_free");

        /* A success says nothing (the old message does not survive it either). */
        CHECK_ERR(c, gpuipc_attach(c, "bad name", 0, &b), GPUIPC_E_INVALID);
        CHECK_OK(c, gpuipc_ping(c, 5000));
        CHECK_STREQ(gpuipc_errmsg(c), "");

        CHECK_OK(c, gpuipc_release(c, v));
        CHECK_OK(prod, gpuipc_retire(prod, own));
        CHECK_OK(prod, gpuipc_wait_drained(prod, own, 5000));
        CHECK_OK(prod, gpuipc_buffer_free(prod, own));
        gpuipc_close(c);
        gpuipc_close(prod);
        h_case_end(&k);
}

/* One size limit for every way of making a buffer (gpuipc_buffer_alloc, a pool's segment, a ring's
 * slots): a memfd larger than the memory available is refused at once with -ENOMEM saying so, and
 * nothing is published; more than GPUIPC_MAX_BUFFER_SIZE is refused for every kind. */
static void test_one_size_limit(void)
{
        gpuipc_pool_options_t po = { .struct_size = sizeof(po), .kind = GPUIPC_KIND_MEMFD };
        gpuipc_ring_options_t ro = { .struct_size = sizeof(ro), .kind = GPUIPC_KIND_MEMFD };
        const char *where;
        gpuipc_buffer_t *b = NULL;
        gpuipc_ring_t *r = NULL;
        gpuipc_pool_t *p = NULL;
        uint64_t avail = size_limit_host_memory(&where);
        size_t over;
        void *ptr;
        gpuipc_t *c;
        HCase k;

        if (avail == UINT64_MAX || avail > SIZE_MAX / 4)
                h_skip("the memory available is unknown, or more than a size_t can double");
        over = (size_t)avail * 2 + 4096;
        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "producer");
        CHECK_ERR(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, over, 0, &b), -ENOMEM);
        CHECKF(strstr(gpuipc_errmsg(c), "more than the"), "errmsg: %s", gpuipc_errmsg(c));
        CHECK_ERR(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_CUDA_VMM, (size_t)GPUIPC_MAX_BUFFER_SIZE + 1, 0, &b),
                  GPUIPC_E_INVALID);
        CHECKF(strstr(gpuipc_errmsg(c), "GPUIPC_MAX_BUFFER_SIZE"), "errmsg: %s", gpuipc_errmsg(c));

        CHECK_OK(c, gpuipc_pool_new(c, &po, &p));
        CHECK_ERR(c, gpuipc_pool_alloc(p, over, &ptr), -ENOMEM);
        CHECK_OK(c, gpuipc_pool_alloc(p, 4096, &ptr)); /* the pool still serves what fits */
        CHECK_OK(c, gpuipc_pool_free(p, ptr));
        CHECK_OK(c, gpuipc_pool_close(p));

        ro.slot_size = over;
        CHECK_ERR(c, gpuipc_ring_create(c, "size/ring", &ro, &r), -ENOMEM);
        CHECKF(strstr(gpuipc_errmsg(c), "more than the"), "errmsg: %s", gpuipc_errmsg(c));
        CHECK_EQ(h_list_count(k.obs, "size/"), 0u);
        gpuipc_close(c);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_fanout_32_consumers), H_TEST(test_attach_waits_for_publish),
                H_TEST(test_attach_timeout),      H_TEST(test_drained_after_last_release),
                H_TEST(test_retire_after),        H_TEST(test_fd_travels_once_per_peer),
                H_TEST(test_consumer_cannot_free), H_TEST(test_errmsg_never_stale),
                H_TEST(test_one_size_limit),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
