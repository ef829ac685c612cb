/* Section 1, latency: round trips of libgpuipc calls against a raw SOCK_SEQPACKET ping-pong
 * between two processes with exactly the same request and reply sizes (measured by encoding the
 * frames the library sends and the broker answers), and, for the calls whose frames carry an fd
 * (publish of new memory, an uncached attach), a second ping-pong passing an fd the same way.
 * Broker and baseline run in alternating blocks, so that drift on a noisy machine hits both.
 * Then pings after an idle spell (every process asleep, its caches cold), against the ping-pong
 * after the same idle, with each server's CPU time per request. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "bench.h"
#include "internal.h"
#include "macro.h"

typedef enum Op {
        OP_PING,
        OP_PUBLISH,
        OP_REPUBLISH,
        OP_ATTACH_UNCACHED,
        OP_ATTACH_CACHED,
        OP_RELEASE,
        _OP_MAX
} Op;

typedef enum FdWay { FD_NONE, FD_TO_BROKER, FD_FROM_BROKER } FdWay;

typedef struct OpInfo {
        const char *name;
        const char *what; /* for the table */
        FdWay fd;
        size_t req, rep; /* frame sizes in bytes */
        Samples gp, raw, rawfd;
        Samples direct; /* the same frames from a blocking raw client (ping, cached attach, release) */
} OpInfo;

static OpInfo ops[_OP_MAX] = {
        [OP_PING] = {"ping", "ping", FD_NONE},
        [OP_PUBLISH] = {"publish", "publish new memfd (fd travels)", FD_TO_BROKER},
        [OP_REPUBLISH] = {"republish", "publish again (idle buffer)", FD_NONE},
        [OP_ATTACH_UNCACHED] = {"attach_uncached", "attach uncached (fd + mmap)", FD_FROM_BROKER},
        [OP_ATTACH_CACHED] = {"attach_cached", "attach cached (no fd, no mmap)", FD_NONE},
        [OP_RELEASE] = {"release", "release", FD_NONE},
};

typedef struct Ctx {
        Broker broker;
        gpuipc_t *prod, *cons;
        int echo;                                      /* socket to the echo server */
        int direct;                                    /* a raw blocking connection to the broker */
        ProtoBuf f_ping, f_attach, f_release, f_unmap; /* what it sends */
        int memfd;                                     /* what the fd baseline sends */
        uint8_t *buf;
        unsigned rounds, block;
        FILE *raw_out;
        unsigned round;
        bool record;
} Ctx;

#define BENCH_NAME_FMT "bench/lat/r%02u/%06u" /* what publish and uncached attach use */

/* ---- frame sizes ---- */

/* Re-encodes the reply that just arrived: the broker writes shortest encodings, as we do. */
static size_t reply_len(const Frame *f)
{
        return frame_len(&f->msg, f->fd >= 0);
}

static size_t request_len(ProtoMsg *req, int n_fds)
{
        req->id = 100000; /* ids in the timed loops have this many digits */
        proto_set(req, PF_ID);
        return frame_len(req, n_fds);
}

static Frame call(gpuipc_t *c, ProtoMsg *req, int fd)
{
        Frame f = {.fd = -1};
        int r = client_request(c, req, fd, 10000, &f);

        if (r < 0)
                die("calibration %s: %s [%s]", proto_op_name(req->op), gpuipc_strerror(r), gpuipc_errmsg(c));
        return f;
}

/* Sends each request the way libgpuipc builds it and measures both frames. */
static void calibrate(Ctx *x)
{
        gpuipc_t *c = bench_connect(&x->broker, "bench-calibrate");
        char name[64];
        ProtoMsg m;
        Frame f;
        uint64_t id;
        int fd = sealed_memfd(4096);

        snprintf(name, sizeof(name), BENCH_NAME_FMT, 0u, 0u);

        m = (ProtoMsg){.op = PROTO_OP_PING, .has = PROTO_BIT(PF_OP)};
        f = call(c, &m, -1);
        ops[OP_PING].rep = reply_len(&f);
        ops[OP_PING].req = request_len(&m, 0);
        frame_free(&f);

        m = (ProtoMsg){
                .op = PROTO_OP_PUBLISH, .name = proto_str(name), .kind = PROTO_KIND_MEMFD, .size = 4096};
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE) |
                PROTO_BIT(PF_WRITABLE) | PROTO_BIT(PF_BROKER_HELD) | PROTO_BIT(PF_RETIRE_AFTER);
        f = call(c, &m, fd);
        id = f.msg.buffer;
        ops[OP_PUBLISH].rep = reply_len(&f);
        ops[OP_PUBLISH].req = request_len(&m, 1);
        frame_free(&f);

        m = (ProtoMsg){.op = PROTO_OP_ATTACH, .name = proto_str(name), .timeout_ms = 5000};
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_TIMEOUT_MS);
        f = call(c, &m, -1);
        ops[OP_ATTACH_UNCACHED].rep = reply_len(&f);
        ops[OP_ATTACH_UNCACHED].req = request_len(&m, 0);
        frame_free(&f);
        f = call(c, &m, -1);
        ops[OP_ATTACH_CACHED].rep = reply_len(&f);
        ops[OP_ATTACH_CACHED].req = ops[OP_ATTACH_UNCACHED].req;
        frame_free(&f);

        for (int i = 0; i < 2; i++) {
                m = (ProtoMsg){.op = PROTO_OP_RELEASE,
                               .buffer = id,
                               .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER)};
                f = call(c, &m, -1);
                ops[OP_RELEASE].rep = reply_len(&f);
                ops[OP_RELEASE].req = request_len(&m, 0);
                frame_free(&f);
        }

        m = (ProtoMsg){.op = PROTO_OP_RETIRE, .buffer = id, .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER)};
        f = call(c, &m, -1);
        frame_free(&f);
        m = (ProtoMsg){.op = PROTO_OP_PUBLISH, .name = proto_str("bench/lat/re"), .buffer = id};
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_BUFFER) | PROTO_BIT(PF_RETIRE_AFTER);
        f = call(c, &m, -1); /* the drained event of the retire may come first: client_request skips it */
        ops[OP_REPUBLISH].rep = reply_len(&f);
        ops[OP_REPUBLISH].req = request_len(&m, 0);
        frame_free(&f);

        close(fd);
        gpuipc_close(c);
        for (int i = 0; i < _OP_MAX; i++)
                note("%-16s request %3zu B, reply %3zu B%s", ops[i].name, ops[i].req, ops[i].rep,
                     ops[i].fd == FD_TO_BROKER     ? ", fd to the broker"
                     : ops[i].fd == FD_FROM_BROKER ? ", fd back"
                                                   : "");
}

/* ---- a raw client ----
 * Blocking sendmsg + recvmsg of the exact frames libgpuipc sends, like the ping-pong baseline:
 * what remains above the baseline is the broker's own work; what libgpuipc adds on top of this is
 * the client library's (its non-blocking receive, poll, decoding, bookkeeping). */

static ProtoBuf encode(ProtoMsg *m)
{
        ProtoBuf b = {0};

        m->id = 100000;
        proto_set(m, PF_ID);
        if (proto_frame_encode(&b, m, 0) != 0)
                die("cannot encode a frame");
        return b;
}

static uint64_t direct_round(Ctx *x, const ProtoBuf *req)
{
        uint64_t t0 = monotonic_ns();
        int fd;

        if (rec_send(x->direct, req->data, req->len, -1) < 0 ||
            rec_recv(x->direct, x->buf, ECHO_BUF, &fd) <= 0)
                die("the broker closed the raw connection");
        if (fd >= 0)
                close(fd);
        return monotonic_ns() - t0;
}

static void direct_open(Ctx *x, uint64_t k_id)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        ProtoMsg m;
        ProtoBuf hello;

        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", x->broker.sock);
        x->direct = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (x->direct < 0 || connect(x->direct, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                die("cannot connect to the broker: %s", strerror(errno));
        m = (ProtoMsg){.op = PROTO_OP_HELLO,
                       .version = PROTO_VERSION,
                       .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_VERSION)};
        hello = encode(&m);
        direct_round(x, &hello);
        proto_buf_free(&hello);
        m = (ProtoMsg){.op = PROTO_OP_PING, .has = PROTO_BIT(PF_OP)};
        x->f_ping = encode(&m);
        m = (ProtoMsg){.op = PROTO_OP_ATTACH, .name = proto_str("bench/lat/k"), .timeout_ms = 5000};
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_TIMEOUT_MS);
        x->f_attach = encode(&m);
        m = (ProtoMsg){
                .op = PROTO_OP_RELEASE, .buffer = k_id, .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER)};
        x->f_release = encode(&m);
        m.op = PROTO_OP_UNMAP;
        x->f_unmap = encode(&m);
        /* The first attach carries the fd: the ones we time are cached. */
        direct_round(x, &x->f_attach);
        direct_round(x, &x->f_release);
}

/* ---- blocks ---- */

static void record(Ctx *x, Samples *s, Op op, const char *kind, uint64_t ns)
{
        if (!x->record)
                return;
        samples_add(s, (double)ns / 1000.0);
        if (x->raw_out)
                fprintf(x->raw_out, "%s,%s,%u,%.3f\n", ops[op].name, kind, x->round, (double)ns / 1000.0);
}

/* The raw ping-pong of op's sizes, plain and (for fd ops) passing an fd the same way. */
static void raw_block(Ctx *x, Op op, unsigned n)
{
        OpInfo *o = &ops[op];

        for (unsigned i = 0; i < n; i++)
                record(x, &o->raw, op, "raw", echo_round(x->echo, x->buf, o->req, o->rep, -1, false));
        if (o->fd == FD_NONE)
                return;
        for (unsigned i = 0; i < n; i++)
                record(x, &o->rawfd, op, "raw_fd",
                       echo_round(x->echo, x->buf, o->req, o->rep, o->fd == FD_TO_BROKER ? x->memfd : -1,
                                  o->fd == FD_FROM_BROKER));
}

#define TIMED(x, c, op, call)                                                                               \
        do {                                                                                                \
                uint64_t t0_ = monotonic_ns();                                                                    \
                TRY(c, call);                                                                               \
                record(x, &ops[op].gp, op, "gpuipc", monotonic_ns() - t0_);                                       \
        } while (0)

/* Events nobody waits for (drained events of buffers we freed) would pile up in the producer's
 * queue, and libgpuipc scans that queue on every wait_drained: take them. */
static void drop_events(gpuipc_t *c)
{
        gpuipc_event_t ev;

        while (gpuipc_next_event(c, 0, &ev) == 0)
                ;
}

/* Publish n new buffers (timed), attach each on the consumer connection (timed: the fd travels
 * and is mapped), then release and free them (not timed). */
static void publish_and_attach_block(Ctx *x, unsigned n, bool raw_first)
{
        gpuipc_buffer_t **mine = calloc(n, sizeof(*mine)), **theirs = calloc(n, sizeof(*theirs));
        char name[64];

        if (!mine || !theirs)
                die("out of memory");
        for (unsigned i = 0; i < n; i++)
                TRY(x->prod, gpuipc_buffer_alloc(x->prod, GPUIPC_KIND_MEMFD, 4096, 0, &mine[i]));
        if (raw_first)
                raw_block(x, OP_PUBLISH, n);
        for (unsigned i = 0; i < n; i++) {
                snprintf(name, sizeof(name), BENCH_NAME_FMT, x->round, i);
                TIMED(x, x->prod, OP_PUBLISH, gpuipc_publish(x->prod, mine[i], name, NULL));
        }
        if (!raw_first)
                raw_block(x, OP_PUBLISH, n);

        if (raw_first)
                raw_block(x, OP_ATTACH_UNCACHED, n);
        for (unsigned i = 0; i < n; i++) {
                snprintf(name, sizeof(name), BENCH_NAME_FMT, x->round, i);
                TIMED(x, x->cons, OP_ATTACH_UNCACHED, gpuipc_attach(x->cons, name, 5000, &theirs[i]));
                if (((volatile const char *)gpuipc_buffer_ptr(theirs[i]))[0] != 0)
                        die("unexpected data in a fresh buffer");
        }
        if (!raw_first)
                raw_block(x, OP_ATTACH_UNCACHED, n);

        for (unsigned i = 0; i < n; i++)
                TRY(x->cons, gpuipc_release(x->cons, theirs[i]));
        for (unsigned i = 0; i < n; i++)
                TRY(x->prod, gpuipc_buffer_free(x->prod, mine[i]));
        /* The freed events unmap the consumer's cached mappings; take them before timing again. */
        TRY(x->cons, gpuipc_ping(x->cons, 10000));
        drop_events(x->prod);
        free(mine);
        free(theirs);
}

static void republish_block(Ctx *x, gpuipc_buffer_t *b, unsigned n, bool raw_first)
{
        if (raw_first)
                raw_block(x, OP_REPUBLISH, n);
        for (unsigned i = 0; i < n; i++) {
                uint64_t t0 = monotonic_ns();
                TRY(x->prod, gpuipc_publish(x->prod, b, "bench/lat/re", NULL));
                record(x, &ops[OP_REPUBLISH].gp, OP_REPUBLISH, "gpuipc", monotonic_ns() - t0);
                TRY(x->prod, gpuipc_retire(x->prod, b));
                TRY(x->prod, gpuipc_wait_drained(x->prod, b, 10000));
        }
        if (!raw_first)
                raw_block(x, OP_REPUBLISH, n);
}

static void cached_block(Ctx *x, unsigned n, bool raw_first)
{
        if (raw_first) {
                raw_block(x, OP_ATTACH_CACHED, n);
                raw_block(x, OP_RELEASE, n);
        }
        for (unsigned i = 0; i < n; i++) {
                gpuipc_buffer_t *b;
                TIMED(x, x->cons, OP_ATTACH_CACHED, gpuipc_attach(x->cons, "bench/lat/k", 5000, &b));
                TIMED(x, x->cons, OP_RELEASE, gpuipc_release(x->cons, b));
        }
        for (unsigned i = 0; i < n; i++) {
                record(x, &ops[OP_ATTACH_CACHED].direct, OP_ATTACH_CACHED, "direct",
                       direct_round(x, &x->f_attach));
                record(x, &ops[OP_RELEASE].direct, OP_RELEASE, "direct", direct_round(x, &x->f_release));
        }
        /* Uncached from the raw client: unmap after each release, so that the fd travels again
         * (it is closed on arrival, not mapped). */
        for (unsigned i = 0; i < n; i++) {
                record(x, &ops[OP_ATTACH_UNCACHED].direct, OP_ATTACH_UNCACHED, "direct",
                       direct_round(x, &x->f_attach));
                direct_round(x, &x->f_release);
                direct_round(x, &x->f_unmap);
        }
        if (!raw_first) {
                raw_block(x, OP_ATTACH_CACHED, n);
                raw_block(x, OP_RELEASE, n);
        }
}

static void ping_block(Ctx *x, unsigned n, bool raw_first)
{
        if (raw_first)
                raw_block(x, OP_PING, n);
        for (unsigned i = 0; i < n; i++)
                TIMED(x, x->cons, OP_PING, gpuipc_ping(x->cons, 10000));
        for (unsigned i = 0; i < n; i++)
                record(x, &ops[OP_PING].direct, OP_PING, "direct", direct_round(x, &x->f_ping));
        if (!raw_first)
                raw_block(x, OP_PING, n);
}

static void round_run(Ctx *x, gpuipc_buffer_t *re, unsigned n)
{
        bool raw_first = x->round & 1;

        publish_and_attach_block(x, n, raw_first);
        republish_block(x, re, n, raw_first);
        cached_block(x, n, raw_first);
        ping_block(x, n, raw_first);
}

/* ---- after an idle spell ----
 * A pipeline that hands over a frame every few tens of milliseconds finds every process asleep
 * and its caches cold: the same round trip then costs several times what it costs back to back.
 * Each round sleeps IDLE_MS before each of the three (rotated): the ping-pong with the echo
 * server, the raw client's ping, libgpuipc's ping; the server's CPU time for each request comes
 * from its schedstat (the kernel's run time, read before and after). */

#define IDLE_MS 50

typedef struct IdleSeries {
        Samples wall, server_cpu;
} IdleSeries;

static void idle_one(IdleSeries *s, pid_t server, uint64_t (*round_ns)(Ctx *), Ctx *x)
{
        uint64_t cpu0, ns;

        usleep(IDLE_MS * 1000);
        cpu0 = proc_sched_ns(server);
        ns = round_ns(x);
        samples_add(&s->wall, (double)ns / 1000.0);
        samples_add(&s->server_cpu, (double)(proc_sched_ns(server) - cpu0) / 1000.0);
}

static uint64_t idle_echo(Ctx *x)
{
        return echo_round(x->echo, x->buf, ops[OP_PING].req, ops[OP_PING].rep, -1, false);
}

static uint64_t idle_direct(Ctx *x)
{
        return direct_round(x, &x->f_ping);
}

static uint64_t idle_library(Ctx *x)
{
        uint64_t t0 = monotonic_ns();

        TRY(x->cons, gpuipc_ping(x->cons, 10000));
        return monotonic_ns() - t0;
}

/* " [pin same]" or " [pin split]" after a row's name when --pin placed the processes, else "". */
static const char *pin_tag(void)
{
        static char tag[32];

        if (!bench_opts.pin)
                return "";
        snprintf(tag, sizeof(tag), " [pin %s]", bench_opts.pin);
        return tag;
}

static void idle_series_free(IdleSeries *s)
{
        samples_free(&s->wall);
        samples_free(&s->server_cpu);
}

static void idle_rows(Ctx *x, pid_t echo, unsigned rounds)
{
        static const char baseline[] = "raw ping-pong, same idle";
        IdleSeries echo_s = {0}, direct_s = {0}, lib_s = {0};
        char metric[96];
        Row *r;

        for (unsigned i = 0; i < rounds; i++) {
                for (unsigned k = 0; k < 3; k++) {
                        switch ((i + k) % 3) {
                        case 0: idle_one(&echo_s, echo, idle_echo, x); break;
                        case 1: idle_one(&direct_s, x->broker.pid, idle_direct, x); break;
                        default: idle_one(&lib_s, x->broker.pid, idle_library, x); break;
                        }
                }
        }
        snprintf(metric, sizeof(metric), "ping p50 after %d ms idle, raw blocking client%s", IDLE_MS, pin_tag());
        r = row_add(metric, samples_pct(&direct_s.wall, 50), "us", baseline, samples_pct(&echo_s.wall, 50));
        row_note(r,
                 "server CPU per request p50: broker %.1f us, echo server %.1f us; back to back %.1f vs %.1f us "
                 "(%u rounds)",
                 samples_pct(&direct_s.server_cpu, 50), samples_pct(&echo_s.server_cpu, 50),
                 samples_pct(&ops[OP_PING].direct, 50), samples_pct(&ops[OP_PING].raw, 50), rounds);
        snprintf(metric, sizeof(metric), "ping p50 after %d ms idle, libgpuipc%s", IDLE_MS, pin_tag());
        r = row_add(metric, samples_pct(&lib_s.wall, 50), "us", baseline, samples_pct(&echo_s.wall, 50));
        row_note(r,
                 "libgpuipc adds %.1f us to the raw client after the idle (%.1f back to back); broker CPU p50 "
                 "%.1f us",
                 samples_pct(&lib_s.wall, 50) - samples_pct(&direct_s.wall, 50),
                 samples_pct(&ops[OP_PING].gp, 50) - samples_pct(&ops[OP_PING].direct, 50),
                 samples_pct(&lib_s.server_cpu, 50));
        idle_series_free(&echo_s);
        idle_series_free(&direct_s);
        idle_series_free(&lib_s);
}

/* ---- results ---- */

static void add_rows(const char *pct_name, double pct, double limit)
{
        for (int i = 0; i < _OP_MAX; i++) {
                OpInfo *o = &ops[i];
                bool fd = o->fd != FD_NONE;
                Samples *base = fd ? &o->rawfd : &o->raw;
                char metric[96], baseline[64];
                Row *r;

                snprintf(metric, sizeof(metric), "%s %s%s", o->what, pct_name, pin_tag());
                snprintf(baseline, sizeof(baseline), "raw ping-pong%s %zu/%zu B", fd ? " + fd" : "", o->req,
                         o->rep);
                r = row_add(metric, samples_pct(&o->gp, pct), "us", baseline, samples_pct(base, pct));
                row_target_ratio_max(r, limit);
                if (fd)
                        row_note(r, "%.2fx the ping-pong without fd (%.1f us)",
                                 samples_pct(&o->gp, pct) / samples_pct(&o->raw, pct),
                                 samples_pct(&o->raw, pct));
                else
                        row_note(r, "%zu samples", o->gp.n);
        }
}

/* The decomposition: ping-pong < raw client to the broker < libgpuipc. */
static void add_direct_rows(void)
{
        static const Op which[] = {OP_PING, OP_ATTACH_UNCACHED, OP_ATTACH_CACHED, OP_RELEASE};

        for (size_t i = 0; i < ARRAY_SIZE(which); i++) {
                OpInfo *o = &ops[which[i]];
                bool fd = o->fd != FD_NONE;
                Samples *base = fd ? &o->rawfd : &o->raw;
                char metric[96], baseline[64];
                Row *r;

                snprintf(metric, sizeof(metric), "%s p50, raw blocking client%s", o->what, pin_tag());
                snprintf(baseline, sizeof(baseline), "raw ping-pong%s %zu/%zu B", fd ? " + fd" : "", o->req,
                         o->rep);
                r = row_add(metric, samples_pct(&o->direct, 50), "us", baseline, samples_pct(base, 50));
                row_note(r, "broker's share %.1f us; libgpuipc adds %.1f us%s (p99 %.1f us)",
                         samples_pct(&o->direct, 50) - samples_pct(base, 50),
                         samples_pct(&o->gp, 50) - samples_pct(&o->direct, 50),
                         fd ? " incl. fstat+mmap" : "", samples_pct(&o->direct, 99));
        }
}

static void write_percentiles(void)
{
        static const double pcts[] = {1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97, 98, 99, 99.5, 99.9};
        FILE *f = out_open("latency_percentiles.csv", "op,series,percentile,us");

        if (!f)
                return;
        for (int i = 0; i < _OP_MAX; i++) {
                for (size_t k = 0; k < ARRAY_SIZE(pcts); k++) {
                        fprintf(f, "%s,gpuipc,%g,%.3f\n", ops[i].name, pcts[k],
                                samples_pct(&ops[i].gp, pcts[k]));
                        fprintf(f, "%s,raw,%g,%.3f\n", ops[i].name, pcts[k],
                                samples_pct(&ops[i].raw, pcts[k]));
                        if (ops[i].fd != FD_NONE)
                                fprintf(f, "%s,raw_fd,%g,%.3f\n", ops[i].name, pcts[k],
                                        samples_pct(&ops[i].rawfd, pcts[k]));
                        if (ops[i].direct.n)
                                fprintf(f, "%s,direct,%g,%.3f\n", ops[i].name, pcts[k],
                                        samples_pct(&ops[i].direct, pcts[k]));
                }
        }
        fclose(f);
}

static int echo_child(void *arg)
{
        return echo_serve(*(int *)arg);
}

void section_latency(void)
{
        Ctx x = {.rounds = bench_opts.quick ? 4 : 20, .block = bench_opts.quick ? 250 : 1000};
        gpuipc_buffer_t *re, *k, *v;
        int sv[2];
        pid_t echo;

        raise_nofile(2 * x.block + 1024);
        if (bench_opts.pin)
                pin_to_cpu(0, 0); /* the brokers and the echo server inherit it, and "split" moves them */
        broker_start(&x.broker, NULL, 0);
        if (bench_opts.pin && strcmp(bench_opts.pin, "split") == 0)
                pin_to_cpu(x.broker.pid, 1);
        calibrate(&x);

        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
                die("socketpair: %s", strerror(errno));
        echo = spawn(echo_child, &sv[1], &sv[1], 1);
        close(sv[1]);
        if (bench_opts.pin && strcmp(bench_opts.pin, "split") == 0)
                pin_to_cpu(echo, 1);
        x.echo = sv[0];
        x.memfd = sealed_memfd(4096);
        x.buf = malloc(ECHO_BUF);
        x.prod = bench_connect(&x.broker, "bench-producer");
        x.cons = bench_connect(&x.broker, "bench-consumer");
        x.cons->max_idle = SIZE_MAX; /* keep every mapping until its buffer is freed: no unmap traffic */

        TRY(x.prod, gpuipc_buffer_alloc(x.prod, GPUIPC_KIND_MEMFD, 4096, 0, &re));
        TRY(x.prod, gpuipc_publish(x.prod, re, "bench/lat/re", NULL));
        TRY(x.prod, gpuipc_retire(x.prod, re));
        TRY(x.prod, gpuipc_wait_drained(x.prod, re, 10000));
        TRY(x.prod, gpuipc_buffer_alloc(x.prod, GPUIPC_KIND_MEMFD, 4096, 0, &k));
        TRY(x.prod, gpuipc_publish(x.prod, k, "bench/lat/k", NULL));
        TRY(x.cons, gpuipc_attach(x.cons, "bench/lat/k", 5000, &v)); /* maps it: later attaches are cached */
        TRY(x.cons, gpuipc_release(x.cons, v));
        direct_open(&x, gpuipc_buffer_id(k));

        x.raw_out = out_open("latency_samples.csv", "op,series,round,us");
        note("%u rounds of %u calls per operation, alternating with the ping-pong", x.rounds, x.block);
        x.round = 99; /* warm-up, not recorded */
        round_run(&x, re, x.block / 4);
        x.record = true;
        for (x.round = 0; x.round < x.rounds; x.round++)
                round_run(&x, re, x.block);
        if (x.raw_out)
                fclose(x.raw_out);

        add_rows("p50", 50, 1.5);
        add_rows("p99", 99, 3.0);
        add_direct_rows();
        idle_rows(&x, echo, bench_opts.quick ? 12 : 40);
        write_percentiles();

        gpuipc_close(x.cons);
        gpuipc_close(x.prod);
        close(x.echo);
        close(x.direct);
        child_wait(echo);
        broker_stop(&x.broker);
}
