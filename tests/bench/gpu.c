/* The GPU part (--gpu): runs only where CUDA works, and says why it skipped otherwise.
 *
 *   - first and cached attach of both CUDA kinds, on the buffer's own GPU and (with two GPUs)
 *     mapped onto the other one; the baseline of a first attach is a broker round trip (ping),
 *     the baseline of a cached attach is the first attach (target: at least 10x faster);
 *   - device-to-device copy bandwidth reading through an imported mapping against reading a
 *     local buffer on the same GPU (target: at least 95%);
 *   - rings of 8 cuda-vmm slots to 1 and 8 consumers, stream-ordered against publish/attach
 *     (gpu-ring.c);
 *   - tests/bench/torch_compare.py: PyTorch's own CUDA IPC against the Python module, whose
 *     rows it hands back as tab-separated lines, and the Python rings against their floor and the
 *     C stream ring of the same pass;
 *   - the ring rows again under an MPS daemon of our own (its pipe and log directories in a
 *     temporary directory; the GPU's settings are left as they are), where
 *     nvidia-cuda-mps-control exists and --no-mps is not given: one GPU without MPS runs one
 *     process's context at a time, so every hand-over between processes costs a context switch.
 *
 * CUDA does not survive fork(), so this process never touches it: the producer, the consumer and
 * the probe are children that load CUDA themselves. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "cuda.h"
#include "internal.h"
#include "macro.h"

#define PATTERN_LEN 4096
#define ATTACH_SIZE (64u << 20)

static const gpuipc_kind_t kinds[] = {GPUIPC_KIND_CUDA_VMM, GPUIPC_KIND_CUDA_LEGACY};
static const char *const kind_names[] = {"cuda-vmm", "cuda-legacy"};

/* ---- probing ---- */

typedef struct GpuProbe {
        bool ok;
        int n_devices;
        char reason[512];
        char text[512];
} GpuProbe;

static int probe_child(void *arg)
{
        GpuProbe *g = arg;
        CudaInfo *info = calloc(1, sizeof(*info));
        size_t len = 0;

        if (!info)
                return 1;
        if (gpuipc_cuda_describe(info) < 0) {
                snprintf(g->reason, sizeof(g->reason), "%s", info->reason);
                return 0;
        }
        g->n_devices = info->n_devices;
        if (info->n_devices == 0) {
                snprintf(g->reason, sizeof(g->reason), "CUDA loaded but sees no device");
                return 0;
        }
        g->ok = true;
        for (int i = 0; i < info->n_devices && len < sizeof(g->text) - 1; i++) {
                const CudaDeviceInfo *d = &info->devices[i];
                len += (size_t)snprintf(g->text + len, sizeof(g->text) - len, "%s%d: %s (%s)", i ? "; " : "",
                                        i, d->name.ok ? d->name.text : "?", d->uuid.ok ? d->uuid.text : "?");
        }
        if (len < sizeof(g->text) - 1)
                snprintf(g->text + len, sizeof(g->text) - len, "; driver %d.%d", info->driver_version / 1000,
                         info->driver_version % 1000 / 10);
        return 0;
}

static GpuProbe *probe(void)
{
        GpuProbe *g = shared_alloc(sizeof(*g));

        if (child_wait(spawn(probe_child, g, NULL, 0)) != 0 && !g->reason[0])
                snprintf(g->reason, sizeof(g->reason), "the CUDA probe crashed");
        return g;
}

void gpu_describe(char *out, size_t cap)
{
        GpuProbe *g = probe();

        snprintf(out, cap, "%s", g->ok ? g->text : "");
}

/* ---- the producer ---- */

/* Results per placement (0: the buffer's own GPU, 1: mapped onto GPU 1) and kind. */
typedef struct GpuResult {
        bool attached, copied;
        double ping_us;
        double first_us, first_p90_us, cached_us;
        double bw_map, bw_local; /* GB/s, read + write */
        int map_device;
} GpuResult;

typedef struct GpuShared {
        GpuResult r[2][2];
} GpuShared;

static const char *const placement_names[] = {"same GPU", "GPU 0 -> GPU 1"};

typedef struct GpuArgs {
        const Broker *broker;
        GpuShared *sh;
        int ready, done, n_devices;
        size_t bw_size;
        unsigned trials, copies, rounds;
        int place, kind; /* what one consumer measures */
} GpuArgs;

static void pattern(uint8_t *buf, size_t len, unsigned salt)
{
        for (size_t i = 0; i < len; i++)
                buf[i] = (uint8_t)((i * 7 + salt) % 251);
}

static int producer_main(void *arg)
{
        GpuArgs *a = arg;
        gpuipc_t *c = bench_connect_gpus(a->broker, "bench-gpu-producer");
        gpuipc_buffer_t *att[2], *bw[2];
        uint8_t *pat = malloc(PATTERN_LEN);
        char name[64], b = 1;

        for (int k = 0; k < 2; k++) {
                pattern(pat, PATTERN_LEN, (unsigned)k);
                TRY(c, gpuipc_buffer_alloc(c, kinds[k], ATTACH_SIZE, 0, &att[k]));
                TRY(c, gpuipc_buffer_write(att[k], 0, pat, PATTERN_LEN));
                snprintf(name, sizeof(name), "bench/gpu/%s/attach", kind_names[k]);
                TRY(c, gpuipc_publish(c, att[k], name, NULL));
                TRY(c, gpuipc_buffer_alloc(c, kinds[k], a->bw_size, 0, &bw[k]));
                snprintf(name, sizeof(name), "bench/gpu/%s/bw", kind_names[k]);
                TRY(c, gpuipc_publish(c, bw[k], name, NULL));
        }
        if (write(a->ready, &b, 1) != 1)
                return 1;
        while (read(a->done, &b, 1) < 0 && errno == EINTR)
                ;
        for (int k = 0; k < 2; k++) {
                gpuipc_buffer_t *both[2] = {att[k], bw[k]};
                for (int i = 0; i < 2; i++) {
                        TRY(c, gpuipc_retire(c, both[i]));
                        TRY(c, gpuipc_wait_drained(c, both[i], 30000));
                        TRY(c, gpuipc_buffer_free(c, both[i]));
                }
        }
        gpuipc_close(c);
        return 0;
}

/* ---- the consumer ---- */

typedef GcuResult (*MemcpyDtoD)(GcuDevicePtr dst, GcuDevicePtr src, size_t n);

/* cuMemcpyDtoD from the libcuda that libgpuipc loaded (client/cuda.h lists only what the library
 * itself calls). */
void *bench_libcuda(void)
{
        Dl_info info;
        void *h = NULL;

        if (gcu.cuMemAlloc && dladdr((void *)gcu.cuMemAlloc, &info) && info.dli_fname)
                h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
        if (!h)
                h = dlopen("libcuda.so.1", RTLD_NOW);
        if (!h)
                die("cannot find libcuda again: %s", dlerror());
        return h;
}

static MemcpyDtoD load_dtod(void)
{
        return (MemcpyDtoD)dlsym(bench_libcuda(), "cuMemcpyDtoD_v2");
}

static void cu_check(GcuResult r, const char *what)
{
        if (r != GCU_SUCCESS)
                die("%s failed: CUDA error %u", what, r);
}

static double time_copies(MemcpyDtoD copy, GcuDevicePtr dst, GcuDevicePtr src, size_t size, unsigned n)
{
        uint64_t t0 = monotonic_ns();

        for (unsigned i = 0; i < n; i++)
                cu_check(copy(dst, src, size), "cuMemcpyDtoD");
        cu_check(CU(cuCtxSynchronize), "cuCtxSynchronize");
        /* Read + write, as the probe counts them. */
        return 2.0 * (double)size * n / ((double)(monotonic_ns() - t0) / 1e9) / 1e9;
}

/* Copies through the mapping and from a local buffer, in alternating rounds; medians in GB/s. */
static void bandwidth(gpuipc_t *c, GpuArgs *a, int k, GpuResult *res, MemcpyDtoD copy)
{
        Samples map = {0}, local = {0};
        gpuipc_buffer_t *b;
        GcuDevicePtr src = 0, dst = 0;
        char name[64];
        int dev;

        snprintf(name, sizeof(name), "bench/gpu/%s/bw", kind_names[k]);
        TRY(c, gpuipc_attach(c, name, 30000, &b));
        dev = gpuipc_buffer_device_ordinal(b);
        TRY(c, cuda_ctx_push(c, dev));
        cu_check(CU(cuMemAlloc, &src, a->bw_size), "cuMemAlloc");
        cu_check(CU(cuMemAlloc, &dst, a->bw_size), "cuMemAlloc");
        time_copies(copy, dst, (GcuDevicePtr)(uintptr_t)gpuipc_buffer_ptr(b), a->bw_size, 2);
        time_copies(copy, dst, src, a->bw_size, 2);
        for (unsigned r = 0; r < a->rounds; r++) {
                samples_add(&map, time_copies(copy, dst, (GcuDevicePtr)(uintptr_t)gpuipc_buffer_ptr(b),
                                              a->bw_size, a->copies));
                samples_add(&local, time_copies(copy, dst, src, a->bw_size, a->copies));
        }
        CU(cuMemFree, src);
        CU(cuMemFree, dst);
        TRY(c, cuda_ctx_pop(c, 0));
        res->bw_map = samples_pct(&map, 50);
        res->bw_local = samples_pct(&local, 50);
        res->map_device = dev;
        res->copied = true;
        TRY(c, gpuipc_release(c, b));
        gpuipc_cache_trim(c);
        TRY(c, gpuipc_ping(c, 10000));
        samples_free(&map);
        samples_free(&local);
}

static void attaches(gpuipc_t *c, GpuArgs *a, int k, GpuResult *res)
{
        Samples first = {0}, cached = {0};
        gpuipc_buffer_t *b, *hold = NULL;
        uint8_t *got = malloc(PATTERN_LEN), *want = malloc(PATTERN_LEN);
        char name[64];

        snprintf(name, sizeof(name), "bench/gpu/%s/attach", kind_names[k]);
        pattern(want, PATTERN_LEN, (unsigned)k);
        /* First attaches: the fd (or handle) travels and is imported every time. The first of all
         * pays one-time costs (peer access, driver state), so it is not counted. */
        for (unsigned i = 0; i <= a->trials; i++) {
                uint64_t t0 = monotonic_ns();

                TRY(c, gpuipc_attach(c, name, 30000, &b));
                if (i > 0)
                        samples_add(&first, (double)(monotonic_ns() - t0) / 1000.0);
                if (i == 0) {
                        TRY(c, gpuipc_buffer_read(b, 0, got, PATTERN_LEN));
                        if (memcmp(got, want, PATTERN_LEN) != 0)
                                die("%s: the consumer reads other bytes than the producer wrote",
                                    kind_names[k]);
                }
                TRY(c, gpuipc_release(c, b));
                gpuipc_cache_trim(c);          /* unmaps, and tells the broker to send the fd again */
                TRY(c, gpuipc_ping(c, 10000)); /* takes the unmap's reply out of the way */
        }
        /* Cached: the mapping is kept (cuda-vmm: in the cache after release; cuda-legacy: while
         * another attachment holds it, since legacy opens are never kept idle). */
        TRY(c, gpuipc_attach(c, name, 30000, &hold));
        if (kinds[k] == GPUIPC_KIND_CUDA_VMM) {
                TRY(c, gpuipc_release(c, hold));
                hold = NULL;
        }
        for (unsigned i = 0; i < a->trials; i++) {
                uint64_t t0 = monotonic_ns();

                TRY(c, gpuipc_attach(c, name, 30000, &b));
                samples_add(&cached, (double)(monotonic_ns() - t0) / 1000.0);
                TRY(c, gpuipc_release(c, b));
        }
        if (hold)
                TRY(c, gpuipc_release(c, hold));
        gpuipc_cache_trim(c);
        TRY(c, gpuipc_ping(c, 10000));
        res->first_us = samples_pct(&first, 50);
        res->first_p90_us = samples_pct(&first, 90);
        res->cached_us = samples_pct(&cached, 50);
        res->attached = true;
        samples_free(&first);
        samples_free(&cached);
        free(got);
        free(want);
}

/* One kind in one placement, in a process of its own: a CUDA failure costs only its rows. */
static int consumer_main(void *arg)
{
        GpuArgs *a = arg;
        GpuResult *res = &a->sh->r[a->place][a->kind];
        gpuipc_t *c = bench_connect_gpus(a->broker, "bench-gpu-consumer");
        int dev = a->place == 0 ? 0 : 1;
        MemcpyDtoD copy;
        Samples ping = {0};

        if (a->place == 1)
                TRY(c, gpuipc_set_device(c, 1));
        TRY(c, cuda_ctx_push(c, dev)); /* creates the context outside the timed part */
        TRY(c, cuda_ctx_pop(c, 0));
        copy = load_dtod();
        if (!copy)
                die("this libcuda has no cuMemcpyDtoD_v2");
        for (int i = 0; i < 200; i++) {
                uint64_t t0 = monotonic_ns();
                TRY(c, gpuipc_ping(c, 10000));
                samples_add(&ping, (double)(monotonic_ns() - t0) / 1000.0);
        }
        res->ping_us = samples_pct(&ping, 50);
        samples_free(&ping);
        note("%s, %s: attaches", kind_names[a->kind], placement_names[a->place]);
        attaches(c, a, a->kind, res);
        note("%s, %s: bandwidth", kind_names[a->kind], placement_names[a->place]);
        bandwidth(c, a, a->kind, res, copy);
        gpuipc_close(c);
        return 0;
}

/* ---- PyTorch ---- */

/* Runs a Python script of rows (torch_compare.py, torch_pool.py) against its own broker, with the
 * NULL-terminated extra arguments (or NULL); 0, 77 (skipped) or a failure. */
static int run_torch(const char *script, const char *tsv, const char *const *extra)
{
        char pythonpath[4096];
        const char *old = getenv("PYTHONPATH");
        pid_t pid;

        snprintf(pythonpath, sizeof(pythonpath), "%s%s%s", bench_opts.python_path, old && *old ? ":" : "",
                 old && *old ? old : "");
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid < 0)
                die("fork: %s", strerror(errno));
        if (pid == 0) {
                const char *argv[24];
                int n = 0;

                setenv("PYTHONPATH", pythonpath, 1);
                setenv("GPUIPC_LIBRARY", bench_opts.libgpuipc_path, 1);
                dup2(2, 1); /* its own table goes to our progress stream */
                argv[n++] = bench_opts.python;
                argv[n++] = script;
                argv[n++] = "--broker";
                argv[n++] = bench_opts.broker;
                argv[n++] = "--tsv";
                argv[n++] = tsv;
                if (bench_opts.quick)
                        argv[n++] = "--quick";
                for (size_t i = 0; extra && extra[i] && n < 23; i++)
                        argv[n++] = extra[i];
                argv[n] = NULL;
                execvp(argv[0], (char **)argv);
                fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
                _exit(127);
        }
        return child_wait(pid);
}

/* Rows from torch_compare.py: metric, value, unit, baseline, baseline value, target, note. */
static void add_torch_rows(const char *tsv)
{
        FILE *f = fopen(tsv, "re");
        char line[1024];

        if (!f)
                return;
        while (fgets(line, sizeof(line), f)) {
                char *field[7] = {0}, *p = line;
                Row *r;

                line[strcspn(line, "\n")] = 0;
                for (int i = 0; i < 7 && p; i++) {
                        field[i] = p;
                        p = strchr(p, '\t');
                        if (p)
                                *p++ = 0;
                }
                if (!field[6])
                        continue;
                r = row_add(field[0], strtod(field[1], NULL), field[2], field[3],
                            *field[4] ? strtod(field[4], NULL) : NAN);
                if (strncmp(field[5], "ratio<=", 7) == 0)
                        row_target_ratio_max(r, strtod(field[5] + 7, NULL));
                else if (strncmp(field[5], "ratio>=", 7) == 0)
                        row_target_ratio_min(r, strtod(field[5] + 7, NULL));
                else if (strncmp(field[5], "value<=", 7) == 0) {
                        char text[40];

                        snprintf(text, sizeof(text), "<= %s %s", field[5] + 7, field[2]);
                        row_target_value_max(r, strtod(field[5] + 7, NULL), text);
                }
                row_note(r, "%s", field[6]);
        }
        fclose(f);
}

/* ---- MPS ---- */

/* An MPS control daemon of the bench's own: its pipe and log directories under a temporary
 * directory, named to the children through CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY
 * (this process never loads CUDA; the children it forks afterwards do, and become MPS clients).
 * Nothing about the GPU is changed: no compute mode, no nvidia-smi. */
typedef struct Mps {
        char dir[64], pipe[96], log[96];
} Mps;

static bool mps_start(Mps *m, char *why, size_t cap)
{
        char control[128];
        int rc;

        snprintf(m->dir, sizeof(m->dir), "%.40s/gpuipc-mps.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(m->dir)) {
                snprintf(why, cap, "mkdtemp: %s", strerror(errno));
                return false;
        }
        snprintf(m->pipe, sizeof(m->pipe), "%s/pipe", m->dir);
        snprintf(m->log, sizeof(m->log), "%s/log", m->dir);
        if (mkdir(m->pipe, 0700) < 0 || mkdir(m->log, 0700) < 0) {
                snprintf(why, cap, "mkdir: %s", strerror(errno));
                return false;
        }
        setenv("CUDA_MPS_PIPE_DIRECTORY", m->pipe, 1);
        setenv("CUDA_MPS_LOG_DIRECTORY", m->log, 1);
        rc = system("nvidia-cuda-mps-control -d");
        if (rc != 0) {
                snprintf(why, cap, "'nvidia-cuda-mps-control -d' failed (status %d): is it installed?", rc);
                unsetenv("CUDA_MPS_PIPE_DIRECTORY");
                unsetenv("CUDA_MPS_LOG_DIRECTORY");
                return false;
        }
        snprintf(control, sizeof(control), "%s/control", m->pipe);
        for (int i = 0; i < 500 && access(control, F_OK) != 0; i++)
                sleep_ns(10000000);
        return true;
}

/* How many clients the daemon's log says connected (the proof that the pass ran under MPS). */
static int mps_clients(const Mps *m)
{
        char path[128], line[512];
        FILE *f;
        int n = 0;

        snprintf(path, sizeof(path), "%s/control.log", m->log);
        f = fopen(path, "re");
        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                n += strcasestr(line, "new client") != NULL;
        fclose(f);
        return n;
}

static void mps_stop(Mps *m)
{
        char control[128], cmd[160];
        FILE *p = popen("nvidia-cuda-mps-control", "w");

        if (p) {
                fputs("quit\n", p);
                pclose(p);
        }
        snprintf(control, sizeof(control), "%s/control", m->pipe);
        for (int i = 0; i < 1000 && access(control, F_OK) == 0; i++)
                sleep_ns(10000000);
        unsetenv("CUDA_MPS_PIPE_DIRECTORY");
        unsetenv("CUDA_MPS_LOG_DIRECTORY");
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", m->dir);
        if (system(cmd) != 0)
                note("could not remove %s", m->dir);
}

/* ---- the section ---- */

/* The ring rows (C, then Python through torch_compare.py), with suffix after every metric. */
static void ring_pass(const char *suffix, bool rings_only)
{
        double c_ring[2] = { NAN, NAN };
        const char *extra[8];
        char tsv[4096], c_ring_arg[64];
        int rc, n = 0;

        gpu_ring_rows(suffix, c_ring);
        if (!bench_opts.torch_script || !*bench_opts.torch_script)
                return;
        if (bench_opts.out_dir)
                snprintf(tsv, sizeof(tsv), "%s/torch_compare%s.tsv", bench_opts.out_dir, *suffix ? "-mps" : "");
        else
                snprintf(tsv, sizeof(tsv), "%s/gpuipc-bench-torch.%d.tsv",
                         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
        note("PyTorch comparison%s: %s %s", suffix, bench_opts.python, bench_opts.torch_script);
        snprintf(c_ring_arg, sizeof(c_ring_arg), "1=%.3f,8=%.3f", c_ring[0], c_ring[1]);
        extra[n++] = "--c-ring";
        extra[n++] = c_ring_arg;
        if (rings_only)
                extra[n++] = "--rings-only";
        extra[n++] = "--suffix";
        extra[n++] = suffix;
        extra[n] = NULL;
        rc = run_torch(bench_opts.torch_script, tsv, extra);
        if (rc == 77)
                printf("PyTorch comparison skipped (torch_compare.py says why above)\n");
        else if (rc != 0)
                printf("PyTorch comparison%s failed (exit status %d); rows it finished are kept\n", suffix, rc);
        add_torch_rows(tsv);
        if (!bench_opts.out_dir)
                unlink(tsv);
}

static void mps_pass(void)
{
        char why[256];
        Mps m;
        Row *r;

        if (bench_opts.no_mps)
                return;
        if (!mps_start(&m, why, sizeof(why))) {
                r = row_add("ring rows under MPS", NAN, "", "", NAN);
                row_note(r, "not run: %s", why);
                return;
        }
        note("MPS control daemon started (pipe %s)", m.pipe);
        ring_pass(" [MPS]", true);
        r = row_add("MPS clients in this pass", mps_clients(&m), "", "", NAN);
        row_note(r, "from the daemon's control.log: every process of the pass connected to its server");
        mps_stop(&m);
}

/* torch_pool.py (pools and weight sync): without MPS, then (unless --no-mps) under an MPS daemon
 * the script starts for itself when nvidia-cuda-mps-control is there. */
static void pool_rows(void)
{
        char script[4096], tsv[4096];
        const char *dir;

        if (!bench_opts.torch_script || !*bench_opts.torch_script)
                return;
        dir = strrchr(bench_opts.torch_script, '/');
        snprintf(script, sizeof(script), "%.*storch_pool.py", dir ? (int)(dir - bench_opts.torch_script + 1) : 0,
                 bench_opts.torch_script);
        if (bench_opts.out_dir)
                snprintf(tsv, sizeof(tsv), "%s/torch_pool.tsv", bench_opts.out_dir);
        else
                snprintf(tsv, sizeof(tsv), "%s/gpuipc-bench-pool.%d.tsv",
                         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
        unlink(tsv);
        for (int mps = 0; mps < 2; mps++) {
                const char *const extra[] = { mps ? "--mps" : NULL, NULL };
                int rc;

                if (mps && (bench_opts.no_mps || system("command -v nvidia-cuda-mps-control >/dev/null 2>&1") != 0)) {
                        printf("pool rows under MPS skipped: %s\n",
                               bench_opts.no_mps ? "--no-mps" : "no nvidia-cuda-mps-control");
                        break;
                }
                note("pools and weight sync%s: %s %s", mps ? " under MPS" : "", bench_opts.python, script);
                rc = run_torch(script, tsv, extra);
                if (rc == 77)
                        printf("pool rows skipped (torch_pool.py says why above)\n");
                else if (rc != 0)
                        printf("pool rows failed (exit status %d); rows it finished are kept\n", rc);
        }
        add_torch_rows(tsv);
        if (!bench_opts.out_dir)
                unlink(tsv);
}

static void add_rows(const GpuShared *sh, int n_placements)
{
        for (int place = 0; place < n_placements; place++) {
                for (int k = 0; k < 2; k++) {
                        const GpuResult *x = &sh->r[place][k];
                        const char *pn = placement_names[place];
                        char metric[96], baseline[64];
                        Row *r;

                        if (x->attached) {
                                snprintf(metric, sizeof(metric), "%s first attach (import), %s, p50",
                                         kind_names[k], pn);
                                r = row_add(metric, x->first_us, "us", "broker round trip (ping)",
                                            x->ping_us);
                                row_note(r, "p90 %.0f us", x->first_p90_us);
                                snprintf(metric, sizeof(metric), "%s cached attach, %s, p50", kind_names[k],
                                         pn);
                                r = row_add(metric, x->cached_us, "us", "first attach", x->first_us);
                                row_target_ratio_max(r, 0.1);
                                row_note(r, "%s",
                                         kinds[k] == GPUIPC_KIND_CUDA_LEGACY
                                                 ? "while another attachment holds the open handle"
                                                 : "mapping kept after release");
                        }
                        if (x->copied) {
                                snprintf(metric, sizeof(metric), "%s copy through the mapping, %s",
                                         kind_names[k], pn);
                                snprintf(baseline, sizeof(baseline), "local buffer on GPU %d",
                                         x->map_device);
                                r = row_add(metric, x->bw_map, "GB/s", baseline, x->bw_local);
                                if (place == 0)
                                        row_target_ratio_min(r, 0.95);
                                row_note(r, "DtoD read+write; %s",
                                         place == 0 ? "same GPU" : "across NVLink/PCIe");
                        }
                }
        }
}

void section_gpu(void)
{
        GpuProbe *g = probe();
        GpuShared *sh;
        GpuArgs a = {0};
        Broker broker;
        int ready[2], done[2], n_placements;
        pid_t prod;
        char b;

        if (!g->ok) {
                printf("GPU part skipped: %s\n", g->reason);
                note("skipped: %s", g->reason);
                return;
        }
        if (bench_opts.gpu_rings_only) {
                ring_pass("", true);
                mps_pass();
                return;
        }
        sh = shared_alloc(sizeof(*sh));
        broker_start(&broker, NULL, 0);
        if (pipe2(ready, O_CLOEXEC) < 0 || pipe2(done, O_CLOEXEC) < 0)
                die("pipe: %s", strerror(errno));
        a = (GpuArgs){&broker,
                      sh,
                      ready[1],
                      done[0],
                      g->n_devices,
                      (bench_opts.quick ? 128u : 512u) << 20,
                      bench_opts.quick ? 5 : 20,
                      bench_opts.quick ? 5 : 20,
                      bench_opts.quick ? 3 : 5};
        {
                int keep[2] = {ready[1], done[0]};
                prod = spawn(producer_main, &a, keep, 2);
        }
        close(ready[1]);
        close(done[0]);
        if (read(ready[0], &b, 1) != 1)
                die("the GPU producer failed (its message is above)");
        n_placements = g->n_devices >= 2 ? 2 : 1;
        note("%d GPU(s); producer ready", g->n_devices);
        for (a.place = 0; a.place < n_placements; a.place++) {
                for (a.kind = 0; a.kind < 2; a.kind++) {
                        if (child_wait(spawn(consumer_main, &a, NULL, 0)) != 0)
                                printf("GPU part: %s, %s failed (the message is above); its rows are "
                                       "missing\n",
                                       kind_names[a.kind], placement_names[a.place]);
                }
        }
        close(done[1]);
        if (child_wait(prod) != 0)
                note("the producer failed while cleaning up");
        add_rows(sh, n_placements);
        broker_stop(&broker);
        ring_pass("", false);
        mps_pass();
        pool_rows();
}
