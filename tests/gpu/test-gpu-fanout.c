/* Sixteen consumer processes attached at once to one cuda-vmm and one cuda-legacy buffer, each
 * with a CUDA context of its own, each verifying every byte while all sixteen hold their
 * references; the producer's drain follows the last release. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#define CONSUMERS 16
#define SIZE      ((16u << 20) + 24)
#define START_MS  45000 /* sixteen contexts created at once */

typedef struct FanArg {
        const HBroker *broker;
        uint64_t seed;
} FanArg;

static const char *const names[] = { "fan/vmm", "fan/legacy" };
static const gpuipc_kind_t kinds[] = { GPUIPC_KIND_CUDA_VMM, GPUIPC_KIND_CUDA_LEGACY };

static int producer(HChan *ch, void *arg)
{
        const FanArg *a = arg;
        gpuipc_buffer_t *b[2] = { NULL, NULL };
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "producer");
        for (int i = 0; i < 2; i++) {
                CHECK_OK(c, gpuipc_buffer_alloc(c, kinds[i], SIZE, 0, &b[i]));
                gpu_fill_buffer(b[i], a->seed + (uint64_t)i);
                CHECK_OK(c, gpuipc_publish(c, b[i], names[i], NULL));
        }
        h_report(ch, 'p', "published");
        h_await(ch, 'x', 120000);
        for (int i = 0; i < 2; i++) {
                CHECK_OK(c, gpuipc_retire(c, b[i]));
                CHECK_OK(c, gpuipc_wait_drained(c, b[i], H_SOON_MS));
                CHECK_OK(c, gpuipc_buffer_free(c, b[i]));
        }
        gpuipc_close(c);
        return 0;
}

/* Attaches both, reports 'a'; on 'v' verifies both (all sixteen are attached by then) and
 * reports 'v'; on 'r' releases. */
static int consumer(HChan *ch, void *arg)
{
        const FanArg *a = arg;
        gpuipc_buffer_t *b[2] = { NULL, NULL };
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "fan-consumer");
        for (int i = 0; i < 2; i++) {
                CHECK_OK(c, gpuipc_attach(c, names[i], START_MS, &b[i]));
                CHECK_EQ(gpuipc_buffer_kind(b[i]), kinds[i]);
                CHECK_EQ(gpuipc_buffer_size(b[i]), SIZE);
        }
        h_report(ch, 'a', "attached");
        h_await(ch, 'v', 60000);
        for (int i = 0; i < 2; i++)
                gpu_verify_buffer(b[i], -1, a->seed + (uint64_t)i);
        h_report(ch, 'v', "verified");
        h_await(ch, 'r', 60000);
        for (int i = 0; i < 2; i++)
                CHECK_OK(c, gpuipc_release(c, b[i]));
        gpuipc_close(c);
        return 0;
}

/* Sixteen consumers, each with a CUDA context of its own, hold one cuda-vmm and one cuda-legacy buffer at once and
 * verify every byte; the producer's drain follows the last release. */
static void test_sixteen_consumers_at_once(void)
{
        HBroker *br = h_broker_start(NULL);
        gpuipc_t *obs = h_connect(br, "observer");
        FanArg a = { .broker = br, .seed = 0xfa9 };
        HChild *p, *k[CONSUMERS];
        char name[32];
        HStat st;

        if (!gpu_machine.vmm[0])
                h_skip("GPU 0 cannot export cuda-vmm memory as a file descriptor");
        p = h_spawn("producer", producer, &a);
        h_child_expect(p, 'p', START_MS, NULL, 0);
        for (int i = 0; i < CONSUMERS; i++) {
                snprintf(name, sizeof(name), "consumer%d", i);
                k[i] = h_spawn(name, consumer, &a);
        }
        for (int i = 0; i < CONSUMERS; i++)
                h_child_expect(k[i], 'a', START_MS, NULL, 0);
        for (int i = 0; i < 2; i++) {
                CHECK_OK(obs, h_stat(obs, names[i], &st));
                CHECK_EQ(st.refs, CONSUMERS);
                CHECK_EQ(st.holders, CONSUMERS);
        }
        for (int i = 0; i < CONSUMERS; i++)
                h_child_tell(k[i], 'v');
        for (int i = 0; i < CONSUMERS; i++)
                h_child_expect(k[i], 'v', 30000, NULL, 0);
        h_log("%d consumers verified both buffers while all held them", CONSUMERS);
        for (int i = 0; i < CONSUMERS; i++)
                h_child_tell(k[i], 'r');
        for (int i = 0; i < CONSUMERS; i++) {
                h_child_wait_ok(k[i], H_SOON_MS);
                h_child_free(k[i]);
        }
        for (int i = 0; i < 2; i++) {
                CHECK_OK(obs, h_stat(obs, names[i], &st));
                CHECK_EQ(st.refs, 0);
        }
        h_child_tell(p, 'x');
        h_child_wait_ok(p, H_SOON_MS);
        h_child_free(p);
        gpuipc_close(obs);
        h_broker_settle(br);
        h_broker_stop(br);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_sixteen_consumers_at_once),
        };

        return gpu_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]), 1);
}
