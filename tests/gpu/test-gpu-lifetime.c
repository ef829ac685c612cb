/* A producer killed with SIGKILL: a broker-held cuda-vmm buffer keeps its memory (the broker holds
 * the exported fd), so new consumers still attach and read the data, until someone of the same uid
 * retires it (gpuipcctl retire, or any peer) and it drains; then the broker lets go of the fd.
 * Without broker-held lifetime the buffer is revoked instead. cuda-legacy memory dies with its
 * producer, so it cannot be broker-held at all (GPUIPC_E_KIND). */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "internal.h"

#define SIZE     ((32u << 20) + 1000)
#define START_MS 30000

typedef struct LifeArg {
        const HBroker *broker;
        const char *name;
        uint64_t seed;
        bool broker_held;
} LifeArg;

/* Publishes a cuda-vmm buffer with the pattern, reports 'p' with its id, then waits to be killed. */
static int doomed_producer(HChan *ch, void *arg)
{
        const LifeArg *a = arg;
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .broker_held = a->broker_held };
        gpuipc_buffer_t *b = NULL;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "doomed-producer");
        CHECK_OK(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_CUDA_VMM, SIZE, 0, &b));
        gpu_fill_buffer(b, a->seed);
        CHECK_OK(c, gpuipc_publish(c, b, a->name, &po));
        h_report(ch, 'p', "%" PRIu64, gpuipc_buffer_id(b));
        h_await(ch, 'x', 120000);
        return 0;
}

/* Attaches and verifies, reports 'a'; on 'r' verifies again, checks the buffer was not revoked,
 * releases and reports 'd'. */
static int holder(HChan *ch, void *arg)
{
        const LifeArg *a = arg;
        gpuipc_buffer_t *b = NULL;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "holder");
        CHECK_OK(c, gpuipc_attach(c, a->name, H_SOON_MS, &b));
        gpu_verify_buffer(b, -1, a->seed);
        h_report(ch, 'a', "%" PRIu64, gpuipc_buffer_id(b));
        h_await(ch, 'r', 60000);
        CHECK_OK(c, gpuipc_ping(c, H_SOON_MS)); /* takes in any event the broker sent meanwhile */
        CHECK(!gpuipc_buffer_revoked(b));
        gpu_verify_buffer(b, -1, a->seed);
        CHECK_OK(c, gpuipc_release(c, b));
        gpuipc_close(c);
        h_report(ch, 'd', "released");
        return 0;
}

/* Attaches, waits for 'k' (its producer gets killed meanwhile), then requires the revoked event. */
static int revoked_holder(HChan *ch, void *arg)
{
        const LifeArg *a = arg;
        gpuipc_buffer_t *b = NULL;
        gpuipc_event_t ev;
        uint8_t byte;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "holder");
        CHECK_OK(c, gpuipc_attach(c, a->name, H_SOON_MS, &b));
        gpu_verify_buffer(b, -1, a->seed);
        h_report(ch, 'a', "attached");
        h_await(ch, 'k', 60000);
        CHECK_OK(c, h_next_event_of(c, GPUIPC_EVENT_REVOKED, H_SOON_MS, &ev));
        CHECK_EQ(ev.buffer, gpuipc_buffer_id(b));
        CHECK(gpuipc_buffer_revoked(b));
        CHECK_EQ(gpuipc_buffer_read(b, 0, &byte, 1), GPUIPC_E_REVOKED);
        h_log("revoked: %s", ev.reason);
        CHECK_OK(c, gpuipc_release(c, b));
        gpuipc_close(c);
        h_report(ch, 'd', "revoked");
        return 0;
}

/* Starts a producer, kills it with SIGKILL, and waits until the broker has dealt with its death.
 * Returns the buffer id. */
static uint64_t publish_and_kill(const LifeArg *a, gpuipc_t *obs, HChild **ret_producer)
{
        HChild *p = h_spawn("producer", doomed_producer, (void *)a);
        char text[64];

        h_child_expect(p, 'p', START_MS, text, sizeof(text));
        h_child_kill9(p);
        /* Only the observer is left (no producer, no consumer). */
        WAIT_UNTIL(h_stats(obs, "peers") == 1, H_SOON_MS);
        *ret_producer = p;
        return strtoull(text, NULL, 10);
}

/* No revoked event for name among the events obs received (a round trip ago at most). */
static void check_not_revoked(gpuipc_t *obs, const char *name)
{
        gpuipc_event_t ev;

        CHECK_OK(obs, gpuipc_ping(obs, H_SOON_MS));
        while (gpuipc_next_event(obs, 0, &ev) == 0)
                CHECKF(!(ev.type == GPUIPC_EVENT_REVOKED && strcmp(ev.name, name) == 0),
                       "'%s' was revoked although broker-held: %s", name, ev.reason);
}

/* A broker-held cuda-vmm buffer outlives its SIGKILLed producer (new consumers read its data) until gpuipcctl
 * retire, and then drains and the broker lets go of its fd. */
static void test_broker_held_outlives_producer_until_ctl_retire(void)
{
        HBroker *br = h_broker_start(NULL);
        gpuipc_t *obs = h_connect(br, "observer");
        LifeArg a = { .broker = br, .name = "held/ctl", .seed = 0x4e1d, .broker_held = true };
        gpuipc_buffer_t *x = NULL;
        gpuipc_event_t ev;
        uint64_t sub, id;
        HChild *p, *k, *ctl;
        HStat st;

        if (!gpu_machine.vmm[0])
                h_skip("GPU 0 cannot export cuda-vmm memory as a file descriptor");
        CHECK_OK(obs, gpuipc_subscribe(obs, "held/", &sub));
        id = publish_and_kill(&a, obs, &p);
        check_not_revoked(obs, a.name);
        CHECK_OK(obs, h_stat(obs, a.name, &st));
        CHECK_EQ(st.buffer, id);
        CHECK(st.broker_held);
        CHECK_EQ(st.state, PROTO_STATE_LIVE);

        /* A consumer that arrives after the producer's death still reads every byte. */
        k = h_spawn("holder", holder, &a);
        h_child_expect(k, 'a', START_MS, NULL, 0);
        CHECK_OK(obs, h_stat(obs, a.name, &st));
        CHECK_EQ(st.refs, 1);

        /* gpuipcctl (same uid) retires it: no new attaches, the holder keeps its view. */
        ctl = h_spawn_ctl(br, "retire", "retire", a.name, NULL);
        h_child_wait_ok(ctl, H_SOON_MS);
        h_child_free(ctl);
        CHECK_OK(obs, h_next_event_of(obs, GPUIPC_EVENT_RETIRED, H_SOON_MS, &ev));
        CHECK_EQ(ev.buffer, id);
        CHECK_ERR(obs, gpuipc_attach(obs, a.name, 0, &x), GPUIPC_E_NOT_FOUND);
        CHECK_ERR(obs, gpuipc_attach_id(obs, id, &x), GPUIPC_E_STATE);
        CHECK_OK(obs, h_stat_id(obs, id, &st));
        CHECK_EQ(st.state, PROTO_STATE_RETIRED);
        CHECK_EQ(st.refs, 1);

        /* The last release drains it, and the broker lets go of the memory. */
        h_child_tell(k, 'r');
        h_child_expect(k, 'd', H_SOON_MS, NULL, 0);
        h_child_wait_ok(k, H_SOON_MS);
        CHECK_OK(obs, h_next_event_of(obs, GPUIPC_EVENT_DRAINED, H_SOON_MS, &ev));
        CHECK_EQ(ev.buffer, id);
        CHECK_EQ(h_stat_id(obs, id, &st), GPUIPC_E_NOT_FOUND);
        h_child_free(k);
        h_child_free(p);
        gpuipc_close(obs);
        h_broker_settle(br); /* the held fd is closed: back to the baseline */
        h_broker_stop(br);
}

/* Any peer of the producer's uid may retire an orphaned broker-held buffer, and it then drains. */
static void test_broker_held_retired_by_same_uid_peer(void)
{
        HBroker *br = h_broker_start(NULL);
        gpuipc_t *obs = h_connect(br, "observer");
        LifeArg a = { .broker = br, .name = "held/peer", .seed = 0x9ee4, .broker_held = true };
        ProtoMsg req = { .op = PROTO_OP_RETIRE, .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER) };
        Frame f = { .fd = -1 };
        gpuipc_t *peer;
        uint64_t id;
        HChild *p, *k;
        HStat st;

        if (!gpu_machine.vmm[0])
                h_skip("GPU 0 cannot export cuda-vmm memory as a file descriptor");
        id = publish_and_kill(&a, obs, &p);

        /* Two consumers one after the other, long after the producer is gone. */
        for (int i = 0; i < 2; i++) {
                k = h_spawn("reader", holder, &a);
                h_child_expect(k, 'a', START_MS, NULL, 0);
                h_child_tell(k, 'r');
                h_child_expect(k, 'd', H_SOON_MS, NULL, 0);
                h_child_wait_ok(k, H_SOON_MS);
                h_child_free(k);
        }
        CHECK_OK(obs, h_stat_id(obs, id, &st));
        CHECK_EQ(st.state, PROTO_STATE_LIVE);
        CHECK_EQ(st.refs, 0);

        /* Any peer of the producer's uid may retire it; unreferenced, it is freed at once. */
        peer = h_connect(br, "same-uid-peer");
        req.buffer = id;
        CHECK_OK(peer, client_request(peer, &req, -1, H_SOON_MS, &f));
        frame_free(&f);
        CHECK_EQ(h_stat_id(obs, id, &st), GPUIPC_E_NOT_FOUND);
        h_child_free(p);
        gpuipc_close(peer);
        gpuipc_close(obs);
        h_broker_settle(br);
        h_broker_stop(br);
}

/* Without broker-held lifetime a SIGKILLed producer's cuda-vmm buffer is revoked: its holder is told. */
static void test_not_broker_held_is_revoked(void)
{
        HBroker *br = h_broker_start(NULL);
        gpuipc_t *obs = h_connect(br, "observer");
        LifeArg a = { .broker = br, .name = "held/not", .seed = 0x7e, .broker_held = false };
        HChild *p, *k;
        gpuipc_buffer_t *x = NULL;
        char text[64];
        HStat st;

        if (!gpu_machine.vmm[0])
                h_skip("GPU 0 cannot export cuda-vmm memory as a file descriptor");
        p = h_spawn("producer", doomed_producer, &a);
        h_child_expect(p, 'p', START_MS, text, sizeof(text));
        k = h_spawn("holder", revoked_holder, &a);
        h_child_expect(k, 'a', START_MS, NULL, 0);
        h_child_kill9(p);
        h_child_tell(k, 'k');
        h_child_expect(k, 'd', H_SOON_MS, NULL, 0);
        h_child_wait_ok(k, H_SOON_MS);
        CHECK_EQ(h_stat_id(obs, strtoull(text, NULL, 10), &st), GPUIPC_E_NOT_FOUND);
        CHECK_ERR(obs, gpuipc_attach(obs, a.name, 0, &x), GPUIPC_E_NOT_FOUND);
        h_child_free(k);
        h_child_free(p);
        gpuipc_close(obs);
        h_broker_settle(br);
        h_broker_stop(br);
}

static int legacy_held_producer(HChan *ch, void *arg)
{
        const LifeArg *a = arg;
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .broker_held = 1 };
        gpuipc_buffer_t *b = NULL;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "legacy-producer");
        CHECK_OK(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_CUDA_LEGACY, SIZE, 0, &b));
        CHECK_ERR(c, gpuipc_publish(c, b, a->name, &po), GPUIPC_E_KIND);
        CHECKF(strstr(gpuipc_errmsg(c), "broker-held"), "the refusal does not say why: %s",
               gpuipc_errmsg(c));
        h_log("refused as expected: %s", gpuipc_errmsg(c));
        /* Published normally it works. */
        CHECK_OK(c, gpuipc_publish(c, b, a->name, NULL));
        CHECK_OK(c, gpuipc_retire(c, b));
        CHECK_OK(c, gpuipc_wait_drained(c, b, H_SOON_MS));
        CHECK_OK(c, gpuipc_buffer_free(c, b));
        gpuipc_close(c);
        h_report(ch, 'd', "refused");
        return 0;
}

/* Publishing cuda-legacy memory as broker-held is refused with GPUIPC_E_KIND (that memory dies with its producer). */
static void test_legacy_cannot_be_broker_held(void)
{
        HBroker *br = h_broker_start(NULL);
        LifeArg a = { .broker = br, .name = "held/legacy" };
        HChild *p = h_spawn("producer", legacy_held_producer, &a);

        h_child_expect(p, 'd', START_MS, NULL, 0);
        h_child_wait_ok(p, H_SOON_MS);
        h_child_free(p);
        h_broker_settle(br);
        h_broker_stop(br);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_broker_held_outlives_producer_until_ctl_retire),
                H_TEST(test_broker_held_retired_by_same_uid_peer),
                H_TEST(test_not_broker_held_is_revoked),
                H_TEST(test_legacy_cannot_be_broker_held),
        };

        return gpu_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]), 1);
}
