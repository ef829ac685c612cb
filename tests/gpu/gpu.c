/* GPU-suite helpers: see gpu.h. */
#include "gpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

GpuMachine gpu_machine;
GpuApi gx;

/* ---- the machine ---- */

static int write_full(int fd, const void *buf, size_t len)
{
        const char *p = buf;

        while (len) {
                ssize_t n = write(fd, p, len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return -1;
                p += n;
                len -= (size_t)n;
        }
        return 0;
}

static size_t read_full(int fd, void *buf, size_t len)
{
        size_t got = 0;

        while (got < len) {
                ssize_t n = read(fd, (char *)buf + got, len - got);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                got += (size_t)n;
        }
        return got;
}

/* In the probe child: what the driver says about this machine. */
static void probe_child(int wr)
{
        static CudaInfo info;
        static GpuMachine m;

        if (gpuipc_cuda_describe(&info) < 0) {
                snprintf(m.why, sizeof(m.why), "%s", info.reason);
        } else {
                m.count = info.n_devices;
                m.driver = info.driver_version;
                for (int i = 0; i < info.n_devices; i++) {
                        const CudaDeviceInfo *d = &info.devices[i];

                        snprintf(m.name[i], sizeof(m.name[i]), "%s", d->name.ok ? d->name.text : "?");
                        snprintf(m.uuid[i], sizeof(m.uuid[i]), "%s", d->uuid.ok ? d->uuid.text : "");
                        m.vmm[i] = d->vmm.ok && d->vmm.value && d->posix_fd.ok && d->posix_fd.value;
                        m.mem_ops_64[i] = d->mem_ops_64.ok && d->mem_ops_64.value;
                }
                if (m.count == 0)
                        snprintf(m.why, sizeof(m.why), "the NVIDIA driver reports no devices");
        }
        _exit(write_full(wr, &m, sizeof(m)) == 0 ? 0 : 1);
}

/* Asks a child (CUDA must stay uninitialized in this process: see gpu.h). */
static void probe(void)
{
        int p[2], status = 0;
        pid_t pid;

        if (pipe2(p, O_CLOEXEC) < 0) {
                snprintf(gpu_machine.why, sizeof(gpu_machine.why), "pipe: %s", strerror(errno));
                return;
        }
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid == 0) {
                close(p[0]);
                probe_child(p[1]);
        }
        close(p[1]);
        if (pid < 0 || read_full(p[0], &gpu_machine, sizeof(gpu_machine)) != sizeof(gpu_machine)) {
                memset(&gpu_machine, 0, sizeof(gpu_machine));
                snprintf(gpu_machine.why, sizeof(gpu_machine.why), "the CUDA probe process failed");
        }
        close(p[0]);
        if (pid > 0)
                waitpid(pid, &status, 0);
        if (pid > 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0) && gpu_machine.count > 0) {
                gpu_machine.count = 0;
                snprintf(gpu_machine.why, sizeof(gpu_machine.why),
                         "the CUDA probe process ended with status 0x%x", (unsigned)status);
        }
}

const char *gpu_machine_line(void)
{
        static char line[256];

        snprintf(line, sizeof(line), "%d x %s, CUDA driver %d.%d", gpu_machine.count,
                 gpu_machine.count ? gpu_machine.name[0] : "no GPU", gpu_machine.driver / 1000,
                 gpu_machine.driver % 1000 / 10);
        return line;
}

int gpu_main(int argc, char **argv, const HTest *tests, size_t n_tests, int min_gpus)
{
        setvbuf(stdout, NULL, _IOLBF, 0);
        probe();
        if (gpu_machine.count == 0) {
                printf("SKIP: no usable GPU: %s\n", gpu_machine.why);
                return 77;
        }
        if (gpu_machine.count < min_gpus) {
                printf("SKIP: needs %d GPUs; this machine has %d (%s)\n", min_gpus, gpu_machine.count,
                       gpu_machine_line());
                return 77;
        }
        printf("# %s\n", gpu_machine_line());
        for (int i = 0; i < gpu_machine.count; i++)
                printf("# GPU%d: %s %s, cuda-vmm %s, fences %s\n", i, gpu_machine.name[i],
                       gpu_machine.uuid[i], gpu_machine.vmm[i] ? "yes" : "no",
                       gpu_machine.mem_ops_64[i] ? "yes" : "no");
        return h_main(argc, argv, tests, n_tests);
}

void gpu_need(int n)
{
        if (gpu_machine.count < n)
                h_skip("needs %d GPUs; this machine has %d", n, gpu_machine.count);
}

/* ---- CUDA in a child ---- */

typedef void (*AnyFn)(void);
typedef GcuResult (*GetProcV2)(const char *symbol, void **pfn, int version, uint64_t flags,
                               unsigned int *status);

/* As libgpuipc resolves its own: cuGetProcAddress for the variant of the given CUDA version with
 * the legacy default stream, else the exported name. */
static void *resolve(void *dl, GetProcV2 get, const char *symbol, int version, const char *exported)
{
        unsigned int status = 0;
        void *p = NULL;

        if (get && (get(symbol, &p, version, GCU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != GCU_SUCCESS ||
                    status != GCU_GET_PROC_ADDRESS_SUCCESS))
                p = NULL;
        if (!p)
                p = dlsym(dl, exported);
        return p;
}

#define RESOLVE(member, version, exported)                                                                  \
        do {                                                                                                \
                void *p_ = resolve(dl, get, #member, version, exported);                                    \
                memcpy(&gx.member, &p_, sizeof(p_));                                                        \
        } while (0)

void gpu_init(void)
{
        const char *path = getenv("GPUIPC_LIBCUDA");
        GetProcV2 get = NULL;
        void *dl, *g;

        CHECKF(cuda_load() == 0, "CUDA is unusable in this process although the probe found %d GPU(s): %s",
               gpu_machine.count, cuda_load_error());
        CHECKF(cuda_device_count() == gpu_machine.count, "this process sees %d GPUs, the probe saw %d",
               cuda_device_count(), gpu_machine.count);
        dl = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        CHECKF(dl, "dlopen libcuda: %s", dlerror());
        g = dlsym(dl, "cuGetProcAddress_v2");
        memcpy(&get, &g, sizeof(g));
        RESOLVE(cuMemsetD8, 3020, "cuMemsetD8_v2");
        RESOLVE(cuMemsetD32, 3020, "cuMemsetD32_v2");
        RESOLVE(cuMemsetD32Async, 3020, "cuMemsetD32Async");
        RESOLVE(cuMemcpyDtoD, 3020, "cuMemcpyDtoD_v2");
        RESOLVE(cuMemcpyDtoDAsync, 3020, "cuMemcpyDtoDAsync_v2");
        RESOLVE(cuMemAllocHost, 3020, "cuMemAllocHost_v2");
        RESOLVE(cuMemFreeHost, 2000, "cuMemFreeHost");
        RESOLVE(cuEventCreate, 2000, "cuEventCreate");
        RESOLVE(cuEventRecord, 2000, "cuEventRecord");
        RESOLVE(cuEventSynchronize, 2000, "cuEventSynchronize");
        RESOLVE(cuEventElapsedTime, 2000, "cuEventElapsedTime");
        RESOLVE(cuEventDestroy, 4000, "cuEventDestroy_v2");
        RESOLVE(cuDeviceCanAccessPeer, 4000, "cuDeviceCanAccessPeer");
        RESOLVE(cuCtxEnablePeerAccess, 4000, "cuCtxEnablePeerAccess");
}

const char *gpu_cu_name(GcuResult r)
{
        const char *s = NULL;

        if (r == GCU_ERROR_MISSING_ENTRY)
                return "the driver lacks this entry point";
        if (CU(cuGetErrorName, r, &s) != GCU_SUCCESS || !s)
                return "unknown CUDA error";
        return s;
}

GcuContext gpu_ctx(int ordinal)
{
        static GcuContext ctx[CUDA_MAX_DEVICES];

        CHECKF(ordinal >= 0 && ordinal < cuda_device_count(), "no CUDA device %d", ordinal);
        if (!ctx[ordinal])
                CHECK_CU(CU(cuDevicePrimaryCtxRetain, &ctx[ordinal], cuda_device(ordinal)));
        return ctx[ordinal];
}

void gpu_push(int ordinal)
{
        CHECK_CU(CU(cuCtxPushCurrent, gpu_ctx(ordinal)));
}

void gpu_pop(void)
{
        GcuContext ctx;

        CHECK_CU(CU(cuCtxPopCurrent, &ctx));
}

gpuipc_t *gpu_connect(const HBroker *b, const char *label)
{
        gpuipc_options_t o = { .struct_size = sizeof(o), .socket_path = b->sock, .label = label };
        gpuipc_t *c = NULL;
        int r = gpuipc_connect(&c, &o);

        CHECKF(r == 0, "connect to %s: %s [%s]", b->sock, gpuipc_strerror(r), gpuipc_errmsg(NULL));
        return c;
}

GcuDevicePtr gpu_alloc(int ordinal, size_t size)
{
        GcuDevicePtr p = 0;

        gpu_push(ordinal);
        CHECK_CU(CU(cuMemAlloc, &p, size));
        gpu_pop();
        return p;
}

void gpu_free(int ordinal, GcuDevicePtr p)
{
        gpu_push(ordinal);
        CHECK_CU(CU(cuMemFree, p));
        gpu_pop();
}

static void *xmalloc(size_t n)
{
        void *p = malloc(n ? n : 1);

        CHECKF(p, "out of memory (%zu bytes)", n);
        return p;
}

void gpu_fill(int ordinal, GcuDevicePtr p, size_t len, uint64_t seed)
{
        void *host = xmalloc(len);

        h_pattern_fill(host, len, seed);
        gpu_push(ordinal);
        CHECK_CU(CU(cuMemcpyHtoD, p, host, len));
        CHECK_CU(CU(cuCtxSynchronize));
        gpu_pop();
        free(host);
}

static void check_pattern(const void *host, size_t len, uint64_t seed, const char *what)
{
        size_t at = h_pattern_check(host, len, seed);

        CHECKF(at == SIZE_MAX, "%s differs from pattern %llu at byte %zu of %zu (0x%02x)", what,
               (unsigned long long)seed, at, len, at == SIZE_MAX ? 0 : ((const uint8_t *)host)[at]);
}

void gpu_verify_dev(int ordinal, GcuDevicePtr p, size_t len, uint64_t seed, const char *what)
{
        uint8_t *host = xmalloc(len);

        memset(host, 0x5a, len);
        gpu_push(ordinal);
        CHECK_CU(CU(cuMemcpyDtoH, host, p, len));
        gpu_pop();
        check_pattern(host, len, seed, what);
        free(host);
}

void gpu_fill_buffer(gpuipc_buffer_t *b, uint64_t seed)
{
        size_t len = gpuipc_buffer_size(b);
        void *host = xmalloc(len);
        int r;

        h_pattern_fill(host, len, seed);
        r = gpuipc_buffer_write(b, 0, host, len);
        CHECKF(r == 0, "gpuipc_buffer_write('%s', %zu bytes) = %d: %s", gpuipc_buffer_name(b), len, r,
               gpuipc_strerror(r));
        free(host);
}

GcuDevicePtr gpu_ptr(const gpuipc_buffer_t *b)
{
        return (GcuDevicePtr)(uintptr_t)gpuipc_buffer_ptr(b);
}

void gpu_verify_buffer(const gpuipc_buffer_t *b, int ordinal, uint64_t seed)
{
        size_t len = gpuipc_buffer_size(b);
        uint8_t *host = xmalloc(len);
        GcuDevicePtr local;
        char what[320];
        int r;

        if (ordinal < 0)
                ordinal = gpuipc_buffer_device_ordinal(b);
        memset(host, 0x5a, len);
        r = gpuipc_buffer_read(b, 0, host, len);
        CHECKF(r == 0, "gpuipc_buffer_read('%s', %zu bytes) = %d: %s", gpuipc_buffer_name(b), len, r,
               gpuipc_strerror(r));
        snprintf(what, sizeof(what), "'%s' read with gpuipc_buffer_read", gpuipc_buffer_name(b));
        check_pattern(host, len, seed, what);

        local = gpu_alloc(ordinal, len);
        memset(host, 0x5a, len);
        gpu_push(ordinal);
        CHECK_CU(GX(cuMemcpyDtoD, local, gpu_ptr(b), len));
        CHECK_CU(CU(cuCtxSynchronize));
        CHECK_CU(CU(cuMemcpyDtoH, host, local, len));
        gpu_pop();
        gpu_free(ordinal, local);
        snprintf(what, sizeof(what), "'%s' copied device to device on GPU %d", gpuipc_buffer_name(b),
                 ordinal);
        check_pattern(host, len, seed, what);
        free(host);
}

/* ---- PID namespaces ---- */

uint64_t gpu_pidns(void)
{
        struct stat st;

        return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* In the first process of the new PID namespace: a mount namespace of its own whose changes stay
 * inside, and a /proc that shows this namespace. 0, or -errno with the failed step in why. */
static int enter_container(char *why, size_t cap)
{
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
                snprintf(why, cap, "making mounts private: %s", strerror(errno));
                return -errno;
        }
        if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) {
                snprintf(why, cap, "mounting a fresh /proc: %s", strerror(errno));
                return -errno;
        }
        return 0;
}

static int wait_exit_code(pid_t pid)
{
        int st = 0;

        while (waitpid(pid, &st, 0) < 0)
                if (errno != EINTR)
                        return 127;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

bool gpu_pidns_possible(char *why, size_t cap)
{
        int p[2];
        pid_t pid;
        char msg[256] = "";
        size_t n;
        int code;

        CHECK(pipe2(p, O_CLOEXEC) == 0);
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
                pid_t init;

                close(p[0]);
                if (unshare(CLONE_NEWPID | CLONE_NEWNS) < 0) {
                        snprintf(msg, sizeof(msg), "unshare(CLONE_NEWPID | CLONE_NEWNS): %s (needs root)",
                                 strerror(errno));
                        (void)!write(p[1], msg, strlen(msg));
                        _exit(1);
                }
                init = fork();
                if (init == 0) {
                        if (enter_container(msg, sizeof(msg)) < 0) {
                                (void)!write(p[1], msg, strlen(msg));
                                _exit(1);
                        }
                        _exit(getpid() == 1 ? 0 : 2);
                }
                _exit(init < 0 ? 1 : wait_exit_code(init));
        }
        close(p[1]);
        n = read_full(p[0], msg, sizeof(msg) - 1);
        msg[n] = 0;
        close(p[0]);
        code = wait_exit_code(pid);
        if (code != 0)
                snprintf(why, cap, "%s", msg[0] ? msg : "a new PID namespace did not start as expected");
        return code == 0;
}

typedef struct PidnsArg {
        HChildFn fn;
        void *arg;
        GpuNs ns;
} PidnsArg;

static void init_alarm(int sig)
{
        static const char msg[] = "TIMEOUT: a PID-namespace child ran out of time\n";

        (void)sig;
        (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
        _exit(1);
}

/* Process 1 of the new namespace with a.ns.pid > 1: uses up the PIDs below the one fn must have,
 * then runs fn in a child and passes its exit code on. */
static int run_at_pid(HChan *ch, const PidnsArg *a)
{
        pid_t pid;

        for (;;) {
                pid = fork();
                CHECK(pid >= 0);
                if (pid == 0) {
                        if ((unsigned)getpid() < a->ns.pid)
                                _exit(0);
                        CHECK_EQ((unsigned)getpid(), a->ns.pid);
                        _exit(a->fn(ch, a->arg));
                }
                if ((unsigned)pid >= a->ns.pid)
                        return wait_exit_code(pid);
                (void)wait_exit_code(pid);
        }
}

/* Runs in the h_spawn() child: it stays in the case's PID namespace and waits for process 1 of
 * the new one, which runs the role (or starts the process that does) and inherits the channel to
 * the parent. */
static int pidns_child(HChan *ch, void *arg)
{
        PidnsArg a = *(PidnsArg *)arg;
        const char *t = getenv("GPUIPC_TEST_CASE_TIMEOUT");
        unsigned timeout = t && *t ? (unsigned)strtoul(t, NULL, 10) : 60;
        char why[256];
        pid_t pid;

        CHECKF(unshare(CLONE_NEWPID | CLONE_NEWNS) == 0, "unshare(CLONE_NEWPID | CLONE_NEWNS): %s",
               strerror(errno));
        pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
                /* Process 1 ignores signals it has no handler for: the alarm needs one. The
                 * death signal comes from outside the namespace and is delivered. */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                signal(SIGALRM, init_alarm);
                alarm(timeout ? timeout : 60);
                CHECKF(enter_container(why, sizeof(why)) == 0, "%s", why);
                CHECK_EQ(getpid(), 1);
                if (a.ns.private_shm)
                        CHECKF(mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") == 0,
                               "mounting a private /dev/shm: %s", strerror(errno));
                _exit(a.ns.pid > 1 ? run_at_pid(ch, &a) : a.fn(ch, a.arg));
        }
        return wait_exit_code(pid);
}

HChild *gpu_spawn_ns(const char *name, HChildFn fn, void *arg, GpuNs ns)
{
        static PidnsArg a; /* copied by the fork inside h_spawn() */

        a = (PidnsArg){ fn, arg, ns };
        return h_spawn(name, pidns_child, &a);
}

HChild *gpu_spawn_pidns(const char *name, HChildFn fn, void *arg)
{
        return gpu_spawn_ns(name, fn, arg, (GpuNs){ 0 });
}
