/* Section 9, fairness: 8 normal clients pinging in a loop (each waits for its reply; with --fair-rate,
 * at a fixed rate, an open loop whose latency counts from when each ping was due), first alone,
 * then next to a flood: one connection pipelining pings without ever waiting, 16 connections
 * listing 2000 buffers in a loop, and (as root) 16 connections of another uid pipelining pings.
 * The normal clients' p50 and p99 with each flood are set against their own without one, measured
 * in the same run on the same broker; the target is the issue's: at most 2x.
 *
 * Each pass runs with no CPU limit and again with the broker in a cgroup of its own under a CPU
 * quota (--fair-quota, default 250m, as the shipped pod has; cgroup v2 cpu.max or v1
 * cpu.cfs_quota_us, made and removed here; skipped, saying why, where neither can be made). With
 * --old-broker PATH every pass runs on that broker too (an older build: the "before" numbers).
 *
 * On a shared machine the load of other work moves every number, so the brokers run side by side
 * and take turns pass by pass, each flood right after a pass without one on the same broker, and
 * every flood is run --fair-repeat times: a row is the median of its passes ("pairs": the median of
 * each flood's p99 over the pass right before it). The note gives the CPU the broker and the
 * flood's own process used over the pass (1.00: a whole core), which tells a broker that had the
 * machine from one that waited for it. Each flood is also sent to a broker of its own (the decoy,
 * in a cgroup with the same quota in the quota passes) while the normal clients ping the broker
 * under test: their p99 then is the machine's floor for that row, what they see when their broker
 * does none of the flood's work. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "macro.h"

#define NORMAL_CLIENTS 8
#define SAMPLES_MAX 400000 /* per client: far above what a client does in a pass */
#define LIST_BUFFERS 2000
#define FLOOD_CONNS 16
#define FLOOD_UID 65534

typedef enum Flood { FLOOD_NONE, FLOOD_PING, FLOOD_LIST, FLOOD_UID_PINGS, _FLOOD_MAX } Flood;

static const char *const flood_names[] = {
        [FLOOD_NONE] = "no flood",
        [FLOOD_PING] = "1 conn flooding pings",
        [FLOOD_LIST] = "16 conns listing 2000 buffers",
        [FLOOD_UID_PINGS] = "16 conns of another uid flooding pings",
};

typedef struct Shared {
        int stop;
        int ready;
        uint64_t n[NORMAL_CLIENTS];
        double lat_us[NORMAL_CLIENTS][SAMPLES_MAX];
} Shared;

typedef struct Pass {
        Shared *sh;
        const Broker *broker; /* the normal clients' broker, or for the flood, the flood's */
        int idx;
        Flood flood;
        double seconds;
} Pass;

/* ---- a cgroup with a CPU quota ---- */

typedef struct Quota {
        char dir[512];   /* the cgroup made for the broker; "" when none */
        char procs[560]; /* its cgroup.procs */
        char stat[560];  /* its cpu.stat */
} Quota;

static int write_file(const char *path, const char *text)
{
        int fd = open(path, O_WRONLY | O_CLOEXEC), r = 0;

        if (fd < 0)
                return -errno;
        if (write(fd, text, strlen(text)) < 0)
                r = -errno;
        close(fd);
        return r;
}

/* This process's cgroup path in the v2 hierarchy ("0::PATH") or, with controller, in that v1 one. */
static bool own_cgroup(const char *controller, char *ret, size_t cap)
{
        char line[1024];
        bool found = false;
        FILE *f = fopen("/proc/self/cgroup", "re");

        while (f && !found && fgets(line, sizeof(line), f)) {
                char *list = strchr(line, ':'), *path = list ? strchr(list + 1, ':') : NULL;

                if (!path)
                        continue;
                *list = 0; /* line: the hierarchy's id alone ("0" for v2) */
                *path++ = 0;
                path[strcspn(path, "\n")] = 0;
                if (controller) {
                        for (char *c = strtok(list + 1, ","); c && !found; c = strtok(NULL, ","))
                                found = strcmp(c, controller) == 0;
                } else {
                        found = strcmp(line, "0") == 0 && list[1] == 0;
                }
                if (found)
                        snprintf(ret, cap, "%s", strcmp(path, "/") ? path : "");
        }
        if (f)
                fclose(f);
        return found;
}

/* Where the quota cgroups are made: this process's cgroup when the first was made. In cgroup v2 a
 * cgroup that holds processes cannot turn a controller on for its children (EBUSY: "no internal
 * processes"), so then this process moves into a leaf of its own beside them, and back once they
 * are gone (quota_done). */
static char quota_parent[256];
static char quota_leaf[600]; /* the leaf this process moved into; "" when it did not */

/* Moves this process into the cgroup at dir (a path under /sys/fs/cgroup). 0 or -errno. */
static int cgroup_move_self(const char *dir)
{
        char procs[640], pid[32];

        snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        return write_file(procs, pid);
}

static int quota_leaf_enter(void)
{
        int r;

        snprintf(quota_leaf, sizeof(quota_leaf), "/sys/fs/cgroup%s/gpuipc-bench-%d-self", quota_parent,
                 (int)getpid());
        if (mkdir(quota_leaf, 0755) < 0) {
                r = -errno;
                quota_leaf[0] = 0;
                return r;
        }
        r = cgroup_move_self(quota_leaf);
        if (r < 0) {
                rmdir(quota_leaf);
                quota_leaf[0] = 0;
        }
        return r;
}

/* After the last quota_remove: this process back where it was, its leaf gone. */
static void quota_done(void)
{
        char parent[512], file[560];
        int r;

        if (!quota_leaf[0])
                return;
        snprintf(parent, sizeof(parent), "/sys/fs/cgroup%s", quota_parent);
        snprintf(file, sizeof(file), "%s/cgroup.subtree_control", parent);
        (void)write_file(file, "-cpu");
        r = cgroup_move_self(parent);
        if (r == 0 && rmdir(quota_leaf) < 0)
                r = -errno;
        if (r < 0)
                note("cannot move back out of %s: %s", quota_leaf, strerror(-r));
        quota_leaf[0] = 0;
}

/* Makes a cgroup under this process's with a quota of milli thousandths of a CPU per 100 ms period.
 * False, with why, when it cannot. */
static bool quota_make(Quota *q, unsigned milli, int idx, char *why, size_t cap)
{
        char file[600], text[64];
        const char *own = quota_parent;
        bool v2 = access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0;
        int r;

        *q = (Quota){0};
        if (!quota_leaf[0] && (v2 ? !own_cgroup(NULL, quota_parent, sizeof(quota_parent))
                                  : !own_cgroup("cpu", quota_parent, sizeof(quota_parent)))) {
                snprintf(why, cap, "no cgroup %s found in /proc/self/cgroup", v2 ? "v2 path" : "v1 cpu controller");
                return false;
        }
        snprintf(q->dir, sizeof(q->dir), "/sys/fs/cgroup%s%s/gpuipc-bench-%d-%d", v2 ? "" : "/cpu", own,
                 (int)getpid(), idx);
        if (mkdir(q->dir, 0755) < 0) {
                snprintf(why, cap, "cannot make %s: %s", q->dir, strerror(errno));
                q->dir[0] = 0;
                return false;
        }
        if (v2) {
                /* The controller must be on in the parent for the child to have cpu.max. */
                snprintf(file, sizeof(file), "/sys/fs/cgroup%s/cgroup.subtree_control", own);
                r = write_file(file, "+cpu");
                if (r == -EBUSY && !quota_leaf[0]) {
                        r = quota_leaf_enter();
                        if (r == 0)
                                r = write_file(file, "+cpu");
                }
                if (r < 0) {
                        snprintf(why, cap, "cannot turn the cpu controller on in %s: %s", file, strerror(-r));
                        rmdir(q->dir);
                        q->dir[0] = 0;
                        return false;
                }
                snprintf(file, sizeof(file), "%s/cpu.max", q->dir);
                snprintf(text, sizeof(text), "%u 100000", milli * 100);
                r = write_file(file, text);
        } else {
                snprintf(file, sizeof(file), "%s/cpu.cfs_period_us", q->dir);
                r = write_file(file, "100000");
                snprintf(file, sizeof(file), "%s/cpu.cfs_quota_us", q->dir);
                snprintf(text, sizeof(text), "%u", milli * 100);
                if (r == 0)
                        r = write_file(file, text);
        }
        if (r < 0) {
                snprintf(why, cap, "cannot set the quota in %s: %s", q->dir, strerror(-r));
                rmdir(q->dir);
                q->dir[0] = 0;
                return false;
        }
        snprintf(q->procs, sizeof(q->procs), "%s/cgroup.procs", q->dir);
        snprintf(q->stat, sizeof(q->stat), "%s/cpu.stat", q->dir);
        return true;
}

static void quota_remove(Quota *q)
{
        if (q->dir[0] && rmdir(q->dir) < 0)
                note("cannot remove %s: %s", q->dir, strerror(errno));
        q->dir[0] = 0;
}

/* Periods the quota throttled the cgroup in so far (nr_throttled of cpu.stat). */
static uint64_t quota_throttled(const Quota *q)
{
        char line[256];
        uint64_t v = 0;
        FILE *f = q && q->dir[0] ? fopen(q->stat, "re") : NULL;

        while (f && fgets(line, sizeof(line), f)) {
                if (strncmp(line, "nr_throttled ", 13) == 0)
                        v = strtoull(line + 13, NULL, 10);
        }
        if (f)
                fclose(f);
        return v;
}

/* ---- the clients ---- */

static void wait_start(Shared *sh)
{
        __atomic_add_fetch(&sh->ready, 1, __ATOMIC_SEQ_CST);
}

static bool stopped(const Shared *sh)
{
        return __atomic_load_n(&sh->stop, __ATOMIC_RELAXED);
}

/* A normal client pings for the pass's length: in a closed loop (each ping as soon as the last one's
 * reply came), or with --fair-rate at a fixed rate, each ping's latency counted from when it was due,
 * so that a client held up by the broker counts the pings it could not send in time as late, not as
 * missing. */
static int normal_client(void *arg)
{
        Pass *p = arg;
        gpuipc_t *c = bench_connect(p->broker, "bench-fair-normal");
        uint64_t start, end, due, interval = bench_opts.fair_rate ? 1000000000ull / bench_opts.fair_rate : 0, n = 0;

        wait_start(p->sh);
        start = monotonic_ns();
        end = start + (uint64_t)(p->seconds * 1e9);
        /* The clients' phases spread over one interval, so that they do not ping in step. */
        due = start + interval * (uint64_t)p->idx / NORMAL_CLIENTS;
        while (due < end) {
                uint64_t now = monotonic_ns(), t0;

                if (interval && now < due)
                        sleep_ns(due - now);
                t0 = interval ? due : monotonic_ns();
                TRY(c, gpuipc_ping(c, 30000));
                if (n < SAMPLES_MAX)
                        p->sh->lat_us[p->idx][n++] = (double)(monotonic_ns() - t0) / 1e3;
                due = interval ? due + interval : monotonic_ns();
        }
        p->sh->n[p->idx] = n;
        gpuipc_close(c);
        return 0;
}

static int raw_connect(const Broker *b)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", b->sock);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                die("cannot connect to the broker: %s", strerror(errno));
        return fd;
}

static void encode(ProtoOp op, uint64_t id, ProtoBuf *ret)
{
        ProtoMsg m = {.op = op, .id = id, .version = PROTO_VERSION, .pid = (uint64_t)getpid()};

        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID);
        if (op == PROTO_OP_HELLO)
                m.has |= PROTO_BIT(PF_VERSION) | PROTO_BIT(PF_PID);
        if (proto_frame_encode(ret, &m, 0) < 0)
                die("cannot encode a request");
}

/* The flood: n connections, each kept full of pipelined requests (pings), or with one request
 * always outstanding (listings, as a loop of list calls would). Replies are read and dropped. */
static int flood_child(void *arg)
{
        Pass *p = arg;
        bool pipeline = p->flood != FLOOD_LIST;
        int n = p->flood == FLOOD_PING ? 1 : FLOOD_CONNS;
        struct pollfd fds[FLOOD_CONNS];
        uint8_t *buf = malloc(PROTO_MAX_FRAME);
        ProtoBuf hello = {0}, req = {0};

        if (p->flood == FLOOD_UID_PINGS && (setgid(FLOOD_UID) < 0 || setuid(FLOOD_UID) < 0))
                die("cannot become uid %d: %s", FLOOD_UID, strerror(errno));
        encode(PROTO_OP_HELLO, 1, &hello);
        encode(p->flood == FLOOD_LIST ? PROTO_OP_LIST : PROTO_OP_PING, 2, &req);
        for (int i = 0; i < n; i++) {
                int fd = -1;

                /* Only a pipelining flood waits for room to write: one that waits for its replies sleeps
                 * (as a loop of list calls would) rather than spinning on a writable socket. */
                fds[i] = (struct pollfd){.fd = raw_connect(p->broker), .events = POLLIN | (pipeline ? POLLOUT : 0)};
                if (rec_send(fds[i].fd, hello.data, hello.len, -1) < 0 ||
                    rec_recv(fds[i].fd, buf, PROTO_MAX_FRAME, &fd) <= 0)
                        die("the broker did not answer the flood's hello");
                if (fd >= 0)
                        close(fd);
                fcntl(fds[i].fd, F_SETFL, O_NONBLOCK);
                if (!pipeline && send(fds[i].fd, req.data, req.len, MSG_NOSIGNAL) < 0)
                        die("send: %s", strerror(errno));
        }
        wait_start(p->sh);
        while (!stopped(p->sh)) {
                if (poll(fds, (nfds_t)n, 10) < 0 && errno != EINTR)
                        die("poll: %s", strerror(errno));
                for (int i = 0; i < n; i++) {
                        while (recv(fds[i].fd, buf, PROTO_MAX_FRAME, MSG_DONTWAIT) > 0) {
                                if (!pipeline && send(fds[i].fd, req.data, req.len, MSG_NOSIGNAL) < 0)
                                        die("send: %s", strerror(errno));
                        }
                        while (pipeline && send(fds[i].fd, req.data, req.len, MSG_DONTWAIT | MSG_NOSIGNAL) > 0)
                                ;
                }
        }
        return 0;
}

/* ---- a pass ---- */

typedef struct Result {
        double p50_us, p99_us, ops_s;
        double broker_cpu, flood_cpu; /* CPUs used over the pass (1 = one core all the time) */
        double throttled_periods;
} Result;

/* A pass of the normal clients on broker b, with flood sent to flood_b (b, or another broker: what
 * the flood costs the machine without b doing any of its work). */
static Result run_pass(const Broker *b, Flood flood, double seconds, const Quota *q, const Broker *flood_b)
{
        static Shared *sh;
        Pass pass[NORMAL_CLIENTS + 1];
        pid_t pids[NORMAL_CLIENTS + 1], flood_pid = 0;
        Samples all = {0};
        Result r = {0};
        uint64_t throttled, total = 0, broker_cpu, flood_cpu = 0, t0;

        if (!sh)
                sh = shared_alloc(sizeof(*sh));
        memset(sh->n, 0, sizeof(sh->n));
        sh->stop = sh->ready = 0;
        if (flood != FLOOD_NONE) {
                pass[NORMAL_CLIENTS] = (Pass){.sh = sh, .broker = flood_b, .flood = flood, .seconds = seconds};
                flood_pid = spawn(flood_child, &pass[NORMAL_CLIENTS], NULL, 0);
                /* The flood first: the normal clients start next to a broker that is already busy. */
                while (__atomic_load_n(&sh->ready, __ATOMIC_SEQ_CST) < 1) {
                        if (waitpid(flood_pid, NULL, WNOHANG) == flood_pid)
                                die("the flood ended before it started (%s)", flood_names[flood]);
                        sleep_ns(1000000);
                }
                sleep_ns(200000000);
        }
        throttled = quota_throttled(q);
        broker_cpu = proc_cpu_ns(b->pid);
        if (flood_pid)
                flood_cpu = proc_cpu_ns(flood_pid);
        t0 = monotonic_ns();
        for (int i = 0; i < NORMAL_CLIENTS; i++) {
                pass[i] = (Pass){.sh = sh, .broker = b, .idx = i, .flood = flood, .seconds = seconds};
                pids[i] = spawn(normal_client, &pass[i], NULL, 0);
        }
        for (int i = 0; i < NORMAL_CLIENTS; i++) {
                if (child_wait(pids[i]) != 0)
                        die("a normal client failed (%s)", flood_names[flood]);
        }
        r.throttled_periods = (double)(quota_throttled(q) - throttled);
        r.broker_cpu = (double)(proc_cpu_ns(b->pid) - broker_cpu) / (double)(monotonic_ns() - t0);
        if (flood_pid)
                r.flood_cpu = (double)(proc_cpu_ns(flood_pid) - flood_cpu) / (double)(monotonic_ns() - t0);
        __atomic_store_n(&sh->stop, 1, __ATOMIC_SEQ_CST);
        if (flood_pid && child_wait(flood_pid) != 0)
                die("the flood failed (%s)", flood_names[flood]);
        for (int i = 0; i < NORMAL_CLIENTS; i++) {
                for (uint64_t k = 0; k < sh->n[i]; k++)
                        samples_add(&all, sh->lat_us[i][k]);
                total += sh->n[i];
        }
        r.p50_us = samples_pct(&all, 50);
        r.p99_us = samples_pct(&all, 99);
        r.ops_s = (double)total / seconds;
        samples_free(&all);
        return r;
}

static const char *const open_socket[] = {"--socket-mode", "0666", NULL};

/* One broker under test, with its own cgroup under a quota when quota is set. */
typedef struct Subject {
        const char *path, *who;
        bool quota;
        Quota q;
        Broker b;
        gpuipc_t *producer; /* the listed buffers' producer: they live as long as its connection */
        Result none[FAIR_REPEAT_MAX][_FLOOD_MAX]; /* the pass without a flood right before flood f */
        Result res[FAIR_REPEAT_MAX][_FLOOD_MAX];
        Result elsewhere[FAIR_REPEAT_MAX][_FLOOD_MAX]; /* the same flood sent to another broker */
} Subject;

static void subject_start(Subject *x)
{
        const char *saved = bench_opts.broker;

        bench_opts.broker = x->path;
        if (x->quota)
                broker_cgroup_procs = x->q.procs;
        /* Any uid may connect: the last flood is another uid's. */
        broker_start(&x->b, open_socket, 0);
        broker_cgroup_procs = NULL;
        bench_opts.broker = saved;
        if (chmod(x->b.dir, 0711) < 0)
                die("chmod %s: %s", x->b.dir, strerror(errno));
        x->producer = bench_connect(&x->b, "bench-fair-buffers");
        for (int i = 0; i < LIST_BUFFERS; i++) {
                char name[64];

                snprintf(name, sizeof(name), "bench/fair/%d", i);
                raw_publish_handle(x->producer, name, 4096);
        }
}

static void subject_stop(Subject *x)
{
        gpuipc_close(x->producer);
        broker_stop(&x->b);
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;

        return (x > y) - (x < y);
}

/* The median of n values (sorted in place). */
static double median(double *v, int n)
{
        qsort(v, (size_t)n, sizeof(*v), cmp_double);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static bool flood_runs(Flood f)
{
        return f != FLOOD_UID_PINGS || geteuid() == 0;
}

/* The median of a field of results: of flood f's passes (res), or with f FLOOD_NONE of every
 * pass without a flood (none). */
static double median_of(const Subject *x, int reps, Flood f, size_t field)
{
        double v[FAIR_REPEAT_MAX * _FLOOD_MAX];
        int n = 0;

        for (int k = 0; k < reps; k++) {
                for (Flood g = FLOOD_PING; g < _FLOOD_MAX; g++) {
                        if (f == FLOOD_NONE && flood_runs(g))
                                v[n++] = *(const double *)((const char *)&x->none[k][g] + field);
                        else if (g == f)
                                v[n++] = *(const double *)((const char *)&x->res[k][g] + field);
                }
        }
        return median(v, n);
}

#define MEDIAN(x, reps, f, field) median_of((x), (reps), (f), offsetof(Result, field))

/* The median over the repeats of p99 with flood f sent to another broker. */
static double median_elsewhere_p99(const Subject *x, int reps, Flood f)
{
        double v[FAIR_REPEAT_MAX];

        for (int k = 0; k < reps; k++)
                v[k] = x->elsewhere[k][f].p99_us;
        return median(v, reps);
}

/* The median over the repeats of p99 with flood f over p99 of the pass right before it. */
static double median_pair_ratio(const Subject *x, int reps, Flood f)
{
        double v[FAIR_REPEAT_MAX];

        for (int k = 0; k < reps; k++)
                v[k] = x->res[k][f].p99_us / x->none[k][f].p99_us;
        return median(v, reps);
}

static void report(const Subject *x, int reps, unsigned milli)
{
        char label[96], base[96], metric[128], throttled[64], load[48] = "";
        double none_p99 = MEDIAN(x, reps, FLOOD_NONE, p99_us), none_ops = MEDIAN(x, reps, FLOOD_NONE, ops_s);
        Row *row;

        if (bench_opts.fair_rate)
                snprintf(load, sizeof(load), ", %lu pings/s each", bench_opts.fair_rate);
        if (x->quota)
                snprintf(label, sizeof(label), "%s, %um quota%s", x->who, milli, load);
        else
                snprintf(label, sizeof(label), "%s, no quota%s", x->who, load);
        snprintf(metric, sizeof(metric), "%s: p99, no flood", label);
        snprintf(throttled, sizeof(throttled), x->quota ? ", throttled %.0f periods" : "",
                 MEDIAN(x, reps, FLOOD_NONE, throttled_periods));
        row = row_add(metric, none_p99 / 1e3, "ms", NULL, NAN);
        row_note(row, "p50 %.2f ms, %.0f pings/s, broker %.2f CPU%s", MEDIAN(x, reps, FLOOD_NONE, p50_us) / 1e3,
                 none_ops, MEDIAN(x, reps, FLOOD_NONE, broker_cpu), throttled);
        snprintf(base, sizeof(base), "p99, no flood (%s)", x->who);
        for (Flood f = FLOOD_PING; f < _FLOOD_MAX; f++) {
                double floor_p99;

                if (!flood_runs(f))
                        continue;
                floor_p99 = median_elsewhere_p99(x, reps, f);
                snprintf(metric, sizeof(metric), "%s: p99, %s at another broker", label, flood_names[f]);
                row = row_add(metric, floor_p99 / 1e3, "ms", base, none_p99 / 1e3);
                row_note(row, "the machine's floor for the row below: the same flood, served by a broker of its own%s",
                         x->quota ? " in a cgroup with the same quota" : "");
                snprintf(metric, sizeof(metric), "%s: p99, %s", label, flood_names[f]);
                snprintf(throttled, sizeof(throttled), x->quota ? ", throttled %.0f periods" : "",
                         MEDIAN(x, reps, f, throttled_periods));
                row = row_add(metric, MEDIAN(x, reps, f, p99_us) / 1e3, "ms", base, none_p99 / 1e3);
                row_target_ratio_max(row, 2);
                row_note(row, "%.2fx the flood at another broker; pairs %.2fx; p50 %.2f ms; %.0f pings/s (%.2fx); CPU: "
                         "broker %.2f, flood %.2f%s",
                         MEDIAN(x, reps, f, p99_us) / floor_p99, median_pair_ratio(x, reps, f),
                         MEDIAN(x, reps, f, p50_us) / 1e3, MEDIAN(x, reps, f, ops_s),
                         MEDIAN(x, reps, f, ops_s) / none_ops, MEDIAN(x, reps, f, broker_cpu),
                         MEDIAN(x, reps, f, flood_cpu), throttled);
        }
}

/* Every flood on each broker: the brokers run side by side (an idle one costs nothing) and the
 * passes alternate between them, each flood right after a pass without one on the same broker, so
 * that the load other work puts on a shared machine hits every broker and every flood alike. After
 * each, the same flood sent to the decoy (a broker of this tree, started like the others): the
 * normal clients' p99 when their broker does none of the flood's work but the machine still runs it,
 * which is as well as any sharing inside the broker can do (on 2 cores, the flood's process and its
 * broker take CPUs the clients wait for). */
static void run_brokers(Subject *xs, int n, int reps, Subject *decoy)
{
        double seconds = bench_opts.quick ? 2 : 8;

        subject_start(decoy);
        for (int i = 0; i < n; i++)
                subject_start(&xs[i]);
        for (int k = 0; k < reps; k++) {
                for (Flood f = FLOOD_PING; f < _FLOOD_MAX; f++) {
                        if (!flood_runs(f))
                                continue;
                        for (int j = 0; j < n; j++) {
                                Subject *x = &xs[(j + k) % n]; /* which broker goes first alternates */
                                const Quota *q = x->quota ? &x->q : NULL;

                                note("fairness: %s%s, repeat %d/%d: %s", x->who, x->quota ? " (quota)" : "", k + 1,
                                     reps, flood_names[f]);
                                x->none[k][f] = run_pass(&x->b, FLOOD_NONE, seconds, q, &x->b);
                                x->res[k][f] = run_pass(&x->b, f, seconds, q, &x->b);
                                x->elsewhere[k][f] = run_pass(&x->b, f, seconds, q, &decoy->b);
                        }
                }
        }
        for (int i = 0; i < n; i++)
                subject_stop(&xs[i]);
        subject_stop(decoy);
}

void section_fairness(void)
{
        unsigned milli = bench_opts.fair_quota_milli;
        int reps = bench_opts.fair_repeat, n = 0;
        const char *paths[2] = {bench_opts.broker, bench_opts.old_broker};
        const char *names[2] = {"this broker", "old broker"};
        static Subject xs[4], decoys[2];
        char why[640] = "";
        bool have_quota = milli != 0;

        if (geteuid() != 0)
                note("fairness: %s: skipped (switching uid needs root)", flood_names[FLOOD_UID_PINGS]);
        for (int i = 0; i < 2; i++) {
                if (paths[i])
                        xs[n++] = (Subject){.path = paths[i], .who = names[i]};
        }
        decoys[0] = (Subject){.path = bench_opts.broker, .who = "decoy"};
        run_brokers(xs, n, reps, &decoys[0]);
        /* Under the quota, each broker in a cgroup of its own, the decoy too. */
        decoys[1] = (Subject){.path = bench_opts.broker, .who = "decoy", .quota = true};
        for (int i = 0; i <= n && have_quota; i++) {
                Subject *x = i < n ? &xs[n + i] : &decoys[1];

                if (i < n)
                        *x = (Subject){.path = xs[i].path, .who = xs[i].who, .quota = true};
                if (!quota_make(&x->q, milli, i, why, sizeof(why))) {
                        for (int j = 0; j < i; j++)
                                quota_remove(&xs[n + j].q);
                        quota_done();
                        have_quota = false;
                }
        }
        if (milli && !have_quota)
                note("fairness: no run under a CPU quota: %s (run as root on a machine with cgroup v2 or a v1 cpu "
                     "controller)", why);
        if (have_quota) {
                run_brokers(xs + n, n, reps, &decoys[1]);
                for (int i = 0; i < n; i++)
                        quota_remove(&xs[n + i].q);
                quota_remove(&decoys[1].q);
                quota_done();
        }
        for (int i = 0; i < n; i++) {
                report(&xs[i], reps, milli);
                if (have_quota)
                        report(&xs[n + i], reps, milli);
        }
}
