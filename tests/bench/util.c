/* gpuipc-bench helpers: time, samples, the shared table, child processes, /proc readings, a
 * broker on a temporary socket and raw requests. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "internal.h"
#include "macro.h"
#include "seals.h"

BenchOpts bench_opts;
Table *table;
Machine *machine;
const char *section_name = "main";

/* ---- failing ---- */

void die(const char *fmt, ...)
{
        va_list ap;

        fflush(stdout);
        fprintf(stderr, "gpuipc-bench: %s: ", section_name);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        exit(1);
}

void note(const char *fmt, ...)
{
        va_list ap;

        fprintf(stderr, "[%s] ", section_name);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
}

/* ---- time ---- */

void sleep_ns(uint64_t ns)
{
        struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

void sleep_until_ns(uint64_t t)
{
        struct timespec ts = {(time_t)(t / 1000000000u), (long)(t % 1000000000u)};

        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
                ;
}

/* ---- samples ---- */

void samples_add(Samples *s, double v)
{
        if (s->n == s->cap) {
                size_t cap = s->cap ? s->cap * 2 : 1024;
                double *p = realloc(s->v, cap * sizeof(*p));
                if (!p)
                        die("out of memory");
                s->v = p;
                s->cap = cap;
        }
        s->v[s->n++] = v;
        s->sorted = false;
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

double samples_pct(Samples *s, double p)
{
        size_t i;

        if (!s->n)
                return NAN;
        if (!s->sorted) {
                qsort(s->v, s->n, sizeof(*s->v), cmp_double);
                s->sorted = true;
        }
        i = (size_t)ceil(p / 100.0 * (double)s->n);
        return s->v[i ? i - 1 : 0];
}

double samples_mean(const Samples *s)
{
        double sum = 0;

        if (!s->n)
                return NAN;
        for (size_t i = 0; i < s->n; i++)
                sum += s->v[i];
        return sum / (double)s->n;
}

double samples_max(Samples *s)
{
        return samples_pct(s, 100);
}

void samples_free(Samples *s)
{
        free(s->v);
        *s = (Samples){0};
}

/* ---- the table ---- */

Row *row_add(const char *metric, double value, const char *unit, const char *baseline, double base)
{
        int i = __atomic_fetch_add(&table->n, 1, __ATOMIC_SEQ_CST);
        Row *r;

        if (i >= ROWS_MAX)
                die("more than %d rows", ROWS_MAX);
        r = &table->rows[i];
        memset(r, 0, sizeof(*r));
        snprintf(r->section, sizeof(r->section), "%s", section_name);
        snprintf(r->metric, sizeof(r->metric), "%s", metric);
        snprintf(r->unit, sizeof(r->unit), "%s", unit);
        snprintf(r->baseline, sizeof(r->baseline), "%s", baseline ? baseline : "");
        r->value = value;
        r->base = base;
        r->ratio = isnan(base) || base == 0 ? NAN : value / base;
        return r;
}

static void verdict(Row *r, bool ok)
{
        r->verdict = ok ? VERDICT_MET : VERDICT_MISSED;
}

void row_target_ratio_max(Row *r, double limit)
{
        snprintf(r->target, sizeof(r->target), "<= %gx", limit);
        verdict(r, !isnan(r->ratio) && r->ratio <= limit);
}

void row_target_ratio_min(Row *r, double limit)
{
        snprintf(r->target, sizeof(r->target), ">= %gx", limit);
        verdict(r, !isnan(r->ratio) && r->ratio >= limit);
}

void row_target_value_max(Row *r, double limit, const char *text)
{
        snprintf(r->target, sizeof(r->target), "%s", text);
        verdict(r, !isnan(r->value) && r->value <= limit);
}

void row_target_value_min(Row *r, double limit, const char *text)
{
        snprintf(r->target, sizeof(r->target), "%s", text);
        verdict(r, !isnan(r->value) && r->value >= limit);
}

void row_note(Row *r, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(r->note, sizeof(r->note), fmt, ap);
        va_end(ap);
}

FILE *out_open(const char *name, const char *header)
{
        char path[4096];
        FILE *f;

        if (!bench_opts.out_dir)
                return NULL;
        snprintf(path, sizeof(path), "%s/%s", bench_opts.out_dir, name);
        f = fopen(path, "we");
        if (!f)
                die("cannot write %s: %s", path, strerror(errno));
        if (header)
                fprintf(f, "%s\n", header);
        return f;
}

/* ---- processes ---- */

void *shared_alloc(size_t size)
{
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

        if (p == MAP_FAILED)
                die("cannot map %zu bytes of shared memory: %s", size, strerror(errno));
        return p;
}

static int cmp_int(const void *a, const void *b)
{
        return *(const int *)a - *(const int *)b;
}

/* Closes every fd from 3 up except those in keep. */
static void close_all_but(const int *keep, size_t n_keep)
{
        int sorted[64];
        unsigned lo = 3;

        if (n_keep > 64)
                n_keep = 64;
        memcpy(sorted, keep, n_keep * sizeof(int));
        qsort(sorted, n_keep, sizeof(int), cmp_int);
        for (size_t i = 0; i < n_keep; i++) {
                if (sorted[i] < (int)lo)
                        continue;
                if ((unsigned)sorted[i] > lo)
                        close_range(lo, (unsigned)sorted[i] - 1, 0);
                lo = (unsigned)sorted[i] + 1;
        }
        close_range(lo, ~0u, 0);
}

pid_t spawn(int (*fn)(void *arg), void *arg, const int *keep, size_t n_keep)
{
        pid_t parent = getpid(), pid;

        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid < 0)
                die("fork: %s", strerror(errno));
        if (pid > 0)
                return pid;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
                _exit(1);
        close_all_but(keep, n_keep);
        _exit(fn(arg));
}

int child_wait(pid_t pid)
{
        int st;

        while (waitpid(pid, &st, 0) < 0) {
                if (errno != EINTR)
                        return -1;
        }
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void pin_to_cpu(pid_t pid, int cpu)
{
        cpu_set_t set;

        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(pid, sizeof(set), &set) < 0)
                die("cannot pin pid %d to CPU %d: %s", (int)pid, cpu, strerror(errno));
}

rlim_t raise_nofile(rlim_t n)
{
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return 0;
        if (rl.rlim_cur >= n)
                return rl.rlim_cur;
        rl.rlim_cur = n;
        if (rl.rlim_max < n)
                rl.rlim_max = n; /* needs CAP_SYS_RESOURCE */
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
                getrlimit(RLIMIT_NOFILE, &rl);
                rl.rlim_cur = rl.rlim_max;
                setrlimit(RLIMIT_NOFILE, &rl);
        }
        getrlimit(RLIMIT_NOFILE, &rl);
        return rl.rlim_cur;
}

/* ---- /proc ---- */

static bool read_file(const char *path, char *buf, size_t cap)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n;

        if (fd < 0)
                return false;
        n = read(fd, buf, cap - 1);
        close(fd);
        if (n < 0)
                return false;
        buf[n] = 0;
        return true;
}

uint64_t proc_cpu_ns(pid_t pid)
{
        char path[64], buf[1024];
        unsigned long long ut = 0, st = 0;
        const char *p;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        if (!read_file(path, buf, sizeof(buf)) || !(p = strrchr(buf, ')')))
                return 0;
        /* After "pid (comm)": state is field 3, utime 14, stime 15. */
        if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
                return 0;
        return (ut + st) * (1000000000ull / (unsigned long long)sysconf(_SC_CLK_TCK));
}

uint64_t proc_sched_ns(pid_t pid)
{
        char path[96], buf[256];
        uint64_t sum = 0;
        struct dirent *e;
        DIR *d;

        snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
        d = opendir(path);
        if (!d)
                return 0;
        while ((e = readdir(d))) {
                if (e->d_name[0] == '.')
                        continue;
                snprintf(path, sizeof(path), "/proc/%d/task/%.20s/schedstat", (int)pid, e->d_name);
                if (read_file(path, buf, sizeof(buf)))
                        sum += strtoull(buf, NULL, 10);
        }
        closedir(d);
        return sum;
}

uint64_t proc_status_kib(pid_t pid, const char *key)
{
        char path[64], buf[4096];
        const char *p;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        if (!read_file(path, buf, sizeof(buf)) || !(p = strstr(buf, key)))
                return 0;
        return strtoull(p + strlen(key), NULL, 10);
}

/* ---- the broker ---- */

const char *broker_cgroup_procs;

void broker_start(Broker *b, const char *const *extra, rlim_t nofile)
{
        const char *argv[48];
        size_t n = 0;
        pid_t pid;

        snprintf(b->dir, sizeof(b->dir), "%.40s/gpuipc-bench.XXXXXX",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(b->dir))
                die("mkdtemp: %s", strerror(errno));
        snprintf(b->sock, sizeof(b->sock), "%s/s.sock", b->dir);
        snprintf(b->log, sizeof(b->log), "%s/broker.log", b->dir);
        argv[n++] = bench_opts.broker;
        argv[n++] = "--socket";
        argv[n++] = b->sock;
        argv[n++] = "--seccomp";
        argv[n++] = bench_opts.seccomp;
        argv[n++] = "--log-level";
        argv[n++] = "warn";
        for (size_t i = 0; extra && extra[i] && n < ARRAY_SIZE(argv) - 1; i++)
                argv[n++] = extra[i];
        argv[n] = NULL;

        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid < 0)
                die("fork: %s", strerror(errno));
        if (pid == 0) {
                int log = open(b->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (log >= 0) {
                        dup2(log, 1);
                        dup2(log, 2);
                }
                close_range(3, ~0u, 0);
                if (broker_cgroup_procs) {
                        char self[32];
                        int fd = open(broker_cgroup_procs, O_WRONLY | O_CLOEXEC);

                        snprintf(self, sizeof(self), "%d", (int)getpid());
                        if (fd < 0 || write(fd, self, strlen(self)) < 0)
                                fprintf(stderr, "cannot join the cgroup of %s: %s\n", broker_cgroup_procs,
                                        strerror(errno));
                        if (fd >= 0)
                                close(fd);
                }
                if (nofile) {
                        struct rlimit rl = {nofile, nofile};
                        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                                fprintf(stderr, "setrlimit(RLIMIT_NOFILE, %llu): %s\n",
                                        (unsigned long long)nofile, strerror(errno));
                }
                execv(argv[0], (char **)argv);
                fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
                _exit(127);
        }
        b->pid = pid;
        /* Ready once it answers. */
        gpuipc_close(bench_connect(b, "bench-probe"));
}

void broker_stop(Broker *b)
{
        char path[160];
        uint64_t deadline = monotonic_ns() + 10000000000ull;
        int st;

        if (b->pid > 0) {
                kill(b->pid, SIGTERM);
                while (waitpid(b->pid, &st, WNOHANG) == 0) {
                        if (monotonic_ns() > deadline) {
                                kill(b->pid, SIGKILL);
                                waitpid(b->pid, &st, 0);
                                break;
                        }
                        sleep_ns(2000000);
                }
                b->pid = 0;
        }
        unlink(b->sock);
        unlink(b->log);
        snprintf(path, sizeof(path), "%s", b->dir);
        rmdir(path);
}

static gpuipc_t *connect_to(const Broker *b, const char *label, bool gpus)
{
        gpuipc_options_t o = {
                .struct_size = sizeof(o),
                .socket_path = b->sock, .label = label, .connect_timeout_ms = 10000, .no_gpus = !gpus};
        gpuipc_t *c = NULL;
        int r = gpuipc_connect(&c, &o);

        if (r < 0) {
                char buf[2048] = "";
                int fd = open(b->log, O_RDONLY | O_CLOEXEC);
                if (fd >= 0) {
                        ssize_t n = read(fd, buf, sizeof(buf) - 1);
                        buf[n > 0 ? n : 0] = 0;
                        close(fd);
                }
                die("cannot connect to the broker at %s: %s [%s]\nbroker log:\n%s", b->sock,
                    gpuipc_strerror(r), gpuipc_errmsg(NULL), buf);
        }
        return c;
}

gpuipc_t *bench_connect(const Broker *b, const char *label)
{
        return connect_to(b, label, false);
}

gpuipc_t *bench_connect_gpus(const Broker *b, const char *label)
{
        return connect_to(b, label, true);
}

/* ---- raw requests ---- */

static void request(gpuipc_t *c, ProtoMsg *req, int fd, Frame *f, const char *what)
{
        int r = client_request(c, req, fd, 30000, f);

        if (r < 0)
                die("%s: %s [%s]", what, gpuipc_strerror(r), gpuipc_errmsg(c));
}

uint64_t stats_value(gpuipc_t *c, const char *key)
{
        ProtoMsg req = {.op = PROTO_OP_STATS, .has = PROTO_BIT(PF_OP)}, rec;
        Frame f = {.fd = -1};
        ProtoIter it;

        request(c, &req, -1, &f, "stats");
        proto_iter_init(&it, &f.msg.items);
        while (proto_iter_next(&it, &rec) == 1) {
                if (rec.name.len == strlen(key) && memcmp(rec.name.ptr, key, rec.name.len) == 0) {
                        frame_free(&f);
                        return rec.value;
                }
        }
        frame_free(&f);
        die("the stats reply has no '%s'", key);
}

void stats_wait_at_least(gpuipc_t *c, const char *key, uint64_t want, int timeout_ms)
{
        uint64_t deadline = monotonic_ns() + (uint64_t)timeout_ms * 1000000u;

        while (stats_value(c, key) < want) {
                if (monotonic_ns() > deadline)
                        die("timed out waiting for %s >= %llu", key, (unsigned long long)want);
                sleep_ns(1000000);
        }
}

uint64_t raw_attach_name(gpuipc_t *c, const char *name, bool *ret_cached)
{
        ProtoMsg req = {.op = PROTO_OP_ATTACH, .name = proto_str(name)};
        Frame f = {.fd = -1};
        uint64_t id;

        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME);
        request(c, &req, -1, &f, name);
        id = f.msg.buffer;
        if (ret_cached)
                *ret_cached = f.msg.cached;
        frame_free(&f);
        return id;
}

static void buffer_request(gpuipc_t *c, ProtoOp op, uint64_t buffer, Frame *f)
{
        ProtoMsg req = {.op = op, .buffer = buffer, .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER)};

        request(c, &req, -1, f, proto_op_name(op));
}

void raw_release(gpuipc_t *c, uint64_t buffer)
{
        Frame f = {.fd = -1};

        buffer_request(c, PROTO_OP_RELEASE, buffer, &f);
        frame_free(&f);
}

void raw_unmap(gpuipc_t *c, uint64_t buffer)
{
        Frame f = {.fd = -1};

        buffer_request(c, PROTO_OP_UNMAP, buffer, &f);
        frame_free(&f);
}

uint64_t raw_stat_refs(gpuipc_t *c, uint64_t buffer)
{
        Frame f = {.fd = -1};
        uint64_t refs;

        buffer_request(c, PROTO_OP_STAT, buffer, &f);
        refs = f.msg.refs;
        frame_free(&f);
        return refs;
}

uint64_t raw_publish_memfd(gpuipc_t *c, const char *name, int fd, uint64_t size)
{
        ProtoMsg req = {
                .op = PROTO_OP_PUBLISH, .name = proto_str(name), .kind = PROTO_KIND_MEMFD, .size = size};
        Frame f = {.fd = -1};
        uint64_t id;

        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE);
        request(c, &req, fd, &f, name);
        id = f.msg.buffer;
        frame_free(&f);
        return id;
}

uint64_t raw_publish_handle(gpuipc_t *c, const char *name, uint64_t size)
{
        ProtoMsg req = {.op = PROTO_OP_PUBLISH,
                        .name = proto_str(name),
                        .kind = PROTO_KIND_CUDA_LEGACY,
                        .size = size};
        static const uint8_t handle[PROTO_LEGACY_HANDLE_SIZE] = {'b', 'e', 'n', 'c', 'h'};
        Frame f = {.fd = -1};
        uint64_t id;

        req.device = proto_str("GPU-00000000-0000-0000-0000-00000000bench");
        req.handle = (ProtoStr){(const char *)handle, sizeof(handle)};
        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE) |
                  PROTO_BIT(PF_DEVICE) | PROTO_BIT(PF_HANDLE);
        request(c, &req, -1, &f, name);
        id = f.msg.buffer;
        frame_free(&f);
        return id;
}

int sealed_memfd(uint64_t size)
{
        int fd = memfd_create("gpuipc-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        if (fd < 0)
                die("memfd_create: %s", strerror(errno));
        if (ftruncate(fd, (off_t)size) < 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE) < 0)
                die("cannot size and seal a memfd: %s", strerror(errno));
        return fd;
}

size_t frame_len(const ProtoMsg *m, int n_fds)
{
        ProtoBuf buf = {0};
        size_t len;

        if (proto_frame_encode(&buf, m, (uint8_t)n_fds) != 0)
                die("cannot encode a frame");
        len = buf.len;
        proto_buf_free(&buf);
        return len;
}
