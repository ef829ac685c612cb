/* The broker's time is shared fairly (broker/fair.c): a uid flooding from many connections, with
 * pings or with listings over thousands of buffers, gets no more than FAIR_FRAMES_PER_TURN of its
 * frames read between two frames of another uid that has as much to say; and under --cpu-limit a
 * flood is held to the limit while a light peer is still answered.
 *
 * Counted in frames, not in time: the observer pipelines its requests (always ready, so how often
 * it is read is the scheduler's doing alone, not how fast this machine answers or runs it), and
 * the frames_in_total of a stats request before and after them says how many frames of others the
 * broker read meanwhile. (On average: a frame of the observer's that cost more than its turn's
 * share would let the flood have two turns in a row, and a loaded machine may make one do so.)
 * The old loop read one frame of every ready connection per wakeup: 48 and 24 per frame here. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "macro.h"

/* FAIR_FRAMES_PER_TURN of broker/fair.h: the most frames a uid reads in one turn. */
#define FRAMES_PER_TURN 4
#define FLOOD_UID 65534
#define OBSERVER_PINGS 50

/* Lets other users traverse dir and its ancestors (temporary directories are 0700), so that the
 * socket's mode alone decides who may connect. */
static void let_others_reach(const char *dir)
{
        char path[256];

        snprintf(path, sizeof(path), "%s", dir);
        while (strlen(path) > 1 && strcmp(path, "/tmp") != 0) {
                char *slash;

                CHECK(chmod(path, 0711) == 0 || errno == EPERM);
                slash = strrchr(path, '/');
                if (!slash || slash == path)
                        break;
                *slash = 0;
        }
}

/* ---- the flood ---- */

typedef struct Flood {
        const HBroker *broker;
        int conns;
        ProtoOp op;   /* ping or list */
        uid_t uid;    /* 0: stay root */
} Flood;

/* Encodes one request of op (the list is a full page over every buffer). */
static void encode_request(ProtoOp op, ProtoBuf *ret)
{
        ProtoMsg m = { .op = op, .id = 7 };

        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID);
        CHECK_EQ(proto_frame_encode(ret, &m, 0), 0);
}

/* Keeps every connection's socket full of requests and reads whatever comes back, until the
 * parent says stop ('s'): the broker always has as much of this uid to read as it will take. */
static int flood_child(HChan *ch, void *arg)
{
        const Flood *fl = arg;
        struct pollfd *p = calloc((size_t)fl->conns + 1, sizeof(*p));
        uint8_t *buf = malloc(PROTO_MAX_FRAME);
        ProtoBuf req = { 0 };
        uint64_t sent = 0;

        CHECK(p && buf);
        if (fl->uid)
                CHECK(setgid(fl->uid) == 0 && setuid(fl->uid) == 0);
        encode_request(fl->op, &req);
        for (int i = 0; i < fl->conns; i++) {
                p[i].fd = h_raw_connect(fl->broker);
                h_raw_hello(p[i].fd);
                p[i].events = POLLIN | POLLOUT;
        }
        p[fl->conns] = (struct pollfd){ .fd = ch->rd, .events = POLLIN };
        h_report(ch, 'r', "%d connections ready", fl->conns);
        while (!(p[fl->conns].revents & (POLLIN | POLLHUP))) {
                for (int i = 0; i < fl->conns; i++) {
                        while (send(p[i].fd, req.data, req.len, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)req.len)
                                sent++;
                        CHECKF(errno == EAGAIN, "flooding: %s", strerror(errno));
                        while (recv(p[i].fd, buf, PROTO_MAX_FRAME, MSG_DONTWAIT) > 0)
                                ;
                }
                CHECK(poll(p, (nfds_t)fl->conns + 1, 1000) >= 0);
        }
        h_log("sent %llu requests", (unsigned long long)sent);
        for (int i = 0; i < fl->conns; i++)
                close(p[i].fd);
        proto_buf_free(&req);
        free(buf);
        free(p);
        return 0;
}

static HChild *flood_start(Flood *fl)
{
        HChild *kid = h_spawn("flood", flood_child, fl);

        h_child_expect(kid, 'r', H_SOON_MS * 3, NULL, 0);
        return kid;
}

static void flood_stop(HChild *kid)
{
        h_child_tell(kid, 's');
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
}

/* ---- the observer ---- */

static uint64_t stat_of(const HFrame *f, const char *key)
{
        ProtoMsg rec;
        ProtoIter it;

        proto_iter_init(&it, &f->msg.items);
        while (proto_iter_next(&it, &rec) == 1) {
                if (proto_str_eq(rec.name, key))
                        return rec.value;
        }
        h_fail(__FILE__, __LINE__, "the stats reply has no '%s'", key);
}

static void send_op(int sock, ProtoOp op)
{
        ProtoMsg m = { .op = op, .has = PROTO_BIT(PF_OP) };

        CHECK_EQ(h_raw_send_msg(sock, &m, 0, NULL, 0), 0);
}

/* Sends a stats request, OBSERVER_PINGS pings and another stats request on sock while the broker
 * is stopped, so that all of them wait when it goes on (next to the flood, whose sockets are full),
 * and returns how many frames of others the broker read per frame of the observer's meanwhile. */
static double observe(const HBroker *b, int sock)
{
        HFrame *f = h_frame_new();
        uint64_t in[2] = { 0, 0 };
        unsigned stats = 0;
        double per_frame;

        CHECK(kill(b->pid, SIGSTOP) == 0);
        /* Time for the flood to fill its sockets too: the old loop's count (one frame of each ready
         * connection per frame of the observer's) then shows whatever the machine's speed. */
        h_sleep_ms(100);
        send_op(sock, PROTO_OP_STATS);
        for (int i = 0; i < OBSERVER_PINGS; i++)
                send_op(sock, PROTO_OP_PING);
        send_op(sock, PROTO_OP_STATS);
        CHECK(kill(b->pid, SIGCONT) == 0);
        for (int i = 0; i < OBSERVER_PINGS + 2; i++) {
                CHECK_EQ(h_raw_recv(sock, H_SOON_MS * 3, f), 1);
                CHECK(f->msg.type == PROTO_REPLY && f->msg.status == PROTO_STATUS_OK);
                if (proto_has(&f->msg, PF_ITEMS))
                        in[stats++ ? 1 : 0] = stat_of(f, "frames_in_total");
        }
        CHECK_EQ(stats, 2);
        /* The observer's own frames between the two stats requests: the pings and the second one. */
        CHECKF(in[1] - in[0] > OBSERVER_PINGS + 1, "nothing of the flood was read while the observer was served");
        per_frame = (double)(in[1] - in[0] - OBSERVER_PINGS - 1) / (OBSERVER_PINGS + 1);
        h_log("frames of others read per frame of the observer's: %.2f", per_frame);
        h_frame_free(f);
        return per_frame;
}

/* A broker that another uid can reach. */
static void begin(HCase *k, const char *const *flags)
{
        if (getuid() != 0)
                h_skip("switching uid needs root");
        let_others_reach(h_case_dir());
        h_case_begin(k, flags);
        let_others_reach(k->broker->dir);
}

static const char *const open_socket[] = { "--socket-mode", "0666", "--cpu-limit", "none", NULL };

/* 48 connections of another uid keep the broker's input full of pings; the observer's frames are
 * read at most FAIR_FRAMES_PER_TURN of theirs apart (one frame of each of the 48 before). */
static void test_uid_flooding_pings(void)
{
        Flood fl = { .conns = 48, .op = PROTO_OP_PING, .uid = FLOOD_UID };
        HChild *kid;
        HCase k;
        int sock;

        begin(&k, open_socket);
        fl.broker = k.broker;
        kid = flood_start(&fl);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        CHECK(observe(k.broker, sock) <= FRAMES_PER_TURN + 2);
        flood_stop(kid);
        close(sock);
        h_case_end(&k);
}

/* Registers n cuda-legacy buffers (made-up handles: registry entries without an fd, so that the
 * broker's open fds, which stats counts, stay few) through sock, which must stay open. */
static void publish_handles(int sock, unsigned n)
{
        static const uint8_t handle[PROTO_LEGACY_HANDLE_SIZE] = { 'f', 'a', 'i', 'r' };
        HFrame *f = h_frame_new();
        char name[64];

        for (unsigned i = 0; i < n; i++) {
                ProtoMsg m = { .op = PROTO_OP_PUBLISH, .kind = PROTO_KIND_CUDA_LEGACY, .size = 4096 };

                snprintf(name, sizeof(name), "fair/%u", i);
                m.name = proto_str(name);
                m.device = proto_str("GPU-00000000-0000-0000-0000-000000000fa1");
                m.handle = (ProtoStr){ (const char *)handle, sizeof(handle) };
                m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE) |
                        PROTO_BIT(PF_DEVICE) | PROTO_BIT(PF_HANDLE);
                CHECK_EQ(h_raw_call(sock, &m, -1, f), PROTO_STATUS_OK);
        }
        h_frame_free(f);
}

/* 24 connections of another uid list in a loop over 3000 buffers they may not see (each listing
 * walks them all): at most FRAMES_PER_TURN listings per frame of the observer's, and fewer as
 * their cost is paid back with skipped turns (the old loop read one of each of the 24). */
static void test_uid_flooding_listings(void)
{
        Flood fl = { .conns = 24, .op = PROTO_OP_LIST, .uid = FLOOD_UID };
        HChild *kid;
        HCase k;
        int sock, producer;

        begin(&k, open_socket);
        producer = h_raw_connect(k.broker);
        h_raw_hello(producer);
        publish_handles(producer, 3000);
        fl.broker = k.broker;
        kid = flood_start(&fl);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        CHECK(observe(k.broker, sock) <= FRAMES_PER_TURN + 2);
        flood_stop(kid);
        close(sock);
        close(producer);
        h_log("turns skipped to pay back costly listings: %llu",
              (unsigned long long)h_stats(k.obs, "turns_skipped_total"));
        h_case_end(&k);
}

/* The broker's CPU time (utime + stime of /proc/PID/stat) in milliseconds. */
static uint64_t broker_cpu_ms(const HBroker *b)
{
        char path[64], text[1024], *p;
        unsigned long long ut = 0, st = 0;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int)b->pid);
        f = fopen(path, "re");
        CHECK(f && fgets(text, sizeof(text), f));
        fclose(f);
        p = strrchr(text, ')');
        CHECK(p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2);
        return (ut + st) * 1000 / (uint64_t)sysconf(_SC_CLK_TCK);
}

/* Under --cpu-limit 100m one connection flooding pings gets the broker to use about 75 ms of CPU a
 * second, not all it can get (a loaded machine gives it less: this bound is an upper one); it is
 * slowed, not stopped; and a light peer's pings are still answered. */
static void test_cpu_limit_holds_a_flood(void)
{
        static const char *const flags[] = { "--cpu-limit", "100m", NULL };
        Flood fl = { .conns = 1, .op = PROTO_OP_PING };
        uint64_t cpu0, t0, in0, cpu_ms, wall_ms, in;
        gpuipc_t *light;
        HChild *kid;
        HCase k;

        h_case_begin(&k, flags);
        CHECK_EQ(h_stats(k.obs, "cpu_limit_millicpus"), 100);
        light = h_connect(k.broker, "light");
        fl.broker = k.broker;
        kid = flood_start(&fl);
        in0 = h_stats(k.obs, "frames_in_total");
        cpu0 = broker_cpu_ms(k.broker);
        t0 = monotonic_ms();
        for (int i = 0; i < 30; i++) {
                CHECK_OK(light, gpuipc_ping(light, H_SOON_MS));
                h_sleep_ms(100);
        }
        cpu_ms = broker_cpu_ms(k.broker) - cpu0;
        wall_ms = monotonic_ms() - t0;
        in = h_stats(k.obs, "frames_in_total") - in0;
        h_log("in %llu ms the broker used %llu ms of CPU and read %llu frames; paced %llu times",
              (unsigned long long)wall_ms, (unsigned long long)cpu_ms, (unsigned long long)in,
              (unsigned long long)h_stats(k.obs, "frames_paced_total"));
        CHECKF(cpu_ms * 1000 <= wall_ms * 100 * 3 / 2, "the broker used %llu ms of CPU in %llu ms under 100m",
               (unsigned long long)cpu_ms, (unsigned long long)wall_ms);
        CHECK(h_stats(k.obs, "frames_paced_total") > 0);
        CHECK(in > 1000); /* the flood went on, slower */
        flood_stop(kid);
        gpuipc_close(light);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_uid_flooding_pings),
                H_TEST(test_uid_flooding_listings),
                H_TEST(test_cpu_limit_holds_a_flood),
        };

        return h_main(argc, argv, tests, ARRAY_SIZE(tests));
}
