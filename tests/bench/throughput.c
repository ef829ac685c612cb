/* Section 2, throughput: N client processes, each with its own connection, run round trips as
 * fast as they can for a fixed time: pings, or attach + release of one published buffer (the
 * attach is cached after each client's first one). The baseline is a single-threaded epoll echo
 * server, the broker's own shape without its work, answering the same request and reply sizes.
 * The broker's CPU time per op comes from utime + stime in /proc/PID/stat. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "bench.h"
#include "internal.h"
#include "macro.h"

#define TP_MAX_CLIENTS 256

typedef enum Workload { WL_PING, WL_ATTACH_RELEASE, _WL_MAX } Workload;
static const char *const workload_names[] = {"ping", "attach+release"};

typedef struct TpShared {
        int ready;
        int stop;
        uint64_t ops[TP_MAX_CLIENTS];
} TpShared;

typedef enum ClientKind { CL_LIBGPUIPC, CL_ECHO, CL_DIRECT } ClientKind;

typedef struct TpClient {
        TpShared *sh;
        int idx, go;
        Workload wl;
        ClientKind kind;
        const Broker *broker;
        const char *echo_path;
        size_t sizes[2][2]; /* [request kind][0 = request, 1 = reply]: ping or attach, release */
} TpClient;

/* ---- the epoll echo server ---- */

static int echo_epoll_serve(int lfd)
{
        uint8_t *buf = malloc(ECHO_BUF);
        struct epoll_event ev = {.events = EPOLLIN}, evs[64];
        int ep = epoll_create1(EPOLL_CLOEXEC);

        if (!buf || ep < 0)
                return 1;
        ev.data.fd = lfd;
        epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
        for (;;) {
                int n = epoll_wait(ep, evs, ARRAY_SIZE(evs), -1);

                for (int i = 0; i < n; i++) {
                        int fd = evs[i].data.fd;

                        if (fd == lfd) {
                                int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                                if (c >= 0) {
                                        struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
                                        epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
                                }
                                continue;
                        }
                        /* As the broker does: drain what is there, answer each record. */
                        for (int k = 0; k < 64; k++) {
                                EchoHdr h;
                                ssize_t len = recv(fd, buf, ECHO_BUF, MSG_DONTWAIT);

                                if (len < 0 && (errno == EAGAIN || errno == EINTR))
                                        break;
                                if (len <= 0) {
                                        close(fd);
                                        break;
                                }
                                memcpy(&h, buf, sizeof(h));
                                send(fd, buf, MIN(h.reply_len, (uint32_t)ECHO_BUF),
                                     MSG_DONTWAIT | MSG_NOSIGNAL);
                        }
                }
        }
}

static int echo_server_child(void *arg)
{
        return echo_epoll_serve(*(int *)arg);
}

static int echo_connect(const char *path)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                die("cannot connect to the echo server: %s", strerror(errno));
        return fd;
}

/* ---- clients ---- */

static void wait_go(TpClient *a)
{
        char c;

        __atomic_add_fetch(&a->sh->ready, 1, __ATOMIC_SEQ_CST);
        while (read(a->go, &c, 1) < 0 && errno == EINTR)
                ;
}

static int echo_client(TpClient *a)
{
        uint8_t *buf = malloc(ECHO_BUF);
        int fd = echo_connect(a->echo_path);
        uint64_t n = 0;
        int kinds = a->wl == WL_PING ? 1 : 2;

        echo_round(fd, buf, a->sizes[0][0], a->sizes[0][1], -1, false);
        wait_go(a);
        while (!__atomic_load_n(&a->sh->stop, __ATOMIC_RELAXED)) {
                for (int k = 0; k < kinds; k++)
                        echo_round(fd, buf, a->sizes[k][0], a->sizes[k][1], -1, false);
                n += (uint64_t)kinds;
        }
        a->sh->ops[a->idx] = n;
        return 0;
}

static int broker_client(TpClient *a)
{
        gpuipc_t *c = bench_connect(a->broker, "bench-throughput");
        gpuipc_buffer_t *b;
        uint64_t n = 0;

        TRY(c, gpuipc_attach(c, "bench/tp", 10000, &b)); /* maps it once */
        TRY(c, gpuipc_release(c, b));
        wait_go(a);
        while (!__atomic_load_n(&a->sh->stop, __ATOMIC_RELAXED)) {
                if (a->wl == WL_PING) {
                        TRY(c, gpuipc_ping(c, 30000));
                        n++;
                } else {
                        TRY(c, gpuipc_attach(c, "bench/tp", 30000, &b));
                        TRY(c, gpuipc_release(c, b));
                        n += 2;
                }
        }
        a->sh->ops[a->idx] = n;
        gpuipc_close(c);
        return 0;
}

/* The broker's capacity without libgpuipc: blocking sendmsg + recvmsg of the frames it would send. */
static int direct_client(TpClient *a)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        uint8_t *buf = malloc(ECHO_BUF);
        ProtoBuf hello = {0}, att = {0}, rel = {0};
        ProtoMsg m;
        uint64_t n = 0, id;
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), rfd;
        long len;

        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", a->broker->sock);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                die("cannot connect to the broker: %s", strerror(errno));
        m = (ProtoMsg){.op = PROTO_OP_HELLO, .id = 1, .version = PROTO_VERSION};
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID) | PROTO_BIT(PF_VERSION);
        proto_frame_encode(&hello, &m, 0);
        m = (ProtoMsg){.op = PROTO_OP_ATTACH, .id = 2, .name = proto_str("bench/tp"), .timeout_ms = 30000};
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_TIMEOUT_MS);
        proto_frame_encode(&att, &m, 0);
        if (rec_send(fd, hello.data, hello.len, -1) < 0 || rec_recv(fd, buf, ECHO_BUF, &rfd) <= 0 ||
            rec_send(fd, att.data, att.len, -1) < 0 || (len = rec_recv(fd, buf, ECHO_BUF, &rfd)) <= 0)
                die("the broker did not answer");
        if (rfd >= 0)
                close(rfd);
        {
                ProtoMsg r;
                if (proto_msg_decode(buf + PROTO_HEADER_SIZE, (size_t)len - PROTO_HEADER_SIZE, &r, NULL) !=
                    0)
                        die("cannot decode the attach reply");
                id = r.buffer;
        }
        m = (ProtoMsg){.op = PROTO_OP_RELEASE,
                       .id = 3,
                       .buffer = id,
                       .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID) | PROTO_BIT(PF_BUFFER)};
        proto_frame_encode(&rel, &m, 0);
        if (rec_send(fd, rel.data, rel.len, -1) < 0 || rec_recv(fd, buf, ECHO_BUF, &rfd) <= 0)
                die("the broker did not answer");
        wait_go(a);
        while (!__atomic_load_n(&a->sh->stop, __ATOMIC_RELAXED)) {
                if (rec_send(fd, att.data, att.len, -1) < 0 || rec_recv(fd, buf, ECHO_BUF, &rfd) <= 0 ||
                    rec_send(fd, rel.data, rel.len, -1) < 0 || rec_recv(fd, buf, ECHO_BUF, &rfd) <= 0)
                        die("the broker went away");
                n += 2;
        }
        a->sh->ops[a->idx] = n;
        return 0;
}

static int client_child(void *arg)
{
        TpClient *a = arg;

        switch (a->kind) {
        case CL_ECHO:
                return echo_client(a);
        case CL_DIRECT:
                return direct_client(a);
        default:
                return broker_client(a);
        }
}

/* ---- runs ---- */

typedef struct TpResult {
        double ops_per_s, cpu_us_per_op, sched_us_per_op, util;
} TpResult;

static TpResult tp_run(TpClient *proto, int n, pid_t server, double seconds)
{
        TpShared *sh = proto->sh;
        pid_t kids[TP_MAX_CLIENTS];
        uint64_t t0, t1, c0, c1, s0, s1, total = 0;
        uint64_t deadline;
        int go[2];
        TpResult res;

        memset(sh, 0, sizeof(*sh));
        if (pipe2(go, O_CLOEXEC) < 0)
                die("pipe: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
                TpClient a = *proto;
                a.idx = i;
                a.go = go[0];
                kids[i] = spawn(client_child, &a, &go[0], 1);
        }
        close(go[0]);
        deadline = monotonic_ns() + 60000000000ull;
        while (__atomic_load_n(&sh->ready, __ATOMIC_SEQ_CST) < n) {
                if (monotonic_ns() > deadline)
                        die("clients did not get ready");
                sleep_ns(1000000);
        }
        sleep_ns(20000000); /* let them all block on the pipe */
        c0 = proc_cpu_ns(server);
        s0 = proc_sched_ns(server);
        t0 = monotonic_ns();
        close(go[1]);
        sleep_ns((uint64_t)(seconds * 1e9));
        __atomic_store_n(&sh->stop, 1, __ATOMIC_SEQ_CST);
        t1 = monotonic_ns();
        c1 = proc_cpu_ns(server);
        s1 = proc_sched_ns(server);
        for (int i = 0; i < n; i++) {
                if (child_wait(kids[i]) != 0)
                        die("a throughput client failed");
                total += sh->ops[i];
        }
        res.ops_per_s = (double)total / ((double)(t1 - t0) / 1e9);
        res.cpu_us_per_op = total ? (double)(c1 - c0) / 1000.0 / (double)total : NAN;
        res.sched_us_per_op = total ? (double)(s1 - s0) / 1000.0 / (double)total : NAN;
        res.util = (double)(s1 - s0) / (double)(t1 - t0);
        return res;
}

/* Request and reply sizes of ping, attach by name and release, as libgpuipc and the broker encode
 * them (see latency.c for how they are measured; these are the same frames). */
static void measure_sizes(const Broker *b, size_t sizes[_WL_MAX][2][2])
{
        gpuipc_t *c = bench_connect(b, "bench-sizes");
        ProtoMsg m;
        Frame f = {.fd = -1};
        uint64_t id;

        m = (ProtoMsg){.op = PROTO_OP_PING, .has = PROTO_BIT(PF_OP)};
        TRY(c, client_request(c, &m, -1, 10000, &f));
        sizes[WL_PING][0][1] = frame_len(&f.msg, 0);
        sizes[WL_PING][0][0] = frame_len(&m, 0);
        frame_free(&f);

        m = (ProtoMsg){.op = PROTO_OP_ATTACH, .name = proto_str("bench/tp"), .timeout_ms = 30000};
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_TIMEOUT_MS);
        TRY(c, client_request(c, &m, -1, 10000, &f));
        id = f.msg.buffer;
        sizes[WL_ATTACH_RELEASE][0][1] = frame_len(&f.msg, 0);
        sizes[WL_ATTACH_RELEASE][0][0] = frame_len(&m, 0);
        frame_free(&f);
        m = (ProtoMsg){.op = PROTO_OP_RELEASE, .buffer = id, .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER)};
        TRY(c, client_request(c, &m, -1, 10000, &f));
        sizes[WL_ATTACH_RELEASE][1][1] = frame_len(&f.msg, 0);
        sizes[WL_ATTACH_RELEASE][1][0] = frame_len(&m, 0);
        frame_free(&f);
        gpuipc_close(c);
}

void section_throughput(void)
{
        static const int clients[] = {1, 8, 64, 256};
        double seconds = bench_opts.quick ? 0.5 : 2.0;
        size_t sizes[_WL_MAX][2][2] = {0};
        const char *const flags[] = {"--max-connections-per-uid", "4096", NULL};
        TpShared *sh = shared_alloc(sizeof(*sh));
        FILE *raw =
                out_open("throughput.csv", "server,workload,clients,ops_per_s,cpu_us_per_op,sched_us_per_op,"
                                           "cpu_utilization");
        gpuipc_t *prod;
        gpuipc_buffer_t *buf;
        char echo_path[128];
        Broker broker;
        pid_t echo;
        int lfd;
        struct sockaddr_un sa = {.sun_family = AF_UNIX};

        raise_nofile(4096);
        broker_start(&broker, flags, 0);
        prod = bench_connect(&broker, "bench-producer");
        TRY(prod, gpuipc_buffer_alloc(prod, GPUIPC_KIND_MEMFD, 4096, 0, &buf));
        TRY(prod, gpuipc_publish(prod, buf, "bench/tp", NULL));
        measure_sizes(&broker, sizes);

        snprintf(echo_path, sizeof(echo_path), "%s/echo.sock", broker.dir);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%.100s", echo_path);
        lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4096) < 0)
                die("cannot listen on %s: %s", echo_path, strerror(errno));
        echo = spawn(echo_server_child, &lfd, &lfd, 1);
        close(lfd);

        note("%.1f s per run; clients are processes with one connection each", seconds);
        for (int w = 0; w < _WL_MAX; w++) {
                for (size_t k = 0; k < ARRAY_SIZE(clients); k++) {
                        int n = clients[k];
                        TpClient a = {
                                .sh = sh, .wl = (Workload)w, .broker = &broker, .echo_path = echo_path};
                        TpResult rb, re, rd = {0};
                        char metric[96];
                        Row *r;

                        memcpy(a.sizes, sizes[w], sizeof(a.sizes));
                        if (k & 1) {
                                a.kind = CL_ECHO;
                                re = tp_run(&a, n, echo, seconds);
                                a.kind = CL_LIBGPUIPC;
                                rb = tp_run(&a, n, broker.pid, seconds);
                        } else {
                                rb = tp_run(&a, n, broker.pid, seconds);
                                a.kind = CL_ECHO;
                                re = tp_run(&a, n, echo, seconds);
                        }
                        if (w == WL_ATTACH_RELEASE) {
                                a.kind = CL_DIRECT;
                                rd = tp_run(&a, n, broker.pid, seconds);
                        }
                        note("%s, %3d clients: broker %.0f ops/s (%.2f us CPU/op), echo %.0f ops/s (%.2f us "
                             "CPU/op)%s",
                             workload_names[w], n, rb.ops_per_s, rb.cpu_us_per_op, re.ops_per_s,
                             re.cpu_us_per_op,
                             w == WL_ATTACH_RELEASE ? ", raw clients to the broker: see the table" : "");
                        if (raw) {
                                fprintf(raw, "broker,%s,%d,%.0f,%.3f,%.3f,%.3f\n", workload_names[w], n,
                                        rb.ops_per_s, rb.cpu_us_per_op, rb.sched_us_per_op, rb.util);
                                if (w == WL_ATTACH_RELEASE)
                                        fprintf(raw, "broker_raw_clients,%s,%d,%.0f,%.3f,%.3f,%.3f\n",
                                                workload_names[w], n, rd.ops_per_s, rd.cpu_us_per_op,
                                                rd.sched_us_per_op, rd.util);
                                fprintf(raw, "echo,%s,%d,%.0f,%.3f,%.3f,%.3f\n", workload_names[w], n,
                                        re.ops_per_s, re.cpu_us_per_op, re.sched_us_per_op, re.util);
                        }
                        snprintf(metric, sizeof(metric), "%s, %d client%s", workload_names[w], n,
                                 n > 1 ? "s" : "");
                        r = row_add(metric, rb.ops_per_s, "ops/s", "epoll echo server, same sizes",
                                    re.ops_per_s);
                        if (w == WL_ATTACH_RELEASE && n == 64)
                                row_target_value_min(r, 50000, ">= 50k ops/s");
                        row_note(r, "broker busy %.0f%% of a core", rb.util * 100);
                        snprintf(metric, sizeof(metric), "  broker CPU per op (%s, %d)", workload_names[w],
                                 n);
                        r = row_add(metric, rb.cpu_us_per_op, "us", "echo server CPU per op",
                                    re.cpu_us_per_op);
                        row_note(r, "utime+stime; scheduler says %.2f us", rb.sched_us_per_op);
                        if (w == WL_ATTACH_RELEASE) {
                                snprintf(metric, sizeof(metric), "  same frames, raw blocking clients (%d)",
                                         n);
                                r = row_add(metric, rd.ops_per_s, "ops/s", "epoll echo server, same sizes",
                                            re.ops_per_s);
                                row_note(r,
                                         "the broker without libgpuipc's client path; busy %.0f%%, %.2f us "
                                         "CPU/op",
                                         rd.util * 100, rd.cpu_us_per_op);
                        }
                }
        }
        if (raw)
                fclose(raw);
        gpuipc_close(prod);
        kill(echo, SIGKILL);
        child_wait(echo);
        broker_stop(&broker);
}
