/* Producer and consumer in sibling PID namespaces, as two containers of a pod without
 * shareProcessNamespace: each in a PID and mount namespace of its own with a fresh /proc, the
 * broker in the parent namespace. What is checked is what was measured on an H100
 * (docs/legacy-ipc.md): a legacy memory handle opens in a sibling namespace when the two processes'
 * PIDs (as each sees its own) differ and fails with CUDA_ERROR_INVALID_CONTEXT when they are equal;
 * a legacy IPC event also needs the same /dev/shm (CUDA_ERROR_MAP_FAILED otherwise). Shown raw (the
 * seed's way: 64 bytes through a file) and through gpuipc, which refuses the failing cases before
 * CUDA runs (same-pid, shm) and lets the working ones work. cuda-vmm crosses regardless. */
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

/* The two cases that differ in what CUDA decides. */
static const GpuNs PID_1 = { .pid = 1 }, PID_2 = { .pid = 2 }, PID_3 = { .pid = 3 },
                   PID_3_OWN_SHM = { .pid = 3, .private_shm = true };

typedef struct NsArg {
        const HBroker *broker;
        gpuipc_kind_t kind;
        const char *name;
        uint64_t seed;
        char handle_file[160]; /* the raw cases: where the producer writes its handle */
        GcuResult want;        /* the raw cases: what the consumer's open must return */
        int want_err;          /* the gpuipc cases: what the consumer's attach or open must return */
        gpuipc_t *observer;    /* the buffer cases: checks, once the consumer is done, that it holds nothing */
} NsArg;

static void skip_unless_namespaces(void)
{
        char why[256];

        if (!gpu_pidns_possible(why, sizeof(why)))
                h_skip("cannot create PID namespaces here: %s", why);
}

/* Starts the producer and waits for its 'p' ("<pidns> <pid>"), then the consumer, and waits for
 * its 'd' ("<pidns> <pid> <outcome>"); both must end well. Logs where each ran. */
static void run_pair(const char *what, HChildFn producer, GpuNs pns, HChildFn consumer, GpuNs cns, NsArg *a)
{
        char ptext[64], ctext[96];
        HChild *p, *k;

        p = gpu_spawn_ns("producer", producer, a, pns);
        h_child_expect(p, 'p', START_MS, ptext, sizeof(ptext));
        k = gpu_spawn_ns("consumer", consumer, a, cns);
        h_child_expect(k, 'd', START_MS, ctext, sizeof(ctext));
        h_log("%s: producer (PID namespace, PID) %s; consumer %s", what, ptext, ctext);
        CHECK(strtoull(ptext, NULL, 10) != strtoull(ctext, NULL, 10)); /* sibling namespaces */
        h_child_wait_ok(k, H_SOON_MS);
        if (a->observer) {
                HStat st;

                /* Refused or released: the consumer holds nothing, and the buffer is still there. */
                CHECK_OK(a->observer, h_stat(a->observer, a->name, &st));
                CHECK_EQ(st.refs, 0);
        }
        h_child_tell(p, 'x');
        h_child_wait_ok(p, H_SOON_MS);
        h_child_free(k);
        h_child_free(p);
}

static void write_file(const char *path, const void *data, size_t len)
{
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

        CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
        CHECK(write(fd, data, len) == (ssize_t)len);
        CHECK(close(fd) == 0);
}

static void read_file(const char *path, void *data, size_t len)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);

        CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
        CHECK(read(fd, data, len) == (ssize_t)len);
        close(fd);
}

static const char *cu_text(GcuResult r)
{
        const char *desc = NULL;

        return CU(cuGetErrorString, r, &desc) == GCU_SUCCESS && desc ? desc : "?";
}

/* ---- through gpuipc ---- */

/* Publishes a buffer of a->kind filled with the pattern, reports 'p', waits for 'x', takes it down. */
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

/* Attaches a->name: it must verify byte for byte, or be refused with a->want_err before CUDA runs,
 * naming the PID both processes have. */
static int consumer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        gpuipc_buffer_t *b = NULL;
        gpuipc_t *c;
        char want[32];
        int r;

        gpu_init();
        c = gpu_connect(a->broker, "consumer");
        r = gpuipc_attach(c, a->name, H_SOON_MS, &b);
        if (a->want_err == 0) {
                CHECK_OK(c, r);
                gpu_verify_buffer(b, -1, a->seed);
                CHECK_OK(c, gpuipc_release(c, b));
        } else {
                CHECKF(r == a->want_err, "attach = %d (%s) [%s], expected %d (%s)", r, gpuipc_err_name(r),
                       gpuipc_errmsg(c), a->want_err, gpuipc_err_name(a->want_err));
                snprintf(want, sizeof(want), "both PID %d", (int)getpid());
                CHECKF(strstr(gpuipc_errmsg(c), want) && strstr(gpuipc_errmsg(c), "gpuipcctl run") &&
                               strstr(gpuipc_errmsg(c), "cuda-vmm"),
                       "the refusal does not name the PID and both fixes: %s", gpuipc_errmsg(c));
                CHECKF(!strstr(gpuipc_errmsg(c), "one PID namespace"), "%s", gpuipc_errmsg(c));
                printf("# refused before CUDA, as expected: %s\n", gpuipc_errmsg(c));
                fflush(stdout);
        }
        h_report(ch, 'd', "%" PRIu64 " %d %s", gpu_pidns(), (int)getpid(), r == 0 ? "verified" : "refused");
        gpuipc_close(c);
        return 0;
}

static void run_gpuipc(gpuipc_kind_t kind, const char *name, GpuNs cns, int want_err)
{
        HBroker *br = h_broker_start(NULL);
        gpuipc_t *obs = h_connect(br, "observer");
        NsArg a = { .broker = br, .kind = kind, .name = name, .seed = 0x9e + (uint64_t)kind, .want_err = want_err,
                    .observer = obs };

        skip_unless_namespaces();
        if (kind == GPUIPC_KIND_CUDA_VMM && !gpu_machine.vmm[0])
                h_skip("GPU 0 cannot export cuda-vmm memory as a file descriptor");
        run_pair(name, producer, PID_1, consumer, cns, &a);
        gpuipc_close(obs);
        h_broker_settle(br);
        h_broker_stop(br);
}

/* cuda-vmm crosses sibling PID namespaces (the memory travels as an fd), even with equal PIDs. */
static void test_vmm_works_between_pid_1s(void)
{
        run_gpuipc(GPUIPC_KIND_CUDA_VMM, "ns/vmm", PID_1, 0);
}

/* cuda-legacy between two PID 1s (each the first process of its container): refused by the broker
 * with same-pid before CUDA runs, naming the PID and the fixes. */
static void test_legacy_between_pid_1s_refused(void)
{
        run_gpuipc(GPUIPC_KIND_CUDA_LEGACY, "ns/legacy-1-1", PID_1, GPUIPC_E_SAME_PID);
}

/* cuda-legacy between PID 1 and PID 2 of sibling namespaces: attached, and the bytes are the
 * producer's. */
static void test_legacy_between_distinct_pids_works(void)
{
        run_gpuipc(GPUIPC_KIND_CUDA_LEGACY, "ns/legacy-1-2", PID_2, 0);
}

/* ---- the seed's way, without gpuipc ---- */

/* cuMemAlloc, fill, cuIpcGetMemHandle, and the 64 bytes into a file (as the seed's producer
 * does); reports 'p', keeps the memory until told 'x'. */
static int raw_producer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        GcuIpcMemHandle handle;
        GcuDevicePtr p;

        gpu_init();
        p = gpu_alloc(0, SIZE);
        gpu_fill(0, p, SIZE, a->seed);
        gpu_push(0);
        CHECK_CU(CU(cuIpcGetMemHandle, &handle, p));
        gpu_pop();
        write_file(a->handle_file, &handle, sizeof(handle));
        h_report(ch, 'p', "%" PRIu64 " %d", gpu_pidns(), (int)getpid());
        h_await(ch, 'x', 60000);
        gpu_free(0, p);
        return 0;
}

/* Reads the handle file and opens it directly: it must return a->want, and what opens must hold
 * the producer's bytes. */
static int raw_consumer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        GcuIpcMemHandle handle;
        GcuDevicePtr p = 0;
        GcuResult r;

        gpu_init();
        read_file(a->handle_file, &handle, sizeof(handle));
        gpu_push(0);
        r = CU(cuIpcOpenMemHandle, &p, handle, GCU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        gpu_pop();
        printf("# raw cuIpcOpenMemHandle as PID %d: %u %s (%s)\n", (int)getpid(), r, gpu_cu_name(r), cu_text(r));
        fflush(stdout);
        CHECKF(r == a->want, "cuIpcOpenMemHandle = %u (%s), expected %u (%s)", r, gpu_cu_name(r), a->want,
               gpu_cu_name(a->want));
        if (r == GCU_SUCCESS) {
                gpu_verify_dev(0, p, SIZE, a->seed, "the memory opened from the raw handle");
                gpu_push(0);
                CHECK_CU(CU(cuIpcCloseMemHandle, p));
                gpu_pop();
        }
        h_report(ch, 'd', "%" PRIu64 " %d %u", gpu_pidns(), (int)getpid(), r);
        return 0;
}

static void run_raw(const char *what, HChildFn producer_fn, HChildFn consumer_fn, GpuNs cns, GcuResult want)
{
        NsArg a = { .seed = 0x5eed, .want = want };

        skip_unless_namespaces();
        snprintf(a.handle_file, sizeof(a.handle_file), "%s/handle.bin", h_case_dir());
        run_pair(what, producer_fn, PID_1, consumer_fn, cns, &a);
}

/* The seed article's failure, and its true cause: both processes PID 1 of sibling namespaces. */
static void test_raw_legacy_between_pid_1s_fails(void)
{
        run_raw("raw legacy 1/1", raw_producer, raw_consumer, PID_1, GCU_ERROR_INVALID_CONTEXT);
}

/* The same handle opens across the same namespaces once the PIDs differ, and the bytes verify. */
static void test_raw_legacy_between_distinct_pids_works(void)
{
        run_raw("raw legacy 1/3", raw_producer, raw_consumer, PID_3, GCU_SUCCESS);
}

/* ---- legacy IPC events ---- */

/* Creates an interprocess event, records it after filling memory, writes its handle to the file,
 * reports 'p' and keeps the event until 'x'. */
static int raw_event_producer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        GcuIpcEventHandle handle;
        GcuDevicePtr p;
        GcuEvent ev;

        gpu_init();
        p = gpu_alloc(0, SIZE);
        gpu_push(0);
        CHECK_CU(CU(cuEventCreate, &ev, GCU_EVENT_DISABLE_TIMING | GCU_EVENT_INTERPROCESS));
        CHECK_CU(CU(cuIpcGetEventHandle, &handle, ev));
        CHECK_CU(CU(cuEventRecord, ev, NULL));
        gpu_pop();
        write_file(a->handle_file, &handle, sizeof(handle));
        h_report(ch, 'p', "%" PRIu64 " %d", gpu_pidns(), (int)getpid());
        h_await(ch, 'x', 60000);
        gpu_push(0);
        CHECK_CU(CU(cuEventDestroy, ev));
        gpu_pop();
        gpu_free(0, p);
        return 0;
}

/* Opens the event from the file: it must return a->want; an opened event must complete. */
static int raw_event_consumer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        GcuIpcEventHandle handle;
        GcuEvent ev = NULL;
        GcuResult r, q = GCU_ERROR_NOT_READY;

        gpu_init();
        read_file(a->handle_file, &handle, sizeof(handle));
        gpu_push(0);
        r = CU(cuIpcOpenEventHandle, &ev, handle);
        printf("# raw cuIpcOpenEventHandle as PID %d: %u %s (%s)\n", (int)getpid(), r, gpu_cu_name(r), cu_text(r));
        fflush(stdout);
        CHECKF(r == a->want, "cuIpcOpenEventHandle = %u (%s), expected %u (%s)", r, gpu_cu_name(r), a->want,
               gpu_cu_name(a->want));
        if (r == GCU_SUCCESS) {
                for (int i = 0; i < 10000 && q == GCU_ERROR_NOT_READY; i++) {
                        q = CU(cuEventQuery, ev);
                        if (q == GCU_ERROR_NOT_READY)
                                usleep(1000);
                }
                CHECKF(q == GCU_SUCCESS, "the opened event never completed: %u (%s)", q, gpu_cu_name(q));
                CHECK_CU(CU(cuEventDestroy, ev));
        }
        gpu_pop();
        h_report(ch, 'd', "%" PRIu64 " %d %u", gpu_pidns(), (int)getpid(), r);
        return 0;
}

/* A legacy IPC event opens across sibling namespaces with distinct PIDs and the same /dev/shm. */
static void test_raw_event_distinct_pids_shared_shm_works(void)
{
        run_raw("raw event 1/3, one /dev/shm", raw_event_producer, raw_event_consumer, PID_3, GCU_SUCCESS);
}

/* With a /dev/shm of its own the opener fails with CUDA_ERROR_MAP_FAILED, although the PIDs differ. */
static void test_raw_event_private_shm_fails(void)
{
        run_raw("raw event 1/3, own /dev/shm", raw_event_producer, raw_event_consumer, PID_3_OWN_SHM,
                GCU_ERROR_MAP_FAILED);
}

/* Creates an IPC-event fence, signals it, reports 'p', keeps it until 'x'. */
static int fence_producer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        gpuipc_fence_t *f = NULL;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "fence-producer");
        CHECK_OK(c, gpuipc_fence_create_ipc_event(c, a->name, 0, &f));
        CHECK_OK(c, gpuipc_fence_signal(f, NULL, 1));
        h_report(ch, 'p', "%" PRIu64 " %d", gpu_pidns(), (int)getpid());
        h_await(ch, 'x', 60000);
        gpuipc_fence_close(f);
        gpuipc_close(c);
        return 0;
}

/* Opens the fence: it must open and complete, or be refused with a->want_err before CUDA runs. */
static int fence_consumer(HChan *ch, void *arg)
{
        const NsArg *a = arg;
        gpuipc_fence_t *f = NULL;
        uint64_t done = 0;
        gpuipc_t *c;
        int r;

        gpu_init();
        c = gpu_connect(a->broker, "fence-consumer");
        r = gpuipc_fence_open(c, a->name, H_SOON_MS, &f);
        if (a->want_err == 0) {
                CHECK_OK(c, r);
                for (int i = 0; i < 10000 && !done; i++) {
                        CHECK_OK(c, gpuipc_fence_value(f, &done));
                        if (!done)
                                usleep(1000);
                }
                CHECK(done == 1);
                gpuipc_fence_close(f);
        } else {
                CHECKF(r == a->want_err, "fence open = %d (%s) [%s], expected %s", r, gpuipc_err_name(r),
                       gpuipc_errmsg(c), gpuipc_err_name(a->want_err));
                CHECKF(strstr(gpuipc_errmsg(c), "/dev/shm") && strstr(gpuipc_errmsg(c), "gpuipc_fence_create"),
                       "the refusal does not name the cause and the fixes: %s", gpuipc_errmsg(c));
                printf("# refused before CUDA, as expected: %s\n", gpuipc_errmsg(c));
                fflush(stdout);
        }
        h_report(ch, 'd', "%" PRIu64 " %d %s", gpu_pidns(), (int)getpid(), r == 0 ? "completed" : "refused");
        gpuipc_close(c);
        return 0;
}

static void run_fence(const char *name, GpuNs cns, int want_err)
{
        HBroker *br = h_broker_start(NULL);
        NsArg a = { .broker = br, .name = name, .want_err = want_err };

        skip_unless_namespaces();
        run_pair(name, fence_producer, PID_1, fence_consumer, cns, &a);
        h_broker_settle(br);
        h_broker_stop(br);
}

/* An IPC-event fence works across containers with distinct PIDs and one /dev/shm... */
static void test_event_fence_shared_shm_works(void)
{
        run_fence("ns/fence-shared", PID_2, 0);
}

/* ...and with another /dev/shm gpuipc refuses it (shm) before CUDA fails. */
static void test_event_fence_private_shm_refused(void)
{
        run_fence("ns/fence-private", PID_3_OWN_SHM, GPUIPC_E_SHM);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_raw_legacy_between_pid_1s_fails),
                H_TEST(test_raw_legacy_between_distinct_pids_works),
                H_TEST(test_legacy_between_pid_1s_refused),
                H_TEST(test_legacy_between_distinct_pids_works),
                H_TEST(test_vmm_works_between_pid_1s),
                H_TEST(test_raw_event_distinct_pids_shared_shm_works),
                H_TEST(test_raw_event_private_shm_fails),
                H_TEST(test_event_fence_shared_shm_works),
                H_TEST(test_event_fence_private_shm_refused),
        };

        return gpu_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]), 1);
}
