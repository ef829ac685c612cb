/* Ordering between a producer's GPU work and a consumer in another process. Each round the
 * producer queues, on a stream of its own, a junk value into its 64 MiB cuda-vmm buffer, then
 * about 20 ms of other GPU work, then this round's value, and publishes the buffer with no_sync,
 * so the consumer attaches while the GPU is still busy. Fenced: the producer signals a gpuipc fence
 * after the write; the consumer waits for it in its own stream before copying the data out, and
 * must never see anything but this round's value. Default publish: the device synchronization
 * inside gpuipc_publish must be enough for a plain gpuipc_buffer_read. The unfenced rounds only
 * show (in the log) that stale data is there to be seen when nothing orders the reads. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#define SIZE  (64u << 20)
#define WORDS (SIZE / 4)
/* The GPU work between the junk and the real value: memsets of a 1 GiB scratch buffer, far
 * larger than the L2 cache, about 0.3 ms each on an H200, so the GPU falls behind the CPU that
 * queues them and the consumer arrives long before the value is written. Repeated memsets of the
 * 64 MiB buffer itself would mostly hit L2 and run as fast as the CPU queues them. The work also
 * spans several of the time slices in which a GPU alternates between two processes' contexts. */
#define SCRATCH  (1u << 30)
#define SLOW     64
#define START_MS 30000

typedef enum Mode {
        MODE_FENCED,   /* publish no_sync, fence signal; the consumer waits for the fence */
        MODE_UNFENCED, /* publish no_sync, the consumer does not wait: stale data expected */
        MODE_SYNC,     /* the default publish; the consumer reads with gpuipc_buffer_read */
} Mode;

typedef struct Phase {
        Mode mode;
        int rounds;
} Phase;

typedef struct FenceArg {
        const HBroker *broker;
        bool ipc_event; /* a fence made of a CUDA IPC event instead of a counter */
        int consumer_device;
        const Phase *phases;
        int n_phases;
} FenceArg;

static const char *mode_name(Mode m)
{
        return m == MODE_FENCED ? "fenced" : m == MODE_UNFENCED ? "unfenced" : "default publish";
}

static uint32_t value_of(int round)
{
        return 0x3c000000u + (uint32_t)round;
}

static uint32_t junk_of(int round)
{
        return 0xa0000000u + (uint32_t)round;
}

static int producer(HChan *ch, void *arg)
{
        const FenceArg *a = arg;
        gpuipc_buffer_t *b = NULL;
        gpuipc_fence_t *f = NULL;
        GcuDevicePtr scratch;
        GcuStream s = NULL;
        uint64_t seq = 0;
        int round = 0;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "producer");
        scratch = gpu_alloc(0, SCRATCH);
        CHECK_OK(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_CUDA_VMM, SIZE, 0, &b));
        if (a->ipc_event)
                CHECK_OK(c, gpuipc_fence_create_ipc_event(c, "fence/f", 0, &f));
        else
                CHECK_OK(c, gpuipc_fence_create(c, "fence/f", 0, &f));
        gpu_push(0);
        CHECK_CU(CU(cuStreamCreate, &s, GCU_STREAM_NON_BLOCKING));
        gpu_pop();
        h_report(ch, 'p', "ready");
        for (int ph = 0; ph < a->n_phases; ph++) {
                const Phase *phase = &a->phases[ph];
                gpuipc_publish_options_t po = { .struct_size = sizeof(po), .retire_after = 1,
                                                .no_sync = phase->mode != MODE_SYNC };

                for (int i = 0; i < phase->rounds; i++) {
                        round++;
                        gpu_push(0);
                        CHECK_CU(GX(cuMemsetD32Async, gpu_ptr(b), junk_of(round), WORDS, s));
                        for (int k = 0; k < SLOW; k++)
                                CHECK_CU(GX(cuMemsetD32Async, scratch, (unsigned)k, SCRATCH / 4, s));
                        CHECK_CU(GX(cuMemsetD32Async, gpu_ptr(b), value_of(round), WORDS, s));
                        gpu_pop();
                        if (phase->mode != MODE_SYNC)
                                CHECK_OK(c, gpuipc_fence_signal(f, s, ++seq));
                        CHECK_OK(c, gpuipc_publish(c, b, "fence/data", &po));
                        /* retire_after 1: the consumer's attach retires it, its release drains it. */
                        CHECK_OK(c, gpuipc_wait_drained(c, b, H_SOON_MS));
                }
        }
        gpu_push(0);
        CHECK_CU(CU(cuStreamSynchronize, s));
        gpu_pop();
        h_await(ch, 'x', 60000); /* the consumer closed its end of the fence */
        gpuipc_fence_close(f);
        gpu_push(0);
        CHECK_CU(CU(cuStreamDestroy, s));
        gpu_pop();
        CHECK_OK(c, gpuipc_buffer_free(c, b));
        gpu_free(0, scratch);
        gpuipc_close(c);
        return 0;
}

/* Words of host[] that are not value; *first: the first such index. */
static size_t count_stale(const uint32_t *host, uint32_t value, size_t *first)
{
        size_t n = 0;

        *first = SIZE_MAX;
        for (size_t w = 0; w < WORDS; w++) {
                if (host[w] != value) {
                        if (n++ == 0)
                                *first = w;
                }
        }
        return n;
}

static int consumer(HChan *ch, void *arg)
{
        const FenceArg *a = arg;
        int dev = a->consumer_device, round = 0, early = 0, fenced = 0, stale_rounds = 0, unfenced = 0;
        uint64_t seq = 0, last_gen = 0;
        gpuipc_fence_t *f = NULL;
        GcuStream s = NULL;
        GcuDevicePtr local;
        uint32_t *host = NULL;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "consumer");
        CHECK_OK(c, gpuipc_set_device(c, dev));
        CHECK_OK(c, gpuipc_fence_open(c, "fence/f", START_MS, &f));
        local = gpu_alloc(dev, SIZE);
        gpu_push(dev);
        CHECK_CU(CU(cuStreamCreate, &s, GCU_STREAM_NON_BLOCKING));
        CHECK_CU(GX(cuMemAllocHost, (void **)&host, SIZE));
        gpu_pop();
        for (int ph = 0; ph < a->n_phases; ph++) {
                const Phase *phase = &a->phases[ph];

                for (int i = 0; i < phase->rounds; i++) {
                        gpuipc_buffer_t *b = NULL;
                        uint64_t now = 0;
                        size_t bad, first;

                        round++;
                        CHECK_OK(c, gpuipc_attach(c, "fence/data", H_SOON_MS, &b));
                        CHECK(gpuipc_buffer_generation(b) > last_gen);
                        last_gen = gpuipc_buffer_generation(b);
                        CHECK_EQ(gpuipc_buffer_device_ordinal(b), dev);
                        memset(host, 0, SIZE);
                        if (phase->mode == MODE_SYNC) {
                                CHECK_EQ(gpuipc_buffer_read(b, 0, host, SIZE), 0);
                        } else {
                                seq++;
                                /* Was the producer's write still running when we got here? */
                                CHECK_OK(c, gpuipc_fence_value(f, &now));
                                /* A counter holds the last value signalled; an event says 1 once
                                 * its last record completed. */
                                early += phase->mode == MODE_FENCED && (a->ipc_event ? now == 0 : now < seq);
                                if (phase->mode == MODE_FENCED)
                                        CHECK_OK(c, gpuipc_fence_wait(f, s, seq));
                                gpu_push(dev);
                                CHECK_CU(GX(cuMemcpyDtoDAsync, local, gpu_ptr(b), SIZE, s));
                                CHECK_CU(CU(cuMemcpyDtoHAsync, host, local, SIZE, s));
                                CHECK_CU(CU(cuStreamSynchronize, s));
                                gpu_pop();
                        }
                        bad = count_stale(host, value_of(round), &first);
                        if (phase->mode == MODE_UNFENCED) {
                                unfenced++;
                                stale_rounds += bad > 0;
                        } else {
                                fenced += phase->mode == MODE_FENCED;
                                CHECKF(bad == 0,
                                       "%s round %d: %zu of %u words are stale (word %zu holds 0x%08x, "
                                       "expected 0x%08x)",
                                       mode_name(phase->mode), round, bad, WORDS, first, host[first],
                                       value_of(round));
                        }
                        CHECK_OK(c, gpuipc_release(c, b));
                }
        }
        gpu_push(dev);
        CHECK_CU(CU(cuStreamDestroy, s));
        CHECK_CU(GX(cuMemFreeHost, host));
        gpu_pop();
        gpu_free(dev, local);
        gpuipc_fence_close(f);
        gpuipc_close(c);
        h_report(ch, 'd', "%d %d %d %d %d", round, fenced, early, unfenced, stale_rounds);
        return 0;
}

static void run_fence(bool ipc_event, int consumer_device, const Phase *phases, int n_phases)
{
        HBroker *br = h_broker_start(NULL);
        FenceArg a = { .broker = br, .ipc_event = ipc_event, .consumer_device = consumer_device,
                       .phases = phases, .n_phases = n_phases };
        int rounds = 0, fenced = 0, early = 0, unfenced = 0, stale = 0;
        char text[128];
        HChild *p, *k;

        gpu_need(consumer_device + 1);
        if (!gpu_machine.vmm[0] || !gpu_machine.vmm[consumer_device])
                h_skip("cuda-vmm export is not available on the GPUs this case needs");
        if (!ipc_event && (!gpu_machine.mem_ops_64[0] || !gpu_machine.mem_ops_64[consumer_device]))
                h_skip("64-bit stream memory operations (gpuipc fences) are not available");
        p = h_spawn("producer", producer, &a);
        h_child_expect(p, 'p', START_MS, NULL, 0);
        k = h_spawn("consumer", consumer, &a);
        h_child_expect(k, 'd', 55000, text, sizeof(text));
        CHECK(sscanf(text, "%d %d %d %d %d", &rounds, &fenced, &early, &unfenced, &stale) == 5);
        h_child_wait_ok(k, H_SOON_MS);
        h_child_tell(p, 'x');
        h_child_wait_ok(p, H_SOON_MS);
        h_child_free(k);
        h_child_free(p);
        printf("# %s fence, consumer on GPU %d: %d rounds, none stale where ordered",
               ipc_event ? "IPC-event" : "counter", consumer_device, rounds);
        if (fenced)
                printf("; %d fenced rounds, in %d of them the copy was queued before the producer's "
                       "write had finished",
                       fenced, early);
        if (unfenced)
                printf("; without the fence wait %d of %d rounds saw stale data (informational)", stale,
                       unfenced);
        if (fenced && early == 0 && stale == 0)
                printf("; the consumer never ran during the producer's write: ordering was not put to the "
                       "test");
        printf("\n");
        h_broker_settle(br);
        h_broker_stop(br);
}

/* With a no_sync publish, a consumer waiting on the producer's gpuipc fence in its own stream never reads anything
 * but this round's value (unfenced rounds show stale data is there to see). */
static void test_fence_orders_no_sync_publish(void)
{
        static const Phase phases[] = { { MODE_FENCED, 48 }, { MODE_UNFENCED, 12 } };

        run_fence(false, 0, phases, 2);
}

/* A default (synchronizing) publish is enough for a consumer's plain gpuipc_buffer_read to see this round's value,
 * never an older one. */
static void test_default_publish_synchronizes(void)
{
        static const Phase phases[] = { { MODE_SYNC, 24 } };

        run_fence(false, 0, phases, 1);
}

/* The same fence ordering when the consumer works on GPU 1. */
static void test_fence_orders_no_sync_publish_cross_gpu(void)
{
        static const Phase phases[] = { { MODE_FENCED, 24 } };

        run_fence(false, 1, phases, 1);
}

/* The same with a CUDA IPC event as the fence: producer and consumer share a PID namespace here. */
static void test_ipc_event_fence_orders_no_sync_publish(void)
{
        static const Phase phases[] = { { MODE_FENCED, 32 } };

        run_fence(true, 0, phases, 1);
}

/* Between two PID 1s of sibling namespaces (two containers' main processes) CUDA cannot open an IPC
 * event (the PIDs are equal: docs/legacy-ipc.md): gpuipc refuses before CUDA runs, saying why and
 * what to use instead. (Distinct PIDs and one /dev/shm do work: test-gpu-pidns.c.) */
static int event_producer(HChan *ch, void *arg)
{
        const HBroker *br = arg;
        gpuipc_fence_t *f = NULL;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(br, "event-producer");
        CHECK_OK(c, gpuipc_fence_create_ipc_event(c, "fence/evt", 0, &f));
        h_report(ch, 'p', "ready");
        h_await(ch, 'x', 60000);
        gpuipc_fence_close(f);
        gpuipc_close(c);
        return 0;
}

static int event_opener(HChan *ch, void *arg)
{
        const HBroker *br = arg;
        gpuipc_fence_t *f = NULL;
        gpuipc_t *c;
        int r;

        gpu_init();
        c = gpu_connect(br, "event-opener");
        r = gpuipc_fence_open(c, "fence/evt", START_MS, &f);
        CHECKF(r == GPUIPC_E_SAME_PID, "opening an IPC-event fence between two PID 1s gave %d (%s)", r,
               gpuipc_errmsg(c));
        CHECKF(strstr(gpuipc_errmsg(c), "gpuipcctl run") && strstr(gpuipc_errmsg(c), "gpuipc_fence_create"),
               "the message does not say what to do: %s", gpuipc_errmsg(c));
        h_report(ch, 'd', "%.200s", gpuipc_errmsg(c));
        gpuipc_close(c);
        return 0;
}

/* An IPC-event fence created by PID 1 of one namespace is refused to PID 1 of a sibling one. */
static void test_ipc_event_fence_across_pid_namespaces(void)
{
        HBroker *br = h_broker_start(NULL);
        char text[256];
        HChild *p, *k;

        gpu_need(1);
        p = gpu_spawn_pidns("event-producer", event_producer, br);
        h_child_expect(p, 'p', START_MS, NULL, 0);
        k = gpu_spawn_pidns("event-opener", event_opener, br);
        h_child_expect(k, 'd', START_MS, text, sizeof(text));
        printf("# IPC-event fence refused between two PID 1s: %s\n", text);
        h_child_wait_ok(k, H_SOON_MS);
        h_child_tell(p, 'x');
        h_child_wait_ok(p, H_SOON_MS);
        h_child_free(k);
        h_child_free(p);
        h_broker_settle(br);
        h_broker_stop(br);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_fence_orders_no_sync_publish),
                H_TEST(test_default_publish_synchronizes),
                H_TEST(test_fence_orders_no_sync_publish_cross_gpu),
                H_TEST(test_ipc_event_fence_orders_no_sync_publish),
                H_TEST(test_ipc_event_fence_across_pid_namespaces),
        };

        return gpu_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]), 1);
}
