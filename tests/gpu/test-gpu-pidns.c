/* Producer and consumer in sibling PID namespaces, as two containers of a pod without
 * shareProcessNamespace: each runs as process 1 of a PID namespace of its own with a fresh /proc,
 * the broker stays in the parent namespace. cuda-vmm crosses (the memory travels as an fd);
 * cuda-legacy is refused by the broker with GPUIPC_E_PIDNS and a message naming the fix. And the
 * CUDA error the broker prevents, shown raw: a legacy handle passed the seed's way (64 bytes in a
 * file) fails to open in the sibling namespace with CUDA_ERROR_INVALID_CONTEXT, and opens in a
 * process of the producer's own namespace. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"

#define SIZE     ((16u << 20) + 4096 + 3)
#define START_MS 30000

typedef struct NsArg {
        const HBroker *broker;
        gpuipc_kind_t kind;
        const char *name;
        uint64_t seed;
        char handle_file[160]; /* the raw bypass: where the producer writes its legacy handle */
        bool sibling;          /* the raw bypass: the consumer is in a sibling PID namespace */
} NsArg;

/* Publishes a buffer of a->kind filled with the pattern, reports 'p' with its PID namespace,
 * then waits for 'x' and takes it down. */
static int producer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        gpuipc_buffer_t *b = NULL;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "producer");
        CHECK_OK(c, gpuipc_buffer_alloc(c, a->kind, SIZE, 0, &b));
        gpu_fill_buffer(b, a->seed);
        CHECK_OK(c, gpuipc_publish(c, b, a->name, NULL));
        h_report(ch, 'p', "%" PRIu64 " %d", gpu_pidns(), (int)getpid());
        h_await(ch, 'x', 60000);
        CHECK_OK(c, gpuipc_retire(c, b));
        CHECK_OK(c, gpuipc_wait_drained(c, b, H_SOON_MS));
        CHECK_OK(c, gpuipc_buffer_free(c, b));
        gpuipc_close(c);
        return 0;
}

/* Attaches a->name: cuda-vmm must work and verify; cuda-legacy must be refused with
 * GPUIPC_E_PIDNS before CUDA is asked. Reports 'd' with its PID namespace and the outcome. */
static int consumer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        gpuipc_buffer_t *b = NULL;
        gpuipc_t *c;
        int r;

        gpu_init();
        c = gpu_connect(a->broker, "consumer");
        r = gpuipc_attach(c, a->name, H_SOON_MS, &b);
        if (a->kind == GPUIPC_KIND_CUDA_VMM) {
                CHECK_OK(c, r);
                gpu_verify_buffer(b, -1, a->seed);
                CHECK_OK(c, gpuipc_release(c, b));
                h_report(ch, 'd', "%" PRIu64 " verified", gpu_pidns());
        } else {
                CHECKF(r == GPUIPC_E_PIDNS, "attach = %d (%s) [%s], expected GPUIPC_E_PIDNS", r,
                       gpuipc_strerror(r), gpuipc_errmsg(c));
                CHECKF(strstr(gpuipc_errmsg(c), "shareProcessNamespace"),
                       "the refusal does not name the fix: %s", gpuipc_errmsg(c));
                CHECKF(strstr(gpuipc_strerror(r), "namespace"), "gpuipc_strerror(GPUIPC_E_PIDNS) = '%s'",
                       gpuipc_strerror(r));
                printf("# refused as expected: %s\n", gpuipc_errmsg(c));
                fflush(stdout);
                h_report(ch, 'd', "%" PRIu64 " refused", gpu_pidns());
        }
        gpuipc_close(c);
        return 0;
}

/* The consumer's report: "<pidns> <outcome>". */
static uint64_t report_pidns(const char *text)
{
        return strtoull(text, NULL, 10);
}

static void run_sibling(gpuipc_kind_t kind, const char *name)
{
        HBroker *br = h_broker_start(NULL);
        gpuipc_t *obs = h_connect(br, "observer");
        NsArg a = { .broker = br, .kind = kind, .name = name, .seed = 0x9e + (uint64_t)kind };
        char ptext[64], ctext[64], why[256];
        uint64_t pns, cns;
        HChild *p, *k;
        HStat st;

        if (!gpu_pidns_possible(why, sizeof(why)))
                h_skip("cannot create PID namespaces here: %s", why);
        if (kind == GPUIPC_KIND_CUDA_VMM && !gpu_machine.vmm[0])
                h_skip("GPU 0 cannot export cuda-vmm memory as a file descriptor");
        p = gpu_spawn_pidns("producer", producer, &a);
        h_child_expect(p, 'p', START_MS, ptext, sizeof(ptext));
        k = gpu_spawn_pidns("consumer", consumer, &a);
        h_child_expect(k, 'd', START_MS, ctext, sizeof(ctext));
        pns = report_pidns(ptext);
        cns = report_pidns(ctext);
        h_log("producer in PID namespace %" PRIu64 ", consumer in %" PRIu64 ", the broker in %" PRIu64
              ": consumer %s",
              pns, cns, gpu_pidns(), strchr(ctext, ' ') + 1);
        CHECK(pns && cns && pns != cns && pns != gpu_pidns() && cns != gpu_pidns());
        CHECK_EQ(strtol(strchr(ptext, ' ') + 1, NULL, 10), 1);
        h_child_wait_ok(k, H_SOON_MS);
        /* Refused or released: the consumer holds nothing. */
        CHECK_OK(obs, h_stat(obs, a.name, &st));
        CHECK_EQ(st.refs, 0);
        h_child_tell(p, 'x');
        h_child_wait_ok(p, H_SOON_MS);
        h_child_free(k);
        h_child_free(p);
        gpuipc_close(obs);
        h_broker_settle(br);
        h_broker_stop(br);
}

/* cuda-vmm crosses sibling PID namespaces (the memory travels as an fd), data checked byte for byte. */
static void test_sibling_namespaces_vmm_works(void)
{
        run_sibling(GPUIPC_KIND_CUDA_VMM, "ns/vmm");
}

/* Between sibling PID namespaces the broker refuses cuda-legacy with GPUIPC_E_PIDNS and a message naming the fix. */
static void test_sibling_namespaces_legacy_refused_by_broker(void)
{
        run_sibling(GPUIPC_KIND_CUDA_LEGACY, "ns/legacy");
}

/* ---- the seed's way, without gpuipc ---- */

/* cuMemAlloc, fill, cuIpcGetMemHandle, and the 64 bytes into a file (as the seed's producer
 * does); reports 'p', keeps the memory until told 'x'. */
static int raw_producer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        GcuIpcMemHandle handle;
        GcuDevicePtr p;
        int fd;

        gpu_init();
        p = gpu_alloc(0, SIZE);
        gpu_fill(0, p, SIZE, a->seed);
        gpu_push(0);
        CHECK_CU(CU(cuIpcGetMemHandle, &handle, p));
        gpu_pop();
        fd = open(a->handle_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        CHECKF(fd >= 0, "open %s: %s", a->handle_file, strerror(errno));
        CHECK(write(fd, &handle, sizeof(handle)) == (ssize_t)sizeof(handle));
        CHECK(close(fd) == 0);
        h_report(ch, 'p', "%" PRIu64, gpu_pidns());
        h_await(ch, 'x', 60000);
        gpu_free(0, p);
        return 0;
}

/* Reads the handle file and opens it directly. In a sibling namespace that must fail with
 * CUDA_ERROR_INVALID_CONTEXT (printed for the log); in the producer's namespace it must work and
 * show the data. Reports 'd' with its namespace and the CUDA result. */
static int raw_consumer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        bool sibling = a->sibling;
        GcuIpcMemHandle handle;
        GcuDevicePtr p = 0;
        GcuResult r;
        const char *desc = NULL;
        int fd;

        gpu_init();
        fd = open(a->handle_file, O_RDONLY | O_CLOEXEC);
        CHECKF(fd >= 0, "open %s: %s", a->handle_file, strerror(errno));
        CHECK(read(fd, &handle, sizeof(handle)) == (ssize_t)sizeof(handle));
        close(fd);
        gpu_push(0);
        r = CU(cuIpcOpenMemHandle, &p, handle, GCU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (CU(cuGetErrorString, r, &desc) != GCU_SUCCESS || !desc)
                desc = "?";
        if (sibling)
                printf("# raw CUDA error without gpuipc: cuIpcOpenMemHandle of a handle from a sibling PID "
                       "namespace = %u %s (%s)\n",
                       r, gpu_cu_name(r), desc);
        else
                printf("# control without gpuipc: cuIpcOpenMemHandle of a handle from the same PID "
                       "namespace = "
                       "%u %s\n",
                       r, gpu_cu_name(r));
        fflush(stdout);
        if (sibling) {
                CHECKF(r == GCU_ERROR_INVALID_CONTEXT,
                       "cuIpcOpenMemHandle in a sibling PID namespace = %u (%s), "
                       "expected 201 (CUDA_ERROR_INVALID_CONTEXT)",
                       r, gpu_cu_name(r));
        } else {
                CHECKF(r == GCU_SUCCESS, "cuIpcOpenMemHandle in the producer's PID namespace = %u (%s)", r,
                       gpu_cu_name(r));
        }
        gpu_pop();
        if (r == GCU_SUCCESS) {
                gpu_verify_dev(0, p, SIZE, a->seed, "the memory opened from the raw handle");
                gpu_push(0);
                CHECK_CU(CU(cuIpcCloseMemHandle, p));
                gpu_pop();
        }
        h_report(ch, 'd', "%" PRIu64 " %u", gpu_pidns(), r);
        return 0;
}

static void run_raw(bool sibling)
{
        NsArg a = { .seed = 0x5eed, .sibling = sibling };
        char ptext[64], ctext[64], why[256];
        HChild *p, *k;

        if (sibling && !gpu_pidns_possible(why, sizeof(why)))
                h_skip("cannot create PID namespaces here: %s", why);
        snprintf(a.handle_file, sizeof(a.handle_file), "%s/handle.bin", h_case_dir());
        p = sibling ? gpu_spawn_pidns("raw-producer", raw_producer, &a)
                    : h_spawn("raw-producer", raw_producer, &a);
        h_child_expect(p, 'p', START_MS, ptext, sizeof(ptext));
        k = sibling ? gpu_spawn_pidns("raw-consumer", raw_consumer, &a)
                    : h_spawn("raw-consumer", raw_consumer, &a);
        h_child_expect(k, 'd', START_MS, ctext, sizeof(ctext));
        if (sibling)
                CHECK(report_pidns(ptext) != report_pidns(ctext));
        else
                CHECK(report_pidns(ptext) == report_pidns(ctext));
        h_child_wait_ok(k, H_SOON_MS);
        h_child_tell(p, 'x');
        h_child_wait_ok(p, H_SOON_MS);
        h_child_free(k);
        h_child_free(p);
}

/* The CUDA failure the broker prevents, shown raw: a legacy IPC handle fails to open in a sibling PID namespace
 * (CUDA_ERROR_INVALID_CONTEXT). */
static void test_raw_legacy_handle_fails_across_sibling_namespaces(void)
{
        run_raw(true);
}

/* The same raw legacy handle opens in a process of the producer's own PID namespace. */
static void test_raw_legacy_handle_works_in_one_namespace(void)
{
        run_raw(false);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_sibling_namespaces_vmm_works),
                H_TEST(test_sibling_namespaces_legacy_refused_by_broker),
                H_TEST(test_raw_legacy_handle_fails_across_sibling_namespaces),
                H_TEST(test_raw_legacy_handle_works_in_one_namespace),
        };

        return gpu_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]), 1);
}
