/* Signals to the broker: SIGTERM while peers are connected and waits are pending (every peer hears
 * why, nothing hangs), SIGHUP reloading the policy, and SIGSTOP (a broker that stalls: a request
 * times out, and the reply that comes after SIGCONT leaves nothing wrong behind: an attach's, a
 * publish's, a subscribe's). Restarts are test-reconnect.c's. */
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

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
        h_report(ch, 'r', "%d %" PRIu64 " %s", r, monotonic_ms(), gpuipc_errmsg(c));
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
        h_report(ch, 'r', "%d %" PRIu64 " %s", r, monotonic_ms(), gpuipc_errmsg(c));
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
        r = gpuipc_next_event(c, 60000, &ev);
        h_report(ch, 'r', "%d %" PRIu64 " %s", r, monotonic_ms(), gpuipc_errmsg(c));
        CHECK_OK(c, gpuipc_release(c, b));
        gpuipc_close(c);
        return 0;
}

/* SIGTERM with attaches, group joins, an event reader and a peer with unread output pending: every waiter is told
 * shutdown (or sees the hang-up) within 3 s and the broker exits cleanly. */
static void test_sigterm_with_pending_waits(void)
{
        static const char *const flags[] = { "--max-queued-bytes", "1048576", NULL };
        HChildFn fns[] = { attach_waiter, attach_waiter, group_waiter, group_waiter, event_waiter };
        HChild *kids[5];
        gpuipc_t *prod;
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .broker_held = 1 };
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

        t_stop = monotonic_ms();
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

/* A stalled broker (SIGSTOP: it still accepts, it never answers): an attach by id gives up at the
 * library's reply deadline. After SIGCONT the broker carries it out all the same: the late reply
 * brings a reference, which the library gives back, and the buffer's fd, after which the broker
 * counts on our cache to hold its mapping. The next attach must map the buffer (it failed with
 * "our cached mapping serves, but it is gone" before the library learned to recover) and, once
 * released, leave no reference behind. */
static void test_stalled_broker_late_reply(void)
{
        HBroker *b = h_broker_start(NULL);
        gpuipc_t *prod = h_connect(b, "producer"), *cons = h_connect(b, "consumer");
        gpuipc_buffer_t *buf = h_publish(prod, "stall/buf", 4096, 7, NULL), *got = NULL;
        uint64_t id = gpuipc_buffer_id(buf), t0;
        HStat st;
        int r;

        CHECK(kill(b->pid, SIGSTOP) == 0);
        t0 = monotonic_ms();
        r = gpuipc_attach_id(cons, id, &got);
        h_log("attach_id against a stopped broker: %d after %" PRIu64 " ms: %s", r, monotonic_ms() - t0,
              gpuipc_errmsg(cons));
        CHECK(kill(b->pid, SIGCONT) == 0);
        CHECKF(r == GPUIPC_E_TIMEOUT, "attach_id against a stopped broker: %d (%s)", r, gpuipc_errmsg(cons));
        CHECK(got == NULL);
        /* The late reply arrives while this request waits for its own. */
        CHECK_OK(cons, gpuipc_attach_id(cons, id, &got));
        h_verify(got, 7);
        CHECK_OK(cons, gpuipc_release(cons, got));
        CHECK_OK(cons, gpuipc_ping(cons, H_SOON_MS)); /* the late reference's release went out before */
        CHECK_OK(prod, h_stat_id(prod, id, &st));
        CHECKF(st.refs == 0 && st.holders == 0, "after the late reply and a release: %" PRIu64 " refs, %" PRIu64
               " holders", st.refs, st.holders);
        /* And once more: the mapping is cached now, so this attach is the broker's "cached" reply. */
        CHECK_OK(cons, gpuipc_attach_id(cons, id, &got));
        h_verify(got, 7);
        CHECK_OK(cons, gpuipc_release(cons, got));
        gpuipc_close(cons);
        CHECK_OK(prod, gpuipc_buffer_free(prod, buf));
        gpuipc_close(prod);
        h_broker_settle(b);
        h_broker_stop(b);
}

/* The late-publish and ring cases' cast: a broker, a producer and a consumer connected to it. */
typedef struct Stall {
        HBroker *b;
        gpuipc_t *prod, *cons;
} Stall;

static Stall stall_start(void)
{
        Stall k = { .b = h_broker_start(NULL) };

        k.prod = h_connect(k.b, "producer");
        k.cons = h_connect(k.b, "consumer");
        return k;
}

/* Both disconnect, and the broker must settle (nothing referenced, nothing waiting) before it stops. */
static void stall_end(Stall *k)
{
        gpuipc_close(k->cons);
        gpuipc_close(k->prod);
        h_broker_settle(k->b);
        h_broker_stop(k->b);
}

/* Allocates a memfd buffer filled with seed's pattern, unpublished. */
static gpuipc_buffer_t *filled_buffer(gpuipc_t *c, uint64_t seed)
{
        gpuipc_buffer_t *b = NULL;

        CHECK_OK(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, 4096, 0, &b));
        h_pattern_fill(gpuipc_buffer_ptr(b), 4096, seed);
        return b;
}

/* A publish against a stopped broker gives up at the reply deadline; the broker carries it out
 * after SIGCONT. What the caller was told (it failed) must become true, and b stay usable. */
static void publish_stalled(HBroker *b, gpuipc_t *prod, gpuipc_buffer_t *buf, const char *name)
{
        int r;

        CHECK(kill(b->pid, SIGSTOP) == 0);
        r = gpuipc_publish(prod, buf, name, NULL);
        CHECK(kill(b->pid, SIGCONT) == 0);
        CHECKF(r == GPUIPC_E_TIMEOUT, "publish against a stopped broker: %d (%s)", r, gpuipc_errmsg(prod));
}

/* The caller retries at once: its retry meets the late reply of the first publish (the broker says
 * the id is taken), and succeeds all the same; the producer hears no drained event for the
 * publication it never saw. */
static void test_stalled_broker_late_publish_retried(void)
{
        Stall k = stall_start();
        HBroker *b = k.b;
        gpuipc_t *prod = k.prod, *cons = k.cons;
        gpuipc_buffer_t *buf = filled_buffer(prod, 3), *got;
        gpuipc_event_t ev;
        HStat st;

        publish_stalled(b, prod, buf, "stall/retried");
        CHECK_OK(prod, gpuipc_publish(prod, buf, "stall/retried", NULL));
        got = h_attach_verify(cons, "stall/retried", 0, 3);
        CHECK_OK(prod, h_stat(prod, "stall/retried", &st));
        CHECKF(st.buffer == gpuipc_buffer_id(buf) && st.refs == 1, "the retried publish: buffer %" PRIx64
               " (ours %" PRIx64 "), %" PRIu64 " refs", st.buffer, gpuipc_buffer_id(buf), st.refs);
        CHECK_OK(cons, gpuipc_release(cons, got));
        CHECK(h_next_event_of(prod, GPUIPC_EVENT_DRAINED, 0, &ev) == GPUIPC_E_TIMEOUT);
        CHECK_OK(prod, gpuipc_retire(prod, buf));
        CHECK_OK(prod, h_next_event_of(prod, GPUIPC_EVENT_DRAINED, H_SOON_MS, &ev));
        CHECK(ev.buffer == gpuipc_buffer_id(buf));
        CHECK_OK(prod, gpuipc_buffer_free(prod, buf));
        stall_end(&k);
}

/* The caller does something else first: once the late reply is read, the publication is withdrawn
 * (no consumer finds the name), and publishing the buffer again works. */
static void test_stalled_broker_late_publish_withdrawn(void)
{
        Stall k = stall_start();
        HBroker *b = k.b;
        gpuipc_t *prod = k.prod, *cons = k.cons;
        gpuipc_buffer_t *buf = filled_buffer(prod, 4), *got = NULL;
        gpuipc_event_t ev;
        HStat st;
        int r;

        publish_stalled(b, prod, buf, "stall/withdrawn");
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS)); /* reads the late reply; the retire goes out */
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS)); /* answered after the retire */
        r = gpuipc_attach(cons, "stall/withdrawn", 0, &got);
        CHECKF(r == GPUIPC_E_NOT_FOUND, "attach of a withdrawn publication: %d (%s)", r, gpuipc_errmsg(cons));
        CHECK(h_stat(cons, "stall/withdrawn", &st) == GPUIPC_E_NOT_FOUND);
        CHECK_OK(prod, gpuipc_publish(prod, buf, "stall/withdrawn", NULL));
        got = h_attach_verify(cons, "stall/withdrawn", 0, 4);
        CHECK_OK(cons, gpuipc_release(cons, got));
        CHECK(h_next_event_of(prod, GPUIPC_EVENT_DRAINED, 0, &ev) == GPUIPC_E_TIMEOUT);
        CHECK_OK(prod, gpuipc_buffer_free(prod, buf));
        stall_end(&k);
}

/* The caller frees the buffer, and subscribes (that times out too), before the broker wakes: the
 * broker forgets the buffer and cancels the subscription once the late replies are read. */
static void test_stalled_broker_late_publish_freed(void)
{
        Stall k = stall_start();
        HBroker *b = k.b;
        gpuipc_t *prod = k.prod, *cons = k.cons;
        gpuipc_buffer_t *buf = filled_buffer(prod, 5);
        uint64_t id = gpuipc_buffer_id(buf), sub = 0;
        HStat st;
        int r;

        CHECK(kill(b->pid, SIGSTOP) == 0);
        r = gpuipc_publish(prod, buf, "stall/freed", NULL);
        CHECKF(r == GPUIPC_E_TIMEOUT, "publish against a stopped broker: %d (%s)", r, gpuipc_errmsg(prod));
        CHECK_OK(prod, gpuipc_buffer_free(prod, buf));
        r = gpuipc_subscribe(prod, "stall/", &sub);
        CHECK(kill(b->pid, SIGCONT) == 0);
        CHECKF(r == GPUIPC_E_TIMEOUT, "subscribe against a stopped broker: %d (%s)", r, gpuipc_errmsg(prod));
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS)); /* reads the late replies; free and unsubscribe go out */
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        r = h_stat_id(cons, id, &st);
        CHECKF(r == GPUIPC_E_NOT_FOUND, "stat of the freed buffer: %d", r);
        CHECKF(h_stats(cons, "subscriptions") == 0, "%" PRIu64 " subscriptions left", h_stats(cons, "subscriptions"));
        CHECKF(h_stats(cons, "held_fds") == 0, "%" PRIu64 " fds held", h_stats(cons, "held_fds"));
        stall_end(&k);
}

/* A ring's declaration that times out is closed again once the broker wakes: the name is free for
 * the producer's next try, and a member joins that ring. */
static void test_stalled_broker_late_ring_create(void)
{
        Stall k = stall_start();
        HBroker *b = k.b;
        gpuipc_t *prod = k.prod, *cons = k.cons;
        gpuipc_ring_options_t o = { .struct_size = sizeof(o), .slot_size = 4096, .slots = 2, .max_members = 1 };
        gpuipc_ring_t *ring = NULL, *member = NULL;
        int r;

        CHECK(kill(b->pid, SIGSTOP) == 0);
        r = gpuipc_ring_create(prod, "stall-ring", &o, &ring);
        CHECK(kill(b->pid, SIGCONT) == 0);
        CHECKF(r == GPUIPC_E_TIMEOUT && ring == NULL, "ring create against a stopped broker: %d (%s)", r,
               gpuipc_errmsg(prod));
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        CHECK_OK(prod, gpuipc_ring_create(prod, "stall-ring", &o, &ring));
        CHECK_OK(cons, gpuipc_ring_join(cons, "stall-ring", H_SOON_MS, &member));
        gpuipc_ring_close(member);
        gpuipc_ring_close(ring);
        stall_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_stalled_broker_late_reply),
                H_TEST(test_stalled_broker_late_publish_retried),
                H_TEST(test_stalled_broker_late_publish_withdrawn),
                H_TEST(test_stalled_broker_late_publish_freed),
                H_TEST(test_stalled_broker_late_ring_create),
                H_TEST(test_sigterm_with_pending_waits),
                H_TEST(test_sigterm_with_holders),
                H_TEST(test_policy_reload_on_sighup),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
