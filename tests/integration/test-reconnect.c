/* The lifetime contract across broker restarts and lost connections (docs/design.md "Broker
 * restarts"): buffer ids survive a restart and never reach another producer's buffer, consumers'
 * handles stay valid and their references are reclaimed, drained waits for every holder that came
 * back and for the restart grace, holders that never come back are treated as gone with a reason,
 * event-loop users reconnect on their own, a release after a revoke is no error, and a wall clock
 * stepped either way between broker starts costs no hold. */
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* Short enough to keep the cases quick, long enough for a loaded machine to reconnect within it. */
#define GRACE_MS 1500
#define GRACE_MS_STR "1500"

static const char *const grace_flags[] = { "--restart-grace-ms", GRACE_MS_STR, NULL };

static gpuipc_t *connect_reconnecting(const HBroker *b, const char *label)
{
        gpuipc_options_t o = { .struct_size = sizeof(o), .label = label,
                               .connect_timeout_ms = H_SOON_MS };
        gpuipc_t *c = NULL;
        int r = h_try_connect(b, &o, &c);

        CHECKF(r == 0, "connect: %s [%s]", gpuipc_strerror(r), gpuipc_errmsg(NULL));
        return c;
}

/* A clean stop (SIGTERM) or a crash (SIGKILL, which leaves the socket file behind), then a new
 * broker on the same socket. */
static void restart(HBroker *b, bool crash)
{
        if (crash) {
                h_broker_kill9(b);
                CHECKF(access(b->sock, F_OK) == 0, "a killed broker had no chance to remove its socket");
        } else {
                h_broker_stop(b);
        }
        h_broker_restart(b);
}

typedef struct Events {
        bool reconnected, drained, published, retired, revoked;
        uint64_t drained_gen, published_sub;
        char drained_reason[256], revoked_reason[256];
} Events;

static void take_events(gpuipc_t *c, Events *e)
{
        gpuipc_event_t ev;

        while (gpuipc_next_event(c, 0, &ev) == 0) {
                h_log("event %d on '%s' (sub %" PRIu64 ", reason '%s')", ev.type, ev.name, ev.subscription,
                      ev.reason);
                if (ev.type == GPUIPC_EVENT_RECONNECTED)
                        e->reconnected = true;
                if (ev.type == GPUIPC_EVENT_DRAINED && ev.subscription == 0) {
                        e->drained = true;
                        e->drained_gen = ev.generation;
                        snprintf(e->drained_reason, sizeof(e->drained_reason), "%s", ev.reason);
                }
                if (ev.type == GPUIPC_EVENT_PUBLISHED) {
                        e->published = true;
                        e->published_sub = ev.subscription;
                }
                if (ev.type == GPUIPC_EVENT_RETIRED && ev.subscription == 0)
                        e->retired = true;
                if (ev.type == GPUIPC_EVENT_REVOKED && ev.subscription == 0) {
                        e->revoked = true;
                        snprintf(e->revoked_reason, sizeof(e->revoked_reason), "%s", ev.reason);
                }
        }
}

/* Restarts the broker (cleanly, or after kill -9) under clients of both kinds and checks what
 * each sees: the producer's first call goes through, its live buffer keeps its id and comes back,
 * a reconnecting consumer's handles stay valid and count again, and the retired buffer does not
 * drain while a holder may still come back: only after the grace, saying why. */
static void restart_case(bool crash)
{
        gpuipc_t *prod, *plain, *again, *fresh, *obs, *other;
        gpuipc_buffer_t *live, *retired, *v_live, *v_ret, *v2, *v2r, *v3;
        uint64_t sub, t_restart;
        Events ev = { 0 };
        HBroker *b;
        HStat st;

        b = h_broker_start(grace_flags);
        prod = connect_reconnecting(b, "producer");
        again = connect_reconnecting(b, "reconnecting-consumer");
        plain = h_connect(b, "plain-consumer");
        CHECK_OK(prod, gpuipc_subscribe(prod, "restart/", &sub));
        live = h_publish(prod, "restart/live", 256 << 10, 0x11fe, NULL);
        retired = h_publish(prod, "restart/retired", 4096, 0x2e71, NULL);
        v_live = h_attach_verify(plain, "restart/live", 0, 0x11fe);
        v_ret = h_attach_verify(plain, "restart/retired", 0, 0x2e71);
        v2 = h_attach_verify(again, "restart/live", 0, 0x11fe);
        v2r = h_attach_verify(again, "restart/retired", 0, 0x2e71);
        CHECK_OK(prod, gpuipc_retire(prod, retired));
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        take_events(prod, &ev); /* publish events of its own subscription */

        restart(b, crash);
        t_restart = monotonic_ms();

        /* The producer's first call after the restart succeeds: it reconnects, registers both
         * buffers again under the same ids and hears of it. */
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        take_events(prod, &ev);
        CHECK(ev.reconnected);
        CHECKF(!ev.drained, "drained after the restart while two holders held it: '%s'", ev.drained_reason);
        obs = h_connect(b, "observer");
        CHECK_OK(obs, h_stat(obs, "restart/live", &st));
        CHECK_EQ(st.buffer, gpuipc_buffer_id(live));
        CHECK_EQ(st.generation, gpuipc_buffer_generation(live));
        CHECK_EQ(st.state, PROTO_STATE_LIVE);
        CHECK_OK(obs, h_stat_id(obs, gpuipc_buffer_id(retired), &st));
        CHECK_EQ(st.state, PROTO_STATE_RETIRED);
        CHECK_EQ(st.refs, 0); /* nobody has reclaimed yet */

        /* A new consumer attaches the restored buffer and sees the same bytes. */
        fresh = h_connect(b, "new-consumer");
        v3 = h_attach_verify(fresh, "restart/live", H_SOON_MS, 0x11fe);

        /* The reconnecting consumer: its next call reclaims both references, its handles work. */
        CHECK_OK(again, gpuipc_ping(again, H_SOON_MS));
        CHECK_OK(obs, h_stat(obs, "restart/live", &st));
        CHECK_EQ(st.refs, 2);
        CHECK_OK(obs, h_stat_id(obs, gpuipc_buffer_id(retired), &st));
        CHECK_EQ(st.refs, 1);
        h_verify(v2, 0x11fe);
        h_verify(v2r, 0x2e71);
        CHECK(!gpuipc_buffer_revoked(v2) && !gpuipc_buffer_revoked(v2r));
        CHECK_OK(again, gpuipc_release(again, v2r));

        /* Every holder that came back has released the retired buffer, but the plain consumer
         * (which never reconnects) might have: drained waits for the grace and says so. */
        CHECK_ERR(prod, gpuipc_wait_drained(prod, retired, 100), GPUIPC_E_TIMEOUT);
        CHECK_OK(prod, gpuipc_wait_drained(prod, retired, H_SOON_MS));
        CHECKF(monotonic_ms() - t_restart >= GRACE_MS - 200,
               "drained %" PRIu64 " ms after the restart, before the %d ms "
               "grace", monotonic_ms() - t_restart, GRACE_MS);
        /* wait_drained consumed the event; the subscription's copy carries the same reason. */

        /* A plain client (no_reconnect) reports the loss, every time, and can still tidy up. */
        CHECK_ERR(plain, gpuipc_ping(plain, H_SOON_MS), GPUIPC_E_DISCONNECTED);
        CHECK_ERR(plain, gpuipc_ping(plain, H_SOON_MS), GPUIPC_E_DISCONNECTED);
        CHECK(gpuipc_errmsg(plain)[0]);
        CHECK_OK(plain, gpuipc_release(plain, v_live));
        CHECK_OK(plain, gpuipc_release(plain, v_ret));
        gpuipc_close(plain);

        /* The subscription came along, under the id the producer knows. */
        other = h_connect(b, "other-producer");
        h_publish(other, "restart/other", 4096, 5, NULL);
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        ev.published = false;
        take_events(prod, &ev);
        CHECK(ev.published);
        CHECK_EQ(ev.published_sub, sub);
        gpuipc_close(other);

        /* And the lifetime contract holds on the new broker. */
        CHECK_OK(prod, gpuipc_retire(prod, live));
        CHECK_OK(fresh, gpuipc_release(fresh, v3));
        CHECK_ERR(prod, gpuipc_wait_drained(prod, live, 50), GPUIPC_E_TIMEOUT);
        CHECK_OK(again, gpuipc_release(again, v2));
        CHECK_OK(prod, gpuipc_wait_drained(prod, live, H_SOON_MS));
        gpuipc_close(fresh);
        gpuipc_close(again);
        gpuipc_close(prod);
        gpuipc_close(obs);
        h_broker_settle(b);
        h_broker_stop(b);
}

/* The same after a clean stop and restart of the broker. */
static void test_restart_keeps_the_contract(void)
{
        restart_case(false);
}

/* After a kill -9 of the broker and a restart, clients keep their buffers, ids and references, and drained still
 * means nobody can hold the memory. */
static void test_crash_restart_keeps_the_contract(void)
{
        restart_case(true);
}

/* Two producers whose buffers a broker numbered alike: after a crash, the first call of each
 * (retire) reaches its own buffer only. An id passed along a pipeline before the restart still
 * names the same buffer after it. */
static void test_ids_never_stale(void)
{
        gpuipc_t *a, *bp, *cons, *obs;
        gpuipc_buffer_t *a_one, *b_one, *v;
        uint64_t a_id, b_id;
        HBroker *b;
        HStat st;

        b = h_broker_start(grace_flags);
        a = connect_reconnecting(b, "producer-a");
        bp = connect_reconnecting(b, "producer-b");
        a_one = h_publish(a, "a/one", 4096, 1, NULL);
        b_one = h_publish(bp, "b/one", 4096, 2, NULL);
        a_id = gpuipc_buffer_id(a_one);
        b_id = gpuipc_buffer_id(b_one);
        CHECK(a_id != b_id);
        restart(b, true);

        /* B comes back first and registers b/one; A's first call is a retire of a/one. */
        CHECK_OK(bp, gpuipc_ping(bp, H_SOON_MS));
        CHECK_OK(a, gpuipc_retire(a, a_one));
        obs = h_connect(b, "observer");
        CHECK_OK(obs, h_stat(obs, "b/one", &st));
        CHECK_EQ(st.buffer, b_id);
        CHECK_EQ(st.state, PROTO_STATE_LIVE);
        CHECK_OK(obs, h_stat_id(obs, a_id, &st));
        CHECK_EQ(st.state, PROTO_STATE_RETIRED);

        /* The id a pipeline passed along before the restart. */
        cons = h_connect(b, "consumer");
        CHECK_OK(cons, gpuipc_attach_id(cons, b_id, &v));
        CHECK_EQ(gpuipc_buffer_id(v), b_id);
        h_verify(v, 2);
        CHECK_OK(cons, gpuipc_release(cons, v));
        gpuipc_close(cons);
        gpuipc_close(obs);
        gpuipc_close(a);
        gpuipc_close(bp);
        h_broker_settle(b);
        h_broker_stop(b);
}

/* The broker dies between retire and release. drained must wait for the consumer's release: it
 * comes back, verifies the frame it still holds, and only its release (once the grace is over)
 * lets the producer reuse the memory. */
static void test_drained_after_holder_came_back(void)
{
        gpuipc_t *prod, *cons;
        gpuipc_buffer_t *buf, *v;
        uint64_t t_release;
        HBroker *b;
        HStat st;

        b = h_broker_start(grace_flags);
        prod = connect_reconnecting(b, "producer");
        cons = connect_reconnecting(b, "consumer");
        buf = h_publish(prod, "frame", 64 << 10, 77, NULL);
        v = h_attach_verify(cons, "frame", 0, 77);
        CHECK_OK(prod, gpuipc_retire(prod, buf));
        restart(b, true);

        CHECK_ERR(prod, gpuipc_wait_drained(prod, buf, 100), GPUIPC_E_TIMEOUT);
        /* The consumer reconnects (its next call) and still holds the same memory. */
        CHECK_OK(cons, gpuipc_ping(cons, H_SOON_MS));
        CHECK(!gpuipc_buffer_revoked(v));
        h_verify(v, 77);
        CHECK_OK(cons, h_stat_id(cons, gpuipc_buffer_id(buf), &st));
        CHECK_EQ(st.refs, 1);
        /* Held past the end of the grace: the reference counts as any other. */
        h_sleep_ms(GRACE_MS + 200);
        CHECK_ERR(prod, gpuipc_wait_drained(prod, buf, 200), GPUIPC_E_TIMEOUT);
        h_verify(v, 77);
        t_release = monotonic_ms();
        CHECK_OK(cons, gpuipc_release(cons, v));
        CHECK_OK(prod, gpuipc_wait_drained(prod, buf, H_SOON_MS));
        h_log("drained %" PRIu64 " ms after the release", monotonic_ms() - t_release);
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_broker_settle(b);
        h_broker_stop(b);
}

/* A consumer that reconnects before its producer: its reclaim waits (pending) and becomes a
 * reference when the producer registers the buffer again. */
static void test_reclaim_before_the_producer_returns(void)
{
        gpuipc_t *prod, *cons, *obs;
        gpuipc_buffer_t *buf, *v;
        HBroker *b;
        HStat st;

        b = h_broker_start(grace_flags);
        prod = connect_reconnecting(b, "producer");
        cons = connect_reconnecting(b, "consumer");
        buf = h_publish(prod, "early/frame", 4096, 5, NULL);
        v = h_attach_verify(cons, "early/frame", 0, 5);
        restart(b, true);

        CHECK_OK(cons, gpuipc_ping(cons, H_SOON_MS));
        obs = h_connect(b, "observer");
        CHECK_EQ(h_stats(obs, "claims_pending"), 1);
        CHECK_ERR(obs, h_stat_id(obs, gpuipc_buffer_id(buf), &st), GPUIPC_E_NOT_FOUND);
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        CHECK_EQ(h_stats(obs, "claims_pending"), 0);
        CHECK_OK(obs, h_stat_id(obs, gpuipc_buffer_id(buf), &st));
        CHECK_EQ(st.refs, 1);
        CHECK_EQ(st.holders, 1);
        /* The pending claim also told the consumer nothing bad. */
        h_verify(v, 5);
        CHECK(!gpuipc_buffer_revoked(v));
        CHECK_OK(cons, gpuipc_release(cons, v));
        CHECK_OK(prod, gpuipc_retire(prod, buf));
        CHECK_OK(prod, gpuipc_wait_drained(prod, buf, H_SOON_MS));
        gpuipc_close(obs);
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_broker_settle(b);
        h_broker_stop(b);
}

static int producer_child(HChan *ch, void *arg)
{
        const HBroker *b = arg;
        gpuipc_t *c = connect_reconnecting(b, "doomed-producer");

        h_publish(c, "doomed/frame", 4096, 6, NULL);
        h_report(ch, 'p', "published");
        h_await(ch, 'x', H_SOON_MS * 6); /* killed before this comes */
        return 0;
}

/* The producer dies while the broker is away and never comes back: the consumer's claim is revoked
 * when the grace ends, with a reason that says so; its release is no error. */
static void test_claim_revoked_when_the_producer_never_returns(void)
{
        gpuipc_t *cons;
        gpuipc_buffer_t *v;
        gpuipc_event_t ev;
        HChild *kid;
        HBroker *b;
        uint64_t t0;

        b = h_broker_start(grace_flags);
        kid = h_spawn("producer", producer_child, b);
        h_child_expect(kid, 'p', H_SOON_MS, NULL, 0);
        cons = connect_reconnecting(b, "consumer");
        v = h_attach_verify(cons, "doomed/frame", 0, 6);
        h_broker_kill9(b);
        h_child_kill9(kid);
        h_broker_restart(b);
        t0 = monotonic_ms();

        CHECK_OK(cons, gpuipc_ping(cons, H_SOON_MS));
        CHECK(!gpuipc_buffer_revoked(v));
        CHECK_OK(cons, h_next_event_of(cons, GPUIPC_EVENT_REVOKED, H_SOON_MS, &ev));
        h_log("revoked after %" PRIu64 " ms: %s", monotonic_ms() - t0, ev.reason);
        CHECK(monotonic_ms() - t0 >= GRACE_MS - 200);
        CHECK_EQ(ev.buffer, gpuipc_buffer_id(v));
        CHECKF(strstr(ev.reason, "grace"), "reason: %s", ev.reason);
        CHECK(gpuipc_buffer_revoked(v));
        CHECK_OK(cons, gpuipc_release(cons, v));
        h_child_free(kid);
        gpuipc_close(cons);
        h_broker_settle(b);
        h_broker_stop(b);
}

/* A consumer that comes back after the grace, holding a buffer that drained meanwhile: its reclaim
 * is refused (the memory may have been reused) and the handle says revoked. */
static void test_late_holder_is_revoked(void)
{
        gpuipc_t *prod, *cons;
        gpuipc_buffer_t *buf, *v;
        Events ev = { 0 };
        HBroker *b;

        b = h_broker_start(grace_flags);
        prod = connect_reconnecting(b, "producer");
        cons = connect_reconnecting(b, "late-consumer");
        buf = h_publish(prod, "late/frame", 4096, 8, NULL);
        v = h_attach_verify(cons, "late/frame", 0, 8);
        CHECK_OK(prod, gpuipc_retire(prod, buf));
        restart(b, true);
        CHECK_OK(prod, gpuipc_wait_drained(prod, buf, H_SOON_MS));
        take_events(prod, &ev);
        CHECK(ev.reconnected);

        CHECK_OK(cons, gpuipc_ping(cons, H_SOON_MS));
        take_events(cons, &ev);
        CHECK(ev.revoked);
        CHECKF(strstr(ev.revoked_reason, "drained"), "reason: %s", ev.revoked_reason);
        CHECK(gpuipc_buffer_revoked(v));
        CHECK_OK(cons, gpuipc_release(cons, v));
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_broker_settle(b);
        h_broker_stop(b);
}

static int holder_then_victim(HChan *ch, void *arg)
{
        const HBroker *b = arg;
        gpuipc_t *c = h_connect(b, "producer");

        h_publish(c, "revoke/frame", 4096, 3, NULL);
        h_report(ch, 'p', "published");
        h_await(ch, 'x', H_SOON_MS * 6);
        return 0;
}

/* The broker revoked a buffer (its producer died); the consumer releases it before it read the
 * event: the release is no error. */
static void test_release_after_revoke(void)
{
        gpuipc_t *cons;
        gpuipc_buffer_t *v;
        HChild *kid;
        HCase k;

        h_case_begin(&k, NULL);
        kid = h_spawn("producer", holder_then_victim, k.broker);
        h_child_expect(kid, 'p', H_SOON_MS, NULL, 0);
        cons = h_connect(k.broker, "consumer");
        v = h_attach_verify(cons, "revoke/frame", 0, 3);
        h_child_kill9(kid);
        WAIT_UNTIL(h_stats(k.obs, "revokes_total") == 1, H_SOON_MS);
        CHECK(!gpuipc_buffer_revoked(v)); /* the event is still unread */
        CHECK_OK(cons, gpuipc_release(cons, v));
        h_child_free(kid);
        gpuipc_close(cons);
        h_case_end(&k);
}

/* A consumer driven by its own event loop (poll on gpuipc_fd, then gpuipc_process) makes no other
 * call: it still reconnects as soon as the broker is back, and its reference counts again. */
static void test_event_loop_reconnects(void)
{
        gpuipc_t *prod, *cons, *obs;
        gpuipc_buffer_t *buf, *v;
        bool reconnected = false;
        uint64_t t0, dl;
        int fd;
        HBroker *b;
        HStat st;

        b = h_broker_start(grace_flags);
        prod = connect_reconnecting(b, "producer");
        cons = connect_reconnecting(b, "event-loop-consumer");
        buf = h_publish(prod, "loop/frame", 4096, 4, NULL);
        v = h_attach_verify(cons, "loop/frame", 0, 4);
        fd = gpuipc_fd(cons);
        h_broker_kill9(b);
        /* The loss wakes the loop; while nobody listens, the loop keeps waking to try again. */
        for (int i = 0; i < 5; i++) {
                struct pollfd pfd = { fd, POLLIN, 0 };

                CHECKF(poll(&pfd, 1, 1000) == 1, "gpuipc_fd() did not wake while the broker was away");
                CHECK_OK(cons, gpuipc_process(cons));
                CHECK_EQ(gpuipc_fd(cons), fd);
        }
        h_broker_restart(b);
        t0 = monotonic_ms();
        dl = t0 + H_SOON_MS;
        while (!reconnected && monotonic_ms() < dl) {
                struct pollfd pfd = { fd, POLLIN, 0 };
                gpuipc_event_t ev;
                int n;

                if (poll(&pfd, 1, 100) <= 0)
                        continue;
                n = gpuipc_process(cons);
                CHECK_OK(cons, n);
                while (n-- > 0 && gpuipc_next_event(cons, 0, &ev) == 0)
                        reconnected |= ev.type == GPUIPC_EVENT_RECONNECTED;
        }
        CHECK(reconnected);
        h_log("reconnected %" PRIu64 " ms after the broker was back", monotonic_ms() - t0);
        CHECK(monotonic_ms() - t0 < 1000);
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        obs = h_connect(b, "observer");
        CHECK_OK(obs, h_stat_id(obs, gpuipc_buffer_id(buf), &st));
        CHECK_EQ(st.refs, 1);
        CHECK_OK(cons, gpuipc_release(cons, v));
        gpuipc_close(obs);
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_broker_settle(b);
        h_broker_stop(b);
}

/* After a restart another producer took one of the names first: that buffer comes back retired
 * (its holders may still reclaim it, it drains when they let go) and its producer hears so; the
 * others come back live, and so do the subscription and the RECONNECTED event. */
static void test_reconnect_with_name_taken(void)
{
        gpuipc_t *prod, *squatter, *obs, *other;
        gpuipc_buffer_t *one, *two;
        Events ev = { 0 };
        uint64_t sub;
        HBroker *b;
        HStat st;

        b = h_broker_start(grace_flags);
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

        /* The failure of one buffer is not the answer to an unrelated call. */
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        take_events(prod, &ev);
        CHECK(ev.reconnected);
        CHECK(ev.retired);
        obs = h_connect(b, "observer");
        CHECK_OK(obs, h_stat(obs, "taken/one", &st));
        CHECK(st.buffer != gpuipc_buffer_id(one)); /* the squatter's */
        CHECK_OK(obs, h_stat_id(obs, gpuipc_buffer_id(one), &st));
        CHECK_EQ(st.state, PROTO_STATE_RETIRED);
        CHECK(h_stat(obs, "taken/two", &st) == 0 && st.buffer == gpuipc_buffer_id(two));
        /* Nobody held it: it drains once the grace is over, and can be used again. */
        CHECK_OK(prod, gpuipc_wait_drained(prod, one, H_SOON_MS));
        CHECK_OK(prod, gpuipc_publish(prod, one, "taken/one-again", NULL));
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

/* The first call after a crash is the release of a held buffer: it reconnects, reclaims, releases. */
static void test_first_call_is_a_release(void)
{
        gpuipc_t *prod, *cons;
        gpuipc_buffer_t *buf, *v;
        HBroker *b;
        HStat st;

        b = h_broker_start(grace_flags);
        prod = connect_reconnecting(b, "producer");
        cons = connect_reconnecting(b, "consumer");
        buf = h_publish(prod, "first/frame", 4096, 5, NULL);
        v = h_attach_verify(cons, "first/frame", 0, 5);
        restart(b, true);
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        CHECK_OK(cons, gpuipc_release(cons, v));
        CHECK_OK(prod, h_stat_id(prod, gpuipc_buffer_id(buf), &st));
        CHECK_EQ(st.refs, 0);
        /* And before its producer is back: the release drops the pending claim. */
        v = h_attach_verify(cons, "first/frame", 0, 5);
        restart(b, true);
        CHECK_OK(cons, gpuipc_release(cons, v));
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        CHECK_OK(prod, h_stat_id(prod, gpuipc_buffer_id(buf), &st));
        CHECK_EQ(st.refs, 0);
        CHECK_EQ(h_stats(prod, "claims_pending"), 0);
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_broker_settle(b);
        h_broker_stop(b);
}

/* How far the broker's wall clock is from this process's, in seconds: from the first timestamp of
 * its current log (UTC, to the second), so that a shifted clock that did not reach it shows. */
static long broker_clock_offset_s(const HBroker *b)
{
        FILE *f = fopen(b->log, "r");
        char *line = NULL, *ts;
        size_t cap = 0;
        struct tm tm = { 0 };
        long offset = 0;

        CHECKF(f, "cannot open %s", b->log);
        while (getline(&line, &cap, f) > 0) {
                ts = strstr(line, "\"ts\":\"");
                if (ts && strptime(ts + 6, "%Y-%m-%dT%H:%M:%S", &tm)) {
                        offset = (long)(timegm(&tm) - time(NULL));
                        break;
                }
        }
        free(line);
        fclose(f);
        return offset;
}

/* A crash of the broker, then a broker whose wall clock reads offset_s seconds from the real one
 * (tests/integration/clock-shift.c, preloaded into it alone): the clock was stepped in between. */
static void crash_restart_with_clock(HBroker *b, const char *shift, long offset_s)
{
        const char *asan = getenv("ASAN_OPTIONS");
        char off[24], *asan_was = asan ? strdup(asan) : NULL, asan_opts[1024];

        CHECK(!asan || asan_was);
        snprintf(off, sizeof(off), "%ld", offset_s);
        /* A sanitizer's runtime wants to be the first library loaded; the preloaded one does not
         * mind coming after it. */
        snprintf(asan_opts, sizeof(asan_opts), "%s%sverify_asan_link_order=0", asan_was ? asan_was : "",
                 asan_was && *asan_was ? ":" : "");
        CHECK(setenv("LD_PRELOAD", shift, 1) == 0);
        CHECK(setenv("GPUIPC_TEST_CLOCK_OFFSET_S", off, 1) == 0);
        CHECK(setenv("ASAN_OPTIONS", asan_opts, 1) == 0);
        h_broker_kill9(b);
        h_broker_restart(b);
        CHECK(unsetenv("LD_PRELOAD") == 0);
        CHECK(unsetenv("GPUIPC_TEST_CLOCK_OFFSET_S") == 0);
        CHECK((asan_was ? setenv("ASAN_OPTIONS", asan_was, 1) : unsetenv("ASAN_OPTIONS")) == 0);
        free(asan_was);
        /* The step must have reached the broker, or the case would prove nothing. */
        CHECKF(labs(broker_clock_offset_s(b) - offset_s) < 600, "the broker's clock is %ld s from this one's, "
               "not %ld s", broker_clock_offset_s(b), offset_s);
}

/* The wall clock was stepped an hour back between two broker starts, then an hour forward again
 * (an administrator, NTP, a host resumed): each new broker takes the producer's buffers back under
 * the generations its consumer holds, both holds (on a live and on a retired buffer) outlast the
 * grace, and a publication on the new broker gets a generation above every earlier one. */
static void test_clock_steps_keep_every_hold(void)
{
        static const long steps_s[] = { -3600, 0 }; /* from the real clock: an hour back, then back to it */
        const char *shift = getenv("GPUIPC_TEST_CLOCK_SHIFT");
        gpuipc_buffer_t *live, *retired, *v_live, *v_ret, *next;
        gpuipc_t *prod, *cons, *obs;
        uint64_t highest;
        HBroker *b;
        HStat st;

        if (!shift || !*shift)
                h_skip("GPUIPC_TEST_CLOCK_SHIFT (the path of the clock-shift module) is not set");
        b = h_broker_start(grace_flags);
        prod = connect_reconnecting(b, "producer");
        cons = connect_reconnecting(b, "consumer");
        live = h_publish(prod, "clock/live", 4096, 0xc10c, NULL);
        retired = h_publish(prod, "clock/retired", 4096, 0x5e7, NULL);
        v_live = h_attach_verify(cons, "clock/live", 0, 0xc10c);
        v_ret = h_attach_verify(cons, "clock/retired", 0, 0x5e7);
        CHECK_OK(prod, gpuipc_retire(prod, retired));
        highest = gpuipc_buffer_generation(retired);

        for (size_t i = 0; i < sizeof(steps_s) / sizeof(steps_s[0]); i++) {
                char name[32];

                crash_restart_with_clock(b, shift, steps_s[i]);
                CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
                CHECK_OK(cons, gpuipc_ping(cons, H_SOON_MS));
                obs = h_connect(b, "observer");
                CHECK_OK(obs, h_stat_id(obs, gpuipc_buffer_id(live), &st));
                CHECK_EQ(st.generation, gpuipc_buffer_generation(live));
                CHECK_EQ(st.state, PROTO_STATE_LIVE);
                CHECK_EQ(st.refs, 1);
                CHECK_OK(obs, h_stat_id(obs, gpuipc_buffer_id(retired), &st));
                CHECK_EQ(st.generation, gpuipc_buffer_generation(retired));
                CHECK_EQ(st.state, PROTO_STATE_RETIRED);
                CHECK_EQ(st.refs, 1);

                /* Past the grace: nothing was revoked, nothing drained under its holder. */
                WAIT_UNTIL(h_stats(obs, "restart_grace") == 0, H_SOON_MS);
                CHECK_OK(cons, gpuipc_ping(cons, H_SOON_MS));
                CHECK(!gpuipc_buffer_revoked(v_live) && !gpuipc_buffer_revoked(v_ret));
                h_verify(v_live, 0xc10c);
                h_verify(v_ret, 0x5e7);
                CHECK_ERR(prod, gpuipc_wait_drained(prod, retired, 50), GPUIPC_E_TIMEOUT);

                snprintf(name, sizeof(name), "clock/after-%zu", i);
                next = h_publish(prod, name, 4096, i, NULL);
                CHECKF(gpuipc_buffer_generation(next) > highest,
                       "generation %" PRIu64 " after the restart, not above %" PRIu64 " before it",
                       gpuipc_buffer_generation(next), highest);
                highest = gpuipc_buffer_generation(next);
                gpuipc_close(obs);
        }

        CHECK_OK(cons, gpuipc_release(cons, v_ret));
        CHECK_OK(prod, gpuipc_wait_drained(prod, retired, H_SOON_MS));
        CHECK_OK(cons, gpuipc_release(cons, v_live));
        CHECK_OK(prod, gpuipc_retire(prod, live));
        CHECK_OK(prod, gpuipc_wait_drained(prod, live, H_SOON_MS));
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_broker_settle(b);
        h_broker_stop(b);
}

/* Reconnecting is the default: a connection made with no options at all (NULL), or with a zeroed
 * options struct, survives a broker restart (its buffer comes back, its reference is reclaimed),
 * while one made with no_reconnect reports the loss. */
static void test_reconnect_is_the_default(void)
{
        gpuipc_options_t zeroed = { .struct_size = sizeof(zeroed) }, off = zeroed;
        gpuipc_t *prod = NULL, *cons = NULL, *plain = NULL, *obs;
        gpuipc_buffer_t *buf, *v;
        HBroker *b;
        HStat st;

        b = h_broker_start(grace_flags);
        /* NULL options: the socket comes from the environment. */
        CHECK(setenv("GPUIPC_SOCKET", b->sock, 1) == 0);
        CHECK_OK(NULL, gpuipc_connect(&prod, NULL));
        CHECK(unsetenv("GPUIPC_SOCKET") == 0);
        CHECK_OK(NULL, h_try_connect(b, &zeroed, &cons));
        off.no_reconnect = 1;
        CHECK_OK(NULL, h_try_connect(b, &off, &plain));
        buf = h_publish(prod, "default/frame", 4096, 7, NULL);
        v = h_attach_verify(cons, "default/frame", 0, 7);
        restart(b, true);
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        CHECK_OK(cons, gpuipc_ping(cons, H_SOON_MS));
        obs = h_connect(b, "observer");
        CHECK_OK(obs, h_stat_id(obs, gpuipc_buffer_id(buf), &st));
        CHECK_EQ(st.refs, 1); /* the consumer's reference, reclaimed */
        h_verify(v, 7);
        CHECK(!gpuipc_buffer_revoked(v));
        CHECK_ERR(plain, gpuipc_ping(plain, H_SOON_MS), GPUIPC_E_DISCONNECTED); /* the call that notices */
        CHECK_ERR(plain, gpuipc_ping(plain, H_SOON_MS), GPUIPC_E_DISCONNECTED);
        CHECKF(strstr(gpuipc_errmsg(plain), "no_reconnect"), "the loss does not say why it is final: %s",
               gpuipc_errmsg(plain));
        CHECK_OK(cons, gpuipc_release(cons, v));
        gpuipc_close(plain);
        gpuipc_close(cons);
        gpuipc_close(prod);
        gpuipc_close(obs);
        h_broker_settle(b);
        h_broker_stop(b);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_reconnect_is_the_default),
                H_TEST(test_restart_keeps_the_contract),
                H_TEST(test_crash_restart_keeps_the_contract),
                H_TEST(test_ids_never_stale),
                H_TEST(test_drained_after_holder_came_back),
                H_TEST(test_reclaim_before_the_producer_returns),
                H_TEST(test_claim_revoked_when_the_producer_never_returns),
                H_TEST(test_late_holder_is_revoked),
                H_TEST(test_release_after_revoke),
                H_TEST(test_event_loop_reconnects),
                H_TEST(test_reconnect_with_name_taken),
                H_TEST(test_first_call_is_a_release),
                H_TEST(test_clock_steps_keep_every_hold),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
