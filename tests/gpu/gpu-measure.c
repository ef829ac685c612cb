/* Measurements on 64 MiB buffers, printed as a table: what a first publish costs (the cuda-vmm
 * export, the legacy IPC handle; and the raw export, straight after cuMemCreate and once the
 * memory is mapped and written), first and cached attaches of both kinds, and device-to-device
 * copy bandwidth through an imported mapping against a local buffer; on one GPU, and GPU 0 ->
 * GPU 1 when there are two. Each figure is the median (p50) of several runs, with min..max.
 * Checks: a cached attach is faster than a first one, and copying from a mapping reaches at least
 * 90% of copying from a local buffer on the same GPU. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"

#define SIZE        (64u << 20)
#define FIRST_RUNS  7 /* buffers per kind, each attached for the first time once (plus one warm-up) */
#define CACHED_RUNS 21
#define PING_RUNS   21
#define BW_RUNS     7
#define BW_COPIES   10 /* copies per timed run */
#define START_MS    30000

typedef struct Stat {
        double p50, min, max;
        int n;
} Stat;

typedef struct MeasureArg {
        const HBroker *broker;
        int device; /* where the consumer maps */
} MeasureArg;

static const char *const kind_tag[] = {
        [GPUIPC_KIND_CUDA_VMM] = "vmm", [GPUIPC_KIND_CUDA_LEGACY] = "legacy"
};

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;

        return x < y ? -1 : x > y;
}

static Stat stat_of(const double *v, int n)
{
        double s[64];

        CHECK(n > 0 && n <= 64);
        memcpy(s, v, sizeof(double) * (size_t)n);
        qsort(s, (size_t)n, sizeof(double), cmp_double);
        return (Stat){ .p50 = s[n / 2], .min = s[0], .max = s[n - 1], .n = n };
}

/* Stats travel as "p50,min,max,n" words in a report. */
static int stat_put(char *buf, size_t cap, Stat s)
{
        return snprintf(buf, cap, "%.3f,%.3f,%.3f,%d ", s.p50, s.min, s.max, s.n);
}

static const char *stat_get(const char *p, Stat *ret)
{
        int used = 0;

        CHECKF(sscanf(p, "%lf,%lf,%lf,%d %n", &ret->p50, &ret->min, &ret->max, &ret->n, &used) == 4,
               "bad stat in report: '%s'", p);
        return p + used;
}

static void name_of(char *buf, size_t cap, gpuipc_kind_t kind, int i)
{
        snprintf(buf, cap, "m/%s/%d", kind_tag[kind], i);
}

/* ---- producer ---- */

/* cuMemCreate + cuMemExportToShareableHandle by hand, without the broker: straight after the
 * create, or (mapped) once the memory is mapped and written, as gpuipc_publish finds it. */
static Stat export_alone(bool mapped)
{
        GcuMemAllocationProp prop = {
                .type = GCU_MEM_ALLOCATION_TYPE_PINNED,
                .requested_handle_types = GCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                .location = { .type = GCU_MEM_LOCATION_TYPE_DEVICE, .id = cuda_device(0) },
        };
        GcuMemAccessDesc access = {
                .location = { .type = GCU_MEM_LOCATION_TYPE_DEVICE, .id = cuda_device(0) },
                .flags = GCU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        double t[FIRST_RUNS];

        gpu_push(0);
        for (int i = 0; i < FIRST_RUNS; i++) {
                GcuMemHandle h = 0;
                GcuDevicePtr p = 0;
                int fd = -1;
                uint64_t t0;

                CHECK_CU(CU(cuMemCreate, &h, SIZE, &prop, 0));
                if (mapped) {
                        CHECK_CU(CU(cuMemAddressReserve, &p, SIZE, 0, 0, 0));
                        CHECK_CU(CU(cuMemMap, p, SIZE, 0, h, 0));
                        CHECK_CU(CU(cuMemSetAccess, p, SIZE, &access, 1));
                        CHECK_CU(GX(cuMemsetD32, p, 0x600d0000u + (unsigned)i, SIZE / 4));
                        CHECK_CU(CU(cuCtxSynchronize));
                }
                t0 = monotonic_us();
                CHECK_CU(CU(cuMemExportToShareableHandle, &fd, h, GCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                            0));
                t[i] = (double)(monotonic_us() - t0);
                CHECK(fd >= 0 && close(fd) == 0);
                if (mapped) {
                        CHECK_CU(CU(cuMemUnmap, p, SIZE));
                        CHECK_CU(CU(cuMemAddressFree, p, SIZE));
                }
                CHECK_CU(CU(cuMemRelease, h));
        }
        gpu_pop();
        return stat_of(t, FIRST_RUNS);
}

/* Allocates 1 + FIRST_RUNS buffers of kind on GPU 0 and publishes each; the first publish of all
 * but the warm-up one is timed (no_sync: the export and the round trip, not a device sync). */
static Stat publish_all(gpuipc_t *c, gpuipc_kind_t kind, gpuipc_buffer_t **bufs)
{
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .no_sync = 1 };
        double t[FIRST_RUNS];
        char name[64];

        for (int i = 0; i <= FIRST_RUNS; i++) {
                uint64_t t0;

                CHECK_OK(c, gpuipc_buffer_alloc(c, kind, SIZE, 0, &bufs[i]));
                gpu_push(0);
                CHECK_CU(GX(cuMemsetD32, gpu_ptr(bufs[i]), 0x600d0000u + (unsigned)i, SIZE / 4));
                CHECK_CU(CU(cuCtxSynchronize));
                gpu_pop();
                name_of(name, sizeof(name), kind, i);
                t0 = monotonic_us();
                CHECK_OK(c, gpuipc_publish(c, bufs[i], name, &po));
                if (i > 0)
                        t[i - 1] = (double)(monotonic_us() - t0);
        }
        return stat_of(t, FIRST_RUNS);
}

static int producer(HChan *ch, void *arg)
{
        const MeasureArg *a = arg;
        gpuipc_buffer_t *vmm[FIRST_RUNS + 1], *legacy[FIRST_RUNS + 1];
        char msg[256];
        size_t n = 0;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "producer");
        n += (size_t)stat_put(msg + n, sizeof(msg) - n, export_alone(false));
        n += (size_t)stat_put(msg + n, sizeof(msg) - n, export_alone(true));
        n += (size_t)stat_put(msg + n, sizeof(msg) - n, publish_all(c, GPUIPC_KIND_CUDA_VMM, vmm));
        stat_put(msg + n, sizeof(msg) - n, publish_all(c, GPUIPC_KIND_CUDA_LEGACY, legacy));
        h_report(ch, 'p', "%s", msg);
        h_await(ch, 'x', 120000);
        gpuipc_close(c); /* nothing is attached any more: frees everything */
        return 0;
}

/* ---- consumers ---- */

static Stat time_first_attaches(gpuipc_t *c, gpuipc_kind_t kind, gpuipc_buffer_t **held)
{
        double t[FIRST_RUNS];
        char name[64];

        for (int i = 0; i <= FIRST_RUNS; i++) {
                uint64_t t0;

                name_of(name, sizeof(name), kind, i);
                t0 = monotonic_us();
                CHECK_OK(c, gpuipc_attach(c, name, H_SOON_MS, &held[i]));
                if (i > 0)
                        t[i - 1] = (double)(monotonic_us() - t0);
        }
        return stat_of(t, FIRST_RUNS);
}

/* Attaches of a buffer this connection holds already: a round trip, no import. */
static Stat time_cached_attaches(gpuipc_t *c, gpuipc_kind_t kind, const gpuipc_buffer_t *held)
{
        double t[CACHED_RUNS];
        char name[64];

        name_of(name, sizeof(name), kind, 1);
        for (int i = 0; i < CACHED_RUNS; i++) {
                gpuipc_buffer_t *b = NULL;
                uint64_t t0 = monotonic_us();

                CHECK_OK(c, gpuipc_attach(c, name, H_SOON_MS, &b));
                t[i] = (double)(monotonic_us() - t0);
                CHECK(gpuipc_buffer_ptr(b) == gpuipc_buffer_ptr(held));
                CHECK_OK(c, gpuipc_release(c, b));
        }
        return stat_of(t, CACHED_RUNS);
}

static Stat time_pings(gpuipc_t *c)
{
        double t[PING_RUNS];

        for (int i = 0; i < PING_RUNS; i++) {
                uint64_t t0 = monotonic_us();

                CHECK_OK(c, gpuipc_ping(c, H_SOON_MS));
                t[i] = (double)(monotonic_us() - t0);
        }
        return stat_of(t, PING_RUNS);
}

/* GB/s (bytes read plus bytes written, as copy benchmarks count) of BW_COPIES copies src -> dst
 * in stream s, timed with events; run with dev's context current. */
static double copy_rate(GcuDevicePtr dst, GcuDevicePtr src, GcuStream s, GcuEvent e0, GcuEvent e1)
{
        float ms = 0;

        CHECK_CU(GX(cuEventRecord, e0, s));
        for (int i = 0; i < BW_COPIES; i++)
                CHECK_CU(GX(cuMemcpyDtoDAsync, dst, src, SIZE, s));
        CHECK_CU(GX(cuEventRecord, e1, s));
        CHECK_CU(GX(cuEventSynchronize, e1));
        CHECK_CU(GX(cuEventElapsedTime, &ms, e0, e1));
        CHECK(ms > 0);
        return 2.0 * SIZE * BW_COPIES / (ms * 1e-3) / 1e9;
}

/* Copy bandwidth into a local buffer on dev from: [0] a local buffer (on GPU 0: peer access
 * when dev is another GPU), [1] the cuda-vmm mapping, [2] the cuda-legacy mapping; the sources
 * take turns, so clock changes hit them alike. */
static void time_copies(int dev, const gpuipc_buffer_t *vmm, const gpuipc_buffer_t *legacy, Stat ret[3])
{
        GcuDevicePtr dst = gpu_alloc(dev, SIZE), src_local = gpu_alloc(0, SIZE), src[3];
        double t[3][BW_RUNS];
        GcuEvent e0, e1;
        GcuStream s;

        gpu_push(dev);
        if (dev != 0) {
                int can = 0;
                GcuResult r;

                CHECK_CU(GX(cuDeviceCanAccessPeer, &can, cuda_device(dev), cuda_device(0)));
                CHECKF(can, "GPU %d cannot access GPU 0's memory directly", dev);
                r = GX(cuCtxEnablePeerAccess, gpu_ctx(0), 0);
                CHECKF(r == GCU_SUCCESS || r == GCU_ERROR_PEER_ACCESS_ALREADY_ENABLED,
                       "cuCtxEnablePeerAccess = %u (%s)", r, gpu_cu_name(r));
        }
        CHECK_CU(CU(cuStreamCreate, &s, GCU_STREAM_NON_BLOCKING));
        CHECK_CU(GX(cuEventCreate, &e0, 0));
        CHECK_CU(GX(cuEventCreate, &e1, 0));
        src[0] = src_local;
        src[1] = gpu_ptr(vmm);
        src[2] = gpu_ptr(legacy);
        for (int k = 0; k < 3; k++)
                copy_rate(dst, src[k], s, e0, e1); /* warm-up */
        for (int i = 0; i < BW_RUNS; i++)
                for (int k = 0; k < 3; k++)
                        t[k][i] = copy_rate(dst, src[k], s, e0, e1);
        for (int k = 0; k < 3; k++)
                ret[k] = stat_of(t[k], BW_RUNS);
        CHECK_CU(GX(cuEventDestroy, e0));
        CHECK_CU(GX(cuEventDestroy, e1));
        CHECK_CU(CU(cuStreamDestroy, s));
        gpu_pop();
        gpu_free(dev, dst);
        gpu_free(0, src_local);
}

/* Reports 'a' (first and cached attaches of both kinds, and pings) and 'b' (bandwidth). */
static int consumer(HChan *ch, void *arg)
{
        const MeasureArg *a = arg;
        gpuipc_buffer_t *vmm[FIRST_RUNS + 1], *legacy[FIRST_RUNS + 1];
        Stat st[5], bw[3];
        char msg[256];
        size_t n = 0;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "consumer");
        CHECK_OK(c, gpuipc_set_device(c, a->device));
        gpu_free(a->device, gpu_alloc(a->device, 1 << 20)); /* the context exists before timing */
        st[0] = time_first_attaches(c, GPUIPC_KIND_CUDA_VMM, vmm);
        st[1] = time_cached_attaches(c, GPUIPC_KIND_CUDA_VMM, vmm[1]);
        st[2] = time_first_attaches(c, GPUIPC_KIND_CUDA_LEGACY, legacy);
        st[3] = time_cached_attaches(c, GPUIPC_KIND_CUDA_LEGACY, legacy[1]);
        st[4] = time_pings(c);
        for (int i = 0; i < 5; i++)
                n += (size_t)stat_put(msg + n, sizeof(msg) - n, st[i]);
        h_report(ch, 'a', "%s", msg);

        for (int i = 0; i <= FIRST_RUNS; i++) {
                CHECK_EQ(gpuipc_buffer_device_ordinal(vmm[i]), a->device);
                CHECK_EQ(gpuipc_buffer_device_ordinal(legacy[i]), a->device);
        }
        time_copies(a->device, vmm[1], legacy[1], bw);
        n = 0;
        for (int i = 0; i < 3; i++)
                n += (size_t)stat_put(msg + n, sizeof(msg) - n, bw[i]);
        h_report(ch, 'b', "%s", msg);
        for (int i = 0; i <= FIRST_RUNS; i++) {
                CHECK_OK(c, gpuipc_release(c, vmm[i]));
                CHECK_OK(c, gpuipc_release(c, legacy[i]));
        }
        gpuipc_close(c);
        return 0;
}

/* ---- the table ---- */

typedef struct Column {
        bool ran;
        Stat first[2], cached[2], ping, bw[3]; /* [0] vmm, [1] legacy; bw: local, vmm, legacy */
} Column;

static void run_consumer(const HBroker *br, int device, Column *col)
{
        MeasureArg a = { .broker = br, .device = device };
        HChild *k = h_spawn(device ? "consumer-cross" : "consumer", consumer, &a);
        char text[256];
        const char *p;

        h_child_expect(k, 'a', START_MS, text, sizeof(text));
        p = stat_get(text, &col->first[0]);
        p = stat_get(p, &col->cached[0]);
        p = stat_get(p, &col->first[1]);
        p = stat_get(p, &col->cached[1]);
        stat_get(p, &col->ping);
        h_child_expect(k, 'b', START_MS, text, sizeof(text));
        p = stat_get(text, &col->bw[0]);
        p = stat_get(p, &col->bw[1]);
        stat_get(p, &col->bw[2]);
        h_child_wait_ok(k, H_SOON_MS);
        h_child_free(k);
        col->ran = true;
}

static void cell_us(char *buf, size_t cap, const Stat *s)
{
        if (s->p50 >= 1000)
                snprintf(buf, cap, "%.2f ms (%.2f..%.2f)", s->p50 / 1000, s->min / 1000, s->max / 1000);
        else
                snprintf(buf, cap, "%.0f us (%.0f..%.0f)", s->p50, s->min, s->max);
}

static void cell_bw(char *buf, size_t cap, const Stat *s)
{
        snprintf(buf, cap, "%.0f GB/s (%.0f..%.0f)", s->p50, s->min, s->max);
}

static void row(const char *what, const char *same, const char *cross)
{
        printf("| %-60s | %-28s | %-28s |\n", what, same, cross);
}

static void row_us(const char *what, const Column *c, const Stat *same, const Stat *cross)
{
        char a[64], b[64] = "-";

        cell_us(a, sizeof(a), same);
        if (c[1].ran && cross)
                cell_us(b, sizeof(b), cross);
        row(what, a, b);
}

static void row_bw(const char *what, const Column *c, int k)
{
        char a[64], b[64] = "-";

        cell_bw(a, sizeof(a), &c[0].bw[k]);
        if (c[1].ran)
                cell_bw(b, sizeof(b), &c[1].bw[k]);
        row(what, a, b);
}

static void print_table(const Stat pub[4], const Column c[2])
{
        char dashes[64];

        memset(dashes, '-', sizeof(dashes) - 1);
        dashes[sizeof(dashes) - 1] = 0;
        printf("\n# gpuipc on %s; %u MiB buffers; p50 (min..max) of %d runs (attaches: %d first, %d "
               "cached; copies: %d runs of %d)\n",
               gpu_machine_line(), SIZE >> 20, FIRST_RUNS, FIRST_RUNS, CACHED_RUNS, BW_RUNS, BW_COPIES);
        for (int i = 0; i < gpu_machine.count; i++)
                printf("# GPU%d: %s %s\n", i, gpu_machine.name[i], gpu_machine.uuid[i]);
        row("", "same GPU (GPU0 -> GPU0)",
            c[1].ran ? "cross GPU (GPU0 -> GPU1)" : "cross GPU (needs 2 GPUs)");
        printf("|%.62s|%.30s|%.30s|\n", dashes, dashes, dashes);
        row_us("broker round trip (gpuipc_ping)", c, &c[0].ping, &c[1].ping);
        row_us("cuMemExportToShareableHandle alone, right after cuMemCreate", c, &pub[0], NULL);
        row_us("cuMemExportToShareableHandle alone, memory mapped+written", c, &pub[1], NULL);
        row_us("cuda-vmm export: first publish (export + round trip)", c, &pub[2], NULL);
        row_us("cuda-legacy export: first publish (IPC handle + round trip)", c, &pub[3], NULL);
        row_us("cuda-vmm first attach (import + map)", c, &c[0].first[0], &c[1].first[0]);
        row_us("cuda-vmm cached attach", c, &c[0].cached[0], &c[1].cached[0]);
        row_us("cuda-legacy first attach (cuIpcOpenMemHandle)", c, &c[0].first[1], &c[1].first[1]);
        row_us("cuda-legacy cached attach", c, &c[0].cached[1], &c[1].cached[1]);
        row_bw("DtoD copy from a local buffer (GPU0 memory)", c, 0);
        row_bw("DtoD copy from an imported cuda-vmm mapping", c, 1);
        row_bw("DtoD copy from an opened cuda-legacy mapping", c, 2);
        printf("# copies land in a local buffer on the consumer's GPU; GB/s counts bytes read + "
               "written\n\n");
}

static void check_column(const Column *c, const char *where, bool bandwidth)
{
        const char *kinds[] = { "cuda-vmm", "cuda-legacy" };

        for (int k = 0; k < 2; k++)
                CHECKF(c->cached[k].p50 < c->first[k].p50,
                       "%s: a cached %s attach (%.0f us) is not faster than a "
                       "first one (%.0f us)",
                       where, kinds[k], c->cached[k].p50, c->first[k].p50);
        if (!bandwidth)
                return;
        for (int k = 1; k < 3; k++)
                CHECKF(c->bw[k].p50 >= 0.9 * c->bw[0].p50,
                       "%s: copying from a %s mapping runs at %.0f GB/s, "
                       "under 90%% of a local buffer's %.0f GB/s",
                       where, kinds[k - 1], c->bw[k].p50, c->bw[0].p50);
}

/* Prints the cost table for 64 MiB buffers and checks that a cached attach beats a first one and that copying from
 * a mapping reaches 90% of a local copy. */
static void test_measure(void)
{
        HBroker *br = h_broker_start(NULL);
        MeasureArg a = { .broker = br };
        Column col[2] = { 0 };
        char text[256];
        const char *p;
        Stat pub[4];
        HChild *prod;

        if (!gpu_machine.vmm[0])
                h_skip("GPU 0 cannot export cuda-vmm memory as a file descriptor");
        prod = h_spawn("producer", producer, &a);
        h_child_expect(prod, 'p', START_MS, text, sizeof(text));
        p = stat_get(text, &pub[0]);
        p = stat_get(p, &pub[1]);
        p = stat_get(p, &pub[2]);
        stat_get(p, &pub[3]);
        run_consumer(br, 0, &col[0]);
        if (gpu_machine.count >= 2)
                run_consumer(br, 1, &col[1]);
        h_child_tell(prod, 'x');
        h_child_wait_ok(prod, H_SOON_MS);
        h_child_free(prod);
        print_table(pub, col);
        check_column(&col[0], "same GPU", true);
        if (col[1].ran)
                check_column(&col[1], "cross GPU", false);
        h_broker_settle(br);
        h_broker_stop(br);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_measure),
        };

        return gpu_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]), 1);
}
