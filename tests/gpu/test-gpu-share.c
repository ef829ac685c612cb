/* CUDA buffers shared between two processes through the broker, data checked byte for byte:
 * cuda-vmm, cuda-legacy, and a cuda-legacy wrap of the caller's cuMemAlloc memory at a non-zero
 * offset. The producer fills the buffer on GPU 0; the consumer reads it through its mapping
 * (gpuipc_buffer_read, and a device-to-device copy into memory of its own), writes a pattern
 * back into the second half, and the producer sees that. "same": the consumer maps on GPU 0;
 * "cross": on GPU 1 (gpuipc_set_device), through peer access. The argument picks the cases. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#define SIZE        ((64u << 20) + 12345) /* not a multiple of any allocation granularity */
#define WRAP_ALLOC  (8u << 20)
#define WRAP_OFFSET ((3u << 12) + 520) /* inside the allocation, aligned to nothing in particular */
#define WRAP_SIZE   ((3u << 20) + 7)
#define WRAP_GUARD  0xee  /* the bytes of the allocation around the wrapped range */
#define START_MS    30000 /* a first CUDA context can take seconds */

typedef struct ShareArg {
        const HBroker *broker;
        gpuipc_kind_t kind;
        bool wrap;
        int consumer_device; /* -1: the buffer's own (GPU 0) */
        const char *name;
        size_t size;
        uint64_t seed, seed_back; /* the producer's pattern; the consumer's, in the second half */
} ShareArg;

/* Checks that [p, p + len) on device 0 holds nothing but the guard byte. */
static void check_guard(GcuDevicePtr p, size_t len, const char *where)
{
        uint8_t *host = malloc(len);

        CHECK(host);
        gpu_push(0);
        CHECK_CU(CU(cuMemcpyDtoH, host, p, len));
        gpu_pop();
        for (size_t i = 0; i < len; i++)
                CHECKF(host[i] == WRAP_GUARD, "the wrapped allocation changed %s at byte %zu: 0x%02x", where,
                       i, host[i]);
        free(host);
}

/* Allocates or wraps the buffer on GPU 0 and fills it with the pattern. *ret_raw: the caller's
 * own allocation when wrapping. */
static gpuipc_buffer_t *make_buffer(gpuipc_t *c, const ShareArg *a, GcuDevicePtr *ret_raw)
{
        gpuipc_buffer_t *b = NULL;
        GcuDevicePtr raw;

        *ret_raw = 0;
        if (!a->wrap) {
                CHECK_OK(c, gpuipc_buffer_alloc(c, a->kind, a->size, 0, &b));
                gpu_fill_buffer(b, a->seed);
                return b;
        }
        raw = gpu_alloc(0, WRAP_ALLOC);
        gpu_push(0);
        CHECK_CU(GX(cuMemsetD8, raw, WRAP_GUARD, WRAP_ALLOC));
        CHECK_CU(CU(cuCtxSynchronize));
        gpu_pop();
        gpu_fill(0, raw + WRAP_OFFSET, a->size, a->seed);
        /* A range running past the end of its allocation is refused. */
        CHECK_ERR(c, gpuipc_buffer_wrap_cuda(c, raw + WRAP_OFFSET, WRAP_ALLOC, &b), GPUIPC_E_INVALID);
        CHECK_OK(c, gpuipc_buffer_wrap_cuda(c, raw + WRAP_OFFSET, a->size, &b));
        CHECK_EQ(gpu_ptr(b), raw + WRAP_OFFSET);
        CHECK_EQ(gpuipc_buffer_size(b), a->size);
        *ret_raw = raw;
        return b;
}

static int producer(HChan *ch, void *arg)
{
        const ShareArg *a = arg;
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .writable = 1 };
        size_t half = a->size / 2;
        GcuDevicePtr raw = 0;
        gpuipc_buffer_t *b;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "producer");
        b = make_buffer(c, a, &raw);
        CHECK_EQ(gpuipc_buffer_kind(b), a->kind);
        CHECK_EQ(gpuipc_buffer_device_ordinal(b), 0);
        CHECKF(strcmp(gpuipc_buffer_device(b), gpu_machine.uuid[0]) == 0, "the buffer says it lives on '%s'",
               gpuipc_buffer_device(b));
        CHECK_OK(c, gpuipc_publish(c, b, a->name, &po));
        h_report(ch, 'p', "%" PRIu64, gpuipc_buffer_id(b));

        /* The consumer wrote its own pattern into the second half. */
        h_await(ch, 'v', 60000);
        gpu_verify_dev(0, gpu_ptr(b), half, a->seed, "the producer's first half after the consumer's write");
        gpu_verify_dev(0, gpu_ptr(b) + half, a->size - half, a->seed_back,
                       "the second half the consumer wrote");
        CHECK_OK(c, gpuipc_retire(c, b));
        CHECK_OK(c, gpuipc_wait_drained(c, b, H_SOON_MS));
        CHECK_OK(c, gpuipc_buffer_free(c, b));
        if (raw) {
                /* The wrapped memory stays the caller's: still there, untouched around the range. */
                gpu_verify_dev(0, raw + WRAP_OFFSET, half, a->seed,
                               "the wrapped range after gpuipc_buffer_free");
                check_guard(raw, WRAP_OFFSET, "before the wrapped range");
                check_guard(raw + WRAP_OFFSET + a->size, WRAP_ALLOC - WRAP_OFFSET - a->size,
                            "after the wrapped range");
                gpu_free(0, raw);
        }
        gpuipc_close(c);
        return 0;
}

/* Reads all of b and checks both halves: the producer's pattern, then the consumer's. */
static void verify_halves(const gpuipc_buffer_t *b, const ShareArg *a)
{
        size_t half = a->size / 2;
        uint8_t *host = malloc(a->size);

        CHECK(host);
        CHECK_EQ(gpuipc_buffer_read(b, 0, host, a->size), 0);
        CHECKF(h_pattern_check(host, half, a->seed) == SIZE_MAX, "the first half changed");
        CHECKF(h_pattern_check(host + half, a->size - half, a->seed_back) == SIZE_MAX,
               "the second half does not hold what this consumer wrote");
        free(host);
}

static int consumer(HChan *ch, void *arg)
{
        const ShareArg *a = arg;
        int device = a->consumer_device >= 0 ? a->consumer_device : 0;
        size_t half = a->size / 2;
        gpuipc_buffer_t *b = NULL, *b2 = NULL;
        uint8_t *back, byte;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "consumer");
        if (a->consumer_device >= 0)
                CHECK_OK(c, gpuipc_set_device(c, a->consumer_device));
        CHECK_OK(c, gpuipc_attach(c, a->name, H_SOON_MS, &b));
        CHECK_EQ(gpuipc_buffer_kind(b), a->kind);
        CHECK_EQ(gpuipc_buffer_size(b), a->size);
        CHECK(gpuipc_buffer_writable(b));
        CHECKF(strcmp(gpuipc_buffer_device(b), gpu_machine.uuid[0]) == 0, "the buffer says it lives on '%s'",
               gpuipc_buffer_device(b));
        CHECK_EQ(gpuipc_buffer_device_ordinal(b), device);
        gpu_verify_buffer(b, device, a->seed);
        h_log("%s on GPU %d: %zu bytes verified, mapped on GPU %d", a->name, 0, a->size, device);

        /* Nothing outside the buffer is reachable through the API. */
        CHECK_EQ(gpuipc_buffer_read(b, a->size, &byte, 1), GPUIPC_E_INVALID);
        CHECK_EQ(gpuipc_buffer_read(b, 0, &byte, a->size + 1), GPUIPC_E_INVALID);

        /* Write back into the second half (the buffer is writable). */
        back = malloc(a->size - half);
        CHECK(back);
        h_pattern_fill(back, a->size - half, a->seed_back);
        CHECK_EQ(gpuipc_buffer_write(b, half, back, a->size - half), 0);
        free(back);

        /* A second attach while the first is held is served by the same mapping. */
        CHECK_OK(c, gpuipc_attach(c, a->name, H_SOON_MS, &b2));
        CHECK(gpuipc_buffer_ptr(b2) == gpuipc_buffer_ptr(b));
        verify_halves(b2, a);
        /* The handle is gone after its release; only the address is kept to compare with. */
        void *first_ptr = gpuipc_buffer_ptr(b);
        CHECK_OK(c, gpuipc_release(c, b2));
        CHECK_OK(c, gpuipc_release(c, b));

        /* Attached again after the release: cuda-vmm keeps the idle mapping (same pointer); a
         * legacy open is closed at release and opened anew. */
        CHECK_OK(c, gpuipc_attach(c, a->name, H_SOON_MS, &b2));
        if (a->kind == GPUIPC_KIND_CUDA_VMM)
                CHECK(gpuipc_buffer_ptr(b2) == first_ptr);
        verify_halves(b2, a);
        CHECK_OK(c, gpuipc_release(c, b2));
        gpuipc_close(c);
        h_report(ch, 'd', "verified");
        return 0;
}

static void run_share(gpuipc_kind_t kind, bool wrap, int consumer_device)
{
        HBroker *br = h_broker_start(NULL);
        gpuipc_t *obs = h_connect(br, "observer");
        ShareArg a = {
                .broker = br,
                .kind = kind,
                .wrap = wrap,
                .consumer_device = consumer_device,
                .name = wrap                           ? "share/wrapped"
                        : kind == GPUIPC_KIND_CUDA_VMM ? "share/vmm"
                                                       : "share/legacy",
                .size = wrap ? WRAP_SIZE : SIZE,
                .seed = 0x51 + (uint64_t)kind,
                .seed_back = 0xbac4 + (uint64_t)kind,
        };
        HChild *p, *k;
        char text[64];
        HStat st;

        if (consumer_device > 0)
                gpu_need(consumer_device + 1);
        if (kind == GPUIPC_KIND_CUDA_VMM && !gpu_machine.vmm[0])
                h_skip("GPU 0 cannot export cuda-vmm memory as a file descriptor");
        p = h_spawn("producer", producer, &a);
        h_child_expect(p, 'p', START_MS, text, sizeof(text));
        CHECK_OK(obs, h_stat(obs, a.name, &st));
        CHECK_EQ(st.buffer, strtoull(text, NULL, 10));
        CHECK_EQ(st.size, a.size);
        CHECK_EQ(st.refs, 0);
        CHECK(!st.broker_held);

        k = h_spawn("consumer", consumer, &a);
        h_child_expect(k, 'd', START_MS, NULL, 0);
        h_child_wait_ok(k, H_SOON_MS);
        CHECK_OK(obs, h_stat(obs, a.name, &st));
        CHECK_EQ(st.refs, 0);
        h_child_tell(p, 'v');
        h_child_wait_ok(p, H_SOON_MS);
        h_child_free(k);
        h_child_free(p);
        /* The broker forgot the buffer and closed the cuda-vmm fd it held. */
        CHECK_EQ(h_stat(obs, a.name, &st), GPUIPC_E_NOT_FOUND);
        gpuipc_close(obs);
        h_broker_settle(br);
        h_broker_stop(br);
}

/* A cuda-vmm buffer is read and written back byte for byte by a consumer on the same GPU. */
static void test_same_vmm(void)
{
        run_share(GPUIPC_KIND_CUDA_VMM, false, -1);
}

/* A cuda-legacy buffer is read and written back byte for byte by a consumer on the same GPU. */
static void test_same_legacy(void)
{
        run_share(GPUIPC_KIND_CUDA_LEGACY, false, -1);
}

/* The same for a cuda-legacy wrap of the producer's own cuMemAlloc memory at a non-zero offset. */
static void test_same_legacy_wrapped_at_offset(void)
{
        run_share(GPUIPC_KIND_CUDA_LEGACY, true, -1);
}

/* A cuda-vmm buffer from GPU 0 is read and written back byte for byte by a consumer on GPU 1, through peer access. */
static void test_cross_vmm(void)
{
        run_share(GPUIPC_KIND_CUDA_VMM, false, 1);
}

/* A cuda-legacy buffer from GPU 0 is read and written back byte for byte by a consumer on GPU 1, through peer
 * access. */
static void test_cross_legacy(void)
{
        run_share(GPUIPC_KIND_CUDA_LEGACY, false, 1);
}

/* The same for a cuda-legacy wrap of the producer's own cuMemAlloc memory at a non-zero offset. */
static void test_cross_legacy_wrapped_at_offset(void)
{
        run_share(GPUIPC_KIND_CUDA_LEGACY, true, 1);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_same_vmm),
                H_TEST(test_same_legacy),
                H_TEST(test_same_legacy_wrapped_at_offset),
                H_TEST(test_cross_vmm),
                H_TEST(test_cross_legacy),
                H_TEST(test_cross_legacy_wrapped_at_offset),
        };
        bool cross_only = argc > 1 && strstr(argv[1], "cross");

        return gpu_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]), cross_only ? 2 : 1);
}
