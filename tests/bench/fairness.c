/* Section 9, fairness: 8 normal clients pinging in a loop (each waits for its reply), first alone,
 * then next to a flood: one connection pipelining pings without ever waiting, 16 connections
 * listing 2000 buffers in a loop, and (as root) 16 connections of another uid pipelining pings.
 * The normal clients' p50 and p99 with each flood are set against their own without one, measured
 * in the same run on the same broker; the target is the issue's: at most 2x.
 *
 * Each pass runs with no CPU limit and again with the broker in a cgroup of its own under a CPU
 * quota (--fair-quota, default 250m, as the shipped pod has; cgroup v2 cpu.max or v1
 * cpu.cfs_quota_us, made and removed here; skipped, saying why, where neither can be made). With
 * --old-broker PATH every pass runs on that broker too (an older build: the "before" numbers). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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
        const Broker *broker;
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

/* Makes a cgroup under this process's with a quota of milli thousandths of a CPU per 100 ms period.
 * False, with why, when it cannot. */
static bool quota_make(Quota *q, unsigned milli, char *why, size_t cap)
{
        char own[256], file[600], text[64];
        bool v2 = access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0;
        int r;

        *q = (Quota){0};
        if (v2 ? !own_cgroup(NULL, own, sizeof(own)) : !own_cgroup("cpu", own, sizeof(own))) {
                snprintf(why, cap, "no cgroup %s found in /proc/self/cgroup", v2 ? "v2 path" : "v1 cpu controller");
                return false;
        }
        snprintf(q->dir, sizeof(q->dir), "/sys/fs/cgroup%s%s/gpuipc-bench-%d", v2 ? "" : "/cpu", own, (int)getpid());
        if (mkdir(q->dir, 0755) < 0) {
                snprintf(why, cap, "cannot make %s: %s", q->dir, strerror(errno));
                q->dir[0] = 0;
                return false;
        }
        if (v2) {
                /* The controller must be on in the parent for the child to have cpu.max. */
                snprintf(file, sizeof(file), "/sys/fs/cgroup%s/cgroup.subtree_control", own);
                (void)write_file(file, "+cpu");
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

static int normal_client(void *arg)
{
        Pass *p = arg;
        gpuipc_t *c = bench_connect(p->broker, "bench-fair-normal");
        uint64_t end, n = 0;

        wait_start(p->sh);
        end = monotonic_ns() + (uint64_t)(p->seconds * 1e9);
        while (monotonic_ns() < end) {
                uint64_t t0 = monotonic_ns();

                TRY(c, gpuipc_ping(c, 30000));
                if (n < SAMPLES_MAX)
                        p->sh->lat_us[p->idx][n++] = (double)(monotonic_ns() - t0) / 1e3;
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

                fds[i] = (struct pollfd){.fd = raw_connect(p->broker), .events = POLLIN | POLLOUT};
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
        uint64_t throttled;
} Result;

static Result run_pass(const Broker *b, Flood flood, double seconds, const Quota *q)
{
        static Shared *sh;
        Pass pass[NORMAL_CLIENTS + 1];
        pid_t pids[NORMAL_CLIENTS + 1], flood_pid = 0;
        Samples all = {0};
        Result r = {0};
        uint64_t throttled, total = 0;

        if (!sh)
                sh = shared_alloc(sizeof(*sh));
        memset(sh->n, 0, sizeof(sh->n));
        sh->stop = sh->ready = 0;
        if (flood != FLOOD_NONE) {
                pass[NORMAL_CLIENTS] = (Pass){.sh = sh, .broker = b, .flood = flood, .seconds = seconds};
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
        for (int i = 0; i < NORMAL_CLIENTS; i++) {
                pass[i] = (Pass){.sh = sh, .broker = b, .idx = i, .flood = flood, .seconds = seconds};
                pids[i] = spawn(normal_client, &pass[i], NULL, 0);
        }
        for (int i = 0; i < NORMAL_CLIENTS; i++) {
                if (child_wait(pids[i]) != 0)
                        die("a normal client failed (%s)", flood_names[flood]);
        }
        r.throttled = quota_throttled(q) - throttled;
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

/* ", throttled N periods" under a quota, "" without one. */
static const char *throttling(const Quota *q, uint64_t periods, char *buf, size_t cap)
{
        snprintf(buf, cap, q ? ", throttled %llu periods" : "", (unsigned long long)periods);
        return buf;
}

/* Every flood on one broker (bench_opts.broker or old), under quota q (none when q is NULL). */
static void run_broker(const char *path, const char *who, const Quota *q, unsigned milli)
{
        const char *saved = bench_opts.broker;
        double seconds = bench_opts.quick ? 2 : 8;
        char label[96], base[96], metric[128], throttled[64];
        gpuipc_t *c;
        Broker b;
        Result none;

        bench_opts.broker = path;
        if (q)
                broker_cgroup_procs = q->procs;
        /* Any uid may connect: the last flood is another uid's. */
        broker_start(&b, open_socket, 0);
        broker_cgroup_procs = NULL;
        if (chmod(b.dir, 0711) < 0)
                die("chmod %s: %s", b.dir, strerror(errno));
        bench_opts.broker = saved;
        c = bench_connect(&b, "bench-fair-buffers");
        for (int i = 0; i < LIST_BUFFERS; i++) {
                char name[64];

                snprintf(name, sizeof(name), "bench/fair/%d", i);
                raw_publish_handle(c, name, 4096);
        }
        if (q)
                snprintf(label, sizeof(label), "%s, %um quota", who, milli);
        else
                snprintf(label, sizeof(label), "%s, no quota", who);
        note("fairness: %s: %s", label, flood_names[FLOOD_NONE]);
        none = run_pass(&b, FLOOD_NONE, seconds, q);
        snprintf(metric, sizeof(metric), "%s: p99, no flood", label);
        row_note(row_add(metric, none.p99_us / 1e3, "ms", NULL, NAN), "p50 %.2f ms, %.0f pings/s%s", none.p50_us / 1e3,
                 none.ops_s, throttling(q, none.throttled, throttled, sizeof(throttled)));
        snprintf(base, sizeof(base), "p99, no flood (%s)", who);
        for (Flood f = FLOOD_PING; f < _FLOOD_MAX; f++) {
                Result r;
                Row *row;

                if (f == FLOOD_UID_PINGS && geteuid() != 0) {
                        note("fairness: %s: skipped (switching uid needs root)", flood_names[f]);
                        continue;
                }
                note("fairness: %s: %s", label, flood_names[f]);
                r = run_pass(&b, f, seconds, q);
                snprintf(metric, sizeof(metric), "%s: p99, %s", label, flood_names[f]);
                row = row_add(metric, r.p99_us / 1e3, "ms", base, none.p99_us / 1e3);
                row_target_ratio_max(row, 2);
                row_note(row, "p50 %.2f ms (%.2fx), %.0f pings/s (%.2fx)%s", r.p50_us / 1e3, r.p50_us / none.p50_us,
                         r.ops_s, r.ops_s / none.ops_s, throttling(q, r.throttled, throttled, sizeof(throttled)));
        }
        gpuipc_close(c);
        broker_stop(&b);
}

void section_fairness(void)
{
        unsigned milli = bench_opts.fair_quota_milli;
        const char *brokers[2] = {bench_opts.broker, bench_opts.old_broker};
        const char *names[2] = {"this broker", "old broker"};
        char why[640] = "";
        Quota q;
        bool have_quota = milli && quota_make(&q, milli, why, sizeof(why));

        if (milli && !have_quota)
                note("fairness: no run under a CPU quota: %s (run as root on a machine with cgroup v2 or a v1 cpu "
                     "controller)", why);
        for (int i = 0; i < 2; i++) {
                if (!brokers[i])
                        continue;
                run_broker(brokers[i], names[i], NULL, 0);
                if (have_quota)
                        run_broker(brokers[i], names[i], &q, milli);
        }
        if (have_quota)
                quota_remove(&q);
}
