/* Hostile peers that stay within the framing rules but try to wear the broker down: a uid the
 * policy does not allow, a request flood, a frame with as many fds as the kernel lets one carry, a
 * subscriber that never reads its events, and 10,000 connect/disconnect cycles. In each case the
 * broker's resident memory and open fds stay bounded and the bystander keeps being served. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "macro.h"

#define RSS_GROWTH_LIMIT_KB (16 * 1024) /* what any of these attacks may add to the broker */

static void check_rss_bounded(const HBroker *b, long before, const char *after_what)
{
        long now = h_broker_rss_kb(b);

        h_log("broker RSS %ld kB before, %ld kB after %s", before, now, after_what);
        if (!h_broker_rss_meaningful()) {
                h_log("a wrapper or AddressSanitizer owns most of the broker's RSS: it is not checked");
                return;
        }
        CHECKF(now - before < RSS_GROWTH_LIMIT_KB, "the broker grew by %ld kB after %s", now - before, after_what);
}

/* ---- a uid the policy does not allow ---- */

/* Lets other users traverse dir and its ancestors (temporary directories are 0700), so that only
 * the socket's mode and the policy decide what the other uid may do. */
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

static int denied_child(HChan *ch, void *arg)
{
        const HBroker *b = arg;
        gpuipc_buffer_t *buf = NULL;
        gpuipc_t *c;

        CHECK(setgid(65534) == 0 && setuid(65534) == 0);
        c = h_connect(b, "intruder");
        CHECK_OK(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, 4096, 0, &buf));
        CHECK_ERR(c, gpuipc_publish(c, buf, "tenant/a/frame", NULL), GPUIPC_E_DENIED);
        CHECKF(strstr(gpuipc_errmsg(c), "65534"), "the denial does not name the uid: %s", gpuipc_errmsg(c));
        CHECK_ERR(c, gpuipc_attach(c, "tenant/a/frame", 0, &buf), GPUIPC_E_DENIED);
        CHECK_ERR(c, gpuipc_subscribe(c, "tenant/a/", NULL), GPUIPC_E_DENIED);
        /* Denied is not disconnected: what the policy allows still works. */
        CHECK_OK(c, gpuipc_ping(c, H_SOON_MS));
        CHECK_OK(c, gpuipc_publish(c, buf, "public/x", NULL));
        h_report(ch, 'd', "denied as expected");
        gpuipc_close(c);
        return 0;
}

/* Under a policy, another uid is denied publish, attach and subscribe outside its prefix (the message names the
 * uid) and is not disconnected: what the policy allows still works (needs root). */
static void test_uid_without_permission(void)
{
        char policy[256];
        const char *flags[] = { "--policy", policy, "--socket-mode", "0666", NULL };
        FILE *f;
        HCase k;
        HChild *kid;

        if (getuid() != 0) {
                h_log("switching uid needs root: skipped");
                return;
        }
        snprintf(policy, sizeof(policy), "%s/policy.conf", h_case_dir());
        let_others_reach(h_case_dir());
        f = fopen(policy, "we");
        CHECK(f);
        fputs("allow all uid=0\nallow publish,attach any prefix=public/\nallow publish,attach,admin any prefix=by/\n",
              f);
        fclose(f);
        h_case_begin(&k, flags);
        let_others_reach(k.broker->dir);
        kid = h_spawn("intruder", denied_child, k.broker);
        h_child_expect(kid, 'd', H_SOON_MS, NULL, 0);
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        h_case_end(&k);
}

/* Reads what a dropped peer was sent until end-of-file: the last frame must be the broker's notice
 * saying why (reply 0, quota, naming the limit's flag). */
static void expect_drop_notice(int sock, const char *flag)
{
        HFrame *f = h_frame_new();
        bool got = false, reset_seen = false;
        int r;

        /* A close with requests of ours unread makes the kernel report ECONNRESET once, before the
         * frames the broker sent (docs/protocol.md section 4): read on past it. */
        while ((r = h_raw_recv(sock, H_SOON_MS, f)) == 1 || (r == 0 && !reset_seen && (reset_seen = true))) {
                if (r == 0)
                        continue;
                got = f->msg.type == PROTO_REPLY && f->msg.reply == 0 && f->msg.status == PROTO_STATUS_QUOTA &&
                      f->msg.message.len && memmem(f->msg.message.ptr, f->msg.message.len, flag, strlen(flag));
        }
        CHECKF(r == 0, "no end-of-file after the broker dropped the peer");
        CHECKF(got, "the last frame before end-of-file is not a quota notice naming %s", flag);
        h_frame_free(f);
}

/* ---- a request flood ---- */

/* A peer flooding requests without reading is dropped once its unread replies pass the limit, told why (--max-
 * queued-bytes), and the broker's memory stays bounded. */
static void test_request_flood(void)
{
        ProtoMsg ping = { .op = PROTO_OP_PING };
        long rss;
        int sock, sent = 0, r = 0;
        HCase k;

        h_case_begin(&k, NULL);
        rss = h_broker_rss_kb(k.broker);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        /* As fast as the socket takes them, reading nothing back: the broker must not queue
         * without bound; it drops the peer once its unread replies pass the limit. */
        for (; sent < 200000; sent++) {
                ping.id = (uint64_t)sent + 2;
                ping.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID);
                r = h_raw_send_msg(sock, &ping, 0, NULL, 0);
                if (r < 0)
                        break;
        }
        h_log("flooded %d pings (last send: %s)", sent, r < 0 ? strerror(-r) : "ok");
        h_bystander_check(&k);
        WAIT_UNTIL(h_broker_log_count(k.broker, "dropping a peer that does not read") == 1, H_SOON_MS);
        expect_drop_notice(sock, "--max-queued-bytes");
        close(sock);
        check_rss_bounded(k.broker, rss, "a request flood");
        h_case_end(&k);
}

/* ---- the most fds one frame can carry ---- */

/* Sends one frame with n fds attached (the harness's raw sender stops at a sane count). */
static void send_with_fds(int sock, const ProtoMsg *m, const int *fds, size_t n)
{
        size_t ctrl_len = CMSG_SPACE(n * sizeof(int));
        char *ctrl = calloc(1, ctrl_len);
        ProtoBuf frame = { 0 };
        struct iovec iov;
        struct msghdr mh = { 0 };
        struct cmsghdr *cm;

        CHECK(ctrl);
        CHECK_EQ(proto_frame_encode(&frame, m, 1), 0);
        iov = (struct iovec){ frame.data, frame.len };
        mh = (struct msghdr){ .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl, .msg_controllen = ctrl_len };
        cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(n * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
        CHECKF(sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)frame.len, "sendmsg with %zu fds: %s", n, strerror(errno));
        proto_buf_free(&frame);
        free(ctrl);
}

/* A frame carrying more fds than the broker reads is a protocol error that closes the connection, and none of the
 * fds stays open in the broker. */
static void test_frame_with_many_fds(void)
{
        enum { KERNEL_MAX = 253 }; /* SCM_MAX_FD: a message cannot carry 255 */
        int fds[KERNEL_MAX], sock, before;
        ProtoMsg ping = { .op = PROTO_OP_PING, .id = 7 };
        HFrame *reply = h_frame_new();
        HCase k;

        h_case_begin(&k, NULL);
        before = h_broker_fds(k.broker);
        for (int i = 0; i < KERNEL_MAX; i++) {
                fds[i] = memfd_create("many", MFD_CLOEXEC);
                CHECK(fds[i] >= 0);
        }
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        ping.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID);
        send_with_fds(sock, &ping, fds, KERNEL_MAX);
        /* The broker has room for a few fds per frame: the rest are cut off by the kernel
         * (MSG_CTRUNC), which is a protocol error; nothing it received may stay open. */
        CHECK_EQ(h_raw_recv(sock, H_SOON_MS, reply), 1);
        CHECK_EQ(reply->msg.status, PROTO_STATUS_PROTOCOL);
        h_frame_free(reply);
        CHECKF(h_raw_wait_eof(sock, H_SOON_MS), "the connection stayed open");
        close(sock);
        for (int i = 0; i < KERNEL_MAX; i++)
                close(fds[i]);
        WAIT_UNTIL(h_broker_fds(k.broker) <= before, H_SOON_MS);
        h_case_end(&k);
}

/* ---- a subscriber that never reads ---- */

/* A subscriber that reads none of its events is dropped at --max-queued-bytes, while the producer keeps publishing
 * and the broker's memory stays bounded. */
static void test_subscriber_never_reads(void)
{
        const char *flags[] = { "--max-queued-bytes", "262144", NULL };
        ProtoMsg sub = { .op = PROTO_OP_SUBSCRIBE };
        gpuipc_buffer_t *b;
        gpuipc_t *prod;
        HFrame *reply = h_frame_new();
        long rss;
        int sock, i;
        HCase k;

        h_case_begin(&k, flags);
        rss = h_broker_rss_kb(k.broker);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        sub.prefix = proto_str("");
        sub.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_PREFIX);
        CHECK_EQ(h_raw_call(sock, &sub, -1, reply), PROTO_STATUS_OK);
        h_frame_free(reply);
        prod = h_connect(k.broker, "busy-producer");
        CHECK_OK(prod, gpuipc_buffer_alloc(prod, GPUIPC_KIND_MEMFD, 4096, 0, &b));
        /* Every publish and retire is an event for the subscriber, which reads none of them. */
        for (i = 0; i < 20000 && !h_broker_log_count(k.broker, "does not read"); i++) {
                char name[64];

                snprintf(name, sizeof(name), "churn/%d", i);
                CHECK_OK(prod, gpuipc_publish(prod, b, name, NULL));
                CHECK_OK(prod, gpuipc_retire(prod, b));
                CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
        }
        h_log("%d publish/retire rounds until the silent subscriber was dropped", i);
        WAIT_UNTIL(h_broker_log_count(k.broker, "dropping a peer that does not read") == 1, H_SOON_MS);
        expect_drop_notice(sock, "--max-queued-bytes");
        close(sock);
        CHECK_OK(prod, gpuipc_buffer_free(prod, b));
        gpuipc_close(prod);
        h_bystander_check(&k);
        check_rss_bounded(k.broker, rss, "a subscriber that never reads");
        h_case_end(&k);
}

/* ---- a peer that makes the broker queue fds for it ---- */

/* A peer that never reads cannot make the broker hold an fd copy for every queued reply: past --max-queued-fds it
 * is dropped, and its fds are closed. */
static void test_queued_fds_bounded(void)
{
        const char *flags[] = { "--max-queued-fds", "64", NULL };
        ProtoMsg attach = { .op = PROTO_OP_ATTACH }, release = { .op = PROTO_OP_RELEASE },
                 unmap = { .op = PROTO_OP_UNMAP };
        gpuipc_buffer_t *b;
        int sock, before, most = 0, sent = 0, r = 0;
        uint64_t id = 10;
        HCase k;

        h_case_begin(&k, flags);
        b = h_publish(k.by_prod, "fds/x", 4096, 7, NULL);
        before = h_broker_fds(k.broker);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        /* attach, release, unmap, again and again, reading nothing: each attach reply carries the
         * buffer's fd (unmap says we dropped it), and once the socket is full the broker would hold
         * a copy of the fd for every reply it queues. */
        for (; sent < 20000 && r == 0; sent++) {
                attach.buffer = release.buffer = unmap.buffer = gpuipc_buffer_id(b);
                attach.id = ++id;
                attach.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID) | PROTO_BIT(PF_BUFFER);
                release.id = ++id;
                release.has = attach.has;
                unmap.id = ++id;
                unmap.has = attach.has;
                r = h_raw_send_msg(sock, &attach, 0, NULL, 0);
                if (r == 0)
                        r = h_raw_send_msg(sock, &release, 0, NULL, 0);
                if (r == 0)
                        r = h_raw_send_msg(sock, &unmap, 0, NULL, 0);
                if (sent % 16 == 0)
                        most = MAX(most, h_broker_fds(k.broker));
        }
        h_log("%d attach/release/unmap rounds sent without reading (last send: %s); broker fds %d before, "
              "at most %d during", sent, r < 0 ? strerror(-r) : "ok", before, most);
        /* The limit plus the connection's own socket and pidfd, and some slack for sampling. */
        CHECKF(most <= before + 64 + 8, "the broker held %d fds for a peer that does not read", most - before);
        WAIT_UNTIL(h_broker_log_count(k.broker, "dropping a peer that does not read") == 1, H_SOON_MS);
        expect_drop_notice(sock, "--max-queued-fds");
        close(sock);
        WAIT_UNTIL(h_broker_fds(k.broker) <= before, H_SOON_MS);
        h_bystander_check(&k);
        h_case_end(&k);
}

/* ---- peers that pile up fds in their sockets ---- */

/* Every fd the broker sends counts against its uid's RLIMIT_NOFILE until the peer reads it (the
 * kernel's unix in-flight accounting): a few connections that never read used to make every later
 * fd-carrying reply fail with ETOOMANYREFS, and the broker dropped the innocent recipient. */
static void test_inflight_fds_hogs(void)
{
        enum { HOGS = 16, ROUNDS = 200, VICTIM_EVERY = 5 };
        const struct rlimit low = { 1024, 1024 }; /* as under prlimit --nofile=1024:1024 */
        ProtoMsg attach = { .op = PROTO_OP_ATTACH }, unmap = { .op = PROTO_OP_UNMAP };
        int hogs[HOGS], victims = 0, victims_while_hogs = 0;
        bool dropped[HOGS] = { false };
        gpuipc_buffer_t *b;
        uint64_t id = 10;
        HCase k;

        /* The broker inherits the limit (and cannot raise its soft limit past this hard one). */
        CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
        h_case_begin(&k, NULL);
        b = h_publish(k.by_prod, "hog/x", 4096, 9, NULL);
        for (int i = 0; i < HOGS; i++) {
                hogs[i] = h_raw_connect(k.broker);
                h_raw_hello(hogs[i]);
        }
        attach.buffer = unmap.buffer = gpuipc_buffer_id(b);
        attach.has = unmap.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID) | PROTO_BIT(PF_BUFFER);
        /* Each hog pipelines attach (the reply carries the fd) and unmap (so the next attach carries
         * it again) and reads nothing; a hog the broker hung up on keeps its socket open, and with it
         * every fd it did not read. Meanwhile an ordinary consumer attaches on a new connection each
         * time (so its fd travels too) and must be served every time. */
        for (int round = 0; round < ROUNDS; round++) {
                int open_hogs = 0;

                for (int i = 0; i < HOGS; i++) {
                        if (dropped[i])
                                continue;
                        attach.id = ++id;
                        unmap.id = ++id;
                        if (h_raw_send_msg(hogs[i], &attach, 0, NULL, 0) < 0 ||
                            h_raw_send_msg(hogs[i], &unmap, 0, NULL, 0) < 0)
                                dropped[i] = true;
                        else
                                open_hogs++;
                }
                if (round % VICTIM_EVERY == 0) {
                        gpuipc_t *c = h_connect(k.broker, "victim");
                        gpuipc_buffer_t *v = h_attach_verify(c, "hog/x", H_SOON_MS, 9);

                        CHECK_OK(c, gpuipc_release(c, v));
                        gpuipc_close(c);
                        victims++;
                        victims_while_hogs += open_hogs > 0;
                }
        }
        h_log("%d ordinary attaches served, %d of them while hogs were still sending", victims, victims_while_hogs);
        /* Every hog is dropped, each for itself, and told why before end-of-file. */
        WAIT_UNTIL(h_broker_log_count(k.broker, "dropping a peer that does not read") == HOGS, H_SOON_MS);
        for (int i = 0; i < HOGS; i++) {
                expect_drop_notice(hogs[i], "--max-queued-fds");
                close(hogs[i]);
        }
        CHECK_EQ(h_broker_log_count(k.broker, "send failed"), 0);
        h_bystander_check(&k);
        h_case_end(&k);
}

/* Puts at least `want` fds in flight for this process's uid, in a socket pair nobody reads, so that
 * the uid stays over its limit whatever other processes of the uid do meanwhile; stops early once
 * the kernel refuses (a sender without CAP_SYS_RESOURCE is over the limit then). Returns how many
 * are in flight; closing both ends of pair gives them back. */
static unsigned hold_fds_in_flight(int pair[2], unsigned want)
{
        enum { PER_MESSAGE = 16 }; /* h_raw_send's most */
        _cleanup_close_ int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        int fds[PER_MESSAGE];
        unsigned held = 0;
        char byte = 0;

        CHECK(fd >= 0);
        CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
        for (int i = 0; i < PER_MESSAGE; i++)
                fds[i] = fd;
        while (held < want) {
                int r = h_raw_send(pair[0], &byte, 1, fds, PER_MESSAGE);

                if (r == -ETOOMANYREFS)
                        break;
                CHECKF(r == 0, "passing fds to ourselves: %s", strerror(-r));
                held += PER_MESSAGE;
        }
        return held;
}

/* When more peers than the fd limit allows for leave fds unread (here 20 of them, 64 each, under a
 * limit of 1024), the kernel refuses further fds to anyone (ETOOMANYREFS). A consumer that reads
 * must then wait, not be dropped, and be served once the hogs let go of their fds. */
static int patient_victim(HChan *ch, void *arg)
{
        gpuipc_t *c = h_connect(arg, "patient-victim");
        gpuipc_buffer_t *v;

        h_report(ch, 'c', "connected");
        v = h_attach_verify(c, "hog/y", H_SOON_MS * 3, 11);
        CHECK_OK(c, gpuipc_release(c, v));
        gpuipc_close(c);
        h_report(ch, 'a', "attached");
        return 0;
}

/* When the kernel refuses to pass any more fds (too many in flight), the broker keeps the reply queued instead of
 * failing it, and delivers it once fds free up. */
static void test_inflight_fds_exhausted(void)
{
        enum { HOGS = 20 };
        const char *flags[] = { "--max-queued-fds", "64", NULL };
        const struct rlimit low = { 1024, 1024 };
        ProtoMsg attach = { .op = PROTO_OP_ATTACH }, unmap = { .op = PROTO_OP_UNMAP };
        int hogs[HOGS], open_hogs = HOGS, ballast[2];
        unsigned in_flight;
        bool dropped[HOGS] = { false };
        gpuipc_buffer_t *b;
        HChild *victim;
        uint64_t id = 10;
        HCase k;

        CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
        h_case_begin(&k, flags);
        b = h_publish(k.by_prod, "hog/y", 4096, 11, NULL);
        for (int i = 0; i < HOGS; i++) {
                hogs[i] = h_raw_connect(k.broker);
                h_raw_hello(hogs[i]);
        }
        attach.buffer = unmap.buffer = gpuipc_buffer_id(b);
        attach.has = unmap.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID) | PROTO_BIT(PF_BUFFER);
        while (open_hogs > 0) {
                for (int i = 0; i < HOGS; i++) {
                        if (dropped[i])
                                continue;
                        attach.id = ++id;
                        unmap.id = ++id;
                        if (h_raw_send_msg(hogs[i], &attach, 0, NULL, 0) < 0 ||
                            h_raw_send_msg(hogs[i], &unmap, 0, NULL, 0) < 0) {
                                dropped[i] = true;
                                open_hogs--;
                        }
                }
        }
        WAIT_UNTIL(h_broker_log_count(k.broker, "too many in flight") > 0, H_SOON_MS);
        /* The hogs are gone from the broker but still hold their fds. The kernel refused an fd when
         * the uid's count (the hogs' fds, and whatever other processes of the uid had in flight at
         * that moment) passed the limit; the hogs' share alone may lie just under it once those
         * others read theirs. So that the kernel refuses every fd for as long as this test says,
         * whatever else runs on the machine, the test itself keeps a limit's worth in flight too. */
        in_flight = hold_fds_in_flight(ballast, low.rlim_cur + 64);
        h_log("%u fds of our own in flight besides the hogs'", in_flight);
        victim = h_spawn("victim", patient_victim, k.broker);
        h_child_expect(victim, 'c', H_SOON_MS, NULL, 0);
        h_sleep_ms(300);
        CHECKF(h_child_quiet(victim), "the victim was answered while the kernel refused every fd");
        close(ballast[0]);
        close(ballast[1]);
        for (int i = 0; i < HOGS; i++)
                close(hogs[i]);
        h_child_expect(victim, 'a', H_SOON_MS, NULL, 0);
        h_child_wait_ok(victim, H_SOON_MS);
        h_child_free(victim);
        CHECK_EQ(h_broker_log_count(k.broker, "send failed"), 0);
        h_bystander_check(&k);
        h_case_end(&k);
}

/* ---- 10,000 connect/disconnect cycles ---- */

/* 10,000 connects and hang-ups (half after a hello) leak no fd and no memory in the broker, and bystanders are
 * served throughout. */
static void test_connect_churn(void)
{
        enum { CYCLES = 10000 };
        int fds_before;
        long rss;
        HCase k;

        h_case_begin(&k, NULL);
        fds_before = h_broker_fds(k.broker);
        rss = h_broker_rss_kb(k.broker);
        for (int i = 0; i < CYCLES; i++) {
                int sock = h_raw_connect(k.broker);

                /* Half of them say hello first, the rest hang up straight away. */
                if (i % 2)
                        h_raw_hello(sock);
                close(sock);
                if (i % 1000 == 999)
                        h_bystander_check(&k);
        }
        h_bystander_check(&k);
        WAIT_UNTIL(h_stats(k.obs, "connections_total") >= CYCLES, H_SOON_MS * 4);
        WAIT_UNTIL(h_broker_fds(k.broker) <= fds_before, H_SOON_MS);
        check_rss_bounded(k.broker, rss, "10,000 connect/disconnect cycles");
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_uid_without_permission), H_TEST(test_request_flood),
                H_TEST(test_frame_with_many_fds),    H_TEST(test_subscriber_never_reads),
                H_TEST(test_connect_churn),          H_TEST(test_queued_fds_bounded),
                H_TEST(test_inflight_fds_hogs),      H_TEST(test_inflight_fds_exhausted),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
