/* The memory budget (--memory-budget, docs/operations.md "Sizing the memory budget"): one uid
 * attacks a broker with a small budget from many connections, every per-connection limit respected,
 * and what does not fit is refused with quota, peers that do not read are dropped, the broker stays
 * up and serves, its resident memory stays bounded, and it falls again once the attackers are gone.
 *   - subscribers that never read, and a producer publishing and retiring under their prefix;
 *   - attach waits, group joins, pending reclaims and buffers with the largest metadata, all under
 *     names of the longest length. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "macro.h"

#define BUDGET "8M"         /* each uid's share: a quarter (2 MiB), half of it to hold, half to queue */
#define ATTACKERS 48
#define RSS_LIMIT_KB (32 * 1024) /* the budget, and room for the broker's own memory */
#define RSS_KEPT_KB (4 * 1024)   /* what the allocator may keep of it once the attackers are gone */

/* The largest resident set seen so far, sampled now. */
static long rss_peak_kb;

static void sample_rss(const HBroker *b)
{
        long kb = h_broker_rss_kb(b);

        if (kb > rss_peak_kb)
                rss_peak_kb = kb;
}

/* The attack's peak stayed under the bound, and once the attackers are gone the broker gave what it
 * grew by back to the system (within what its allocator may keep: RSS_KEPT_KB). */
static void check_rss(const HBroker *b, long before)
{
        long after;

        /* Freed memory goes back after a burst of frees: wait for it rather than sleep. */
        for (int i = 0; i < 500 && (after = h_broker_rss_kb(b)) > before + RSS_KEPT_KB; i++)
                h_sleep_ms(10);
        h_log("broker RSS %ld kB before, %ld kB at the peak, %ld kB after", before, rss_peak_kb, after);
        if (!h_broker_rss_meaningful()) {
                h_log("a wrapper or sanitizer runs the broker: its RSS is not checked");
                return;
        }
        CHECKF(rss_peak_kb < RSS_LIMIT_KB, "the broker grew to %ld kB under a budget of " BUDGET, rss_peak_kb);
        CHECKF(after <= before + RSS_KEPT_KB,
               "the broker kept %ld kB of the %ld kB it grew by after the attackers left", after - before,
               rss_peak_kb - before);
}

/* A refusal by the budget: quota, and its text names the flag. */
static void check_budget_refusal(const HFrame *f)
{
        CHECKF(f->msg.status == PROTO_STATUS_QUOTA, "%s where quota was expected: %.*s",
               proto_status_name((unsigned)f->msg.status), (int)f->msg.message.len, f->msg.message.ptr);
        CHECKF(memmem(f->msg.message.ptr, f->msg.message.len, "--memory-budget", 15),
               "a quota refusal that does not name the budget: %.*s", (int)f->msg.message.len,
               f->msg.message.ptr);
}

/* A connection of the attacking uid that said hello, or -1 when the broker refused it (the budget:
 * its uid's share has no room for one more connection). */
static int attacker(const HBroker *b, unsigned *refused)
{
        ProtoMsg hello = { .op = PROTO_OP_HELLO, .version = PROTO_VERSION, .pid = (uint64_t)getpid() };
        HFrame *f = h_frame_new();
        int sock = h_raw_connect(b), r;

        hello.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_VERSION) | PROTO_BIT(PF_PID);
        /* A refused connection gets its refusal and end-of-file, whether the hello went out or not; a
         * hello the broker did not read makes the kernel report a reset once, before the refusal
         * (docs/protocol.md section 4). */
        (void)h_raw_send_msg(sock, &hello, 0, NULL, 0);
        r = h_raw_recv(sock, H_SOON_MS, f);
        if (r == 0)
                r = h_raw_recv(sock, H_SOON_MS, f);
        CHECK_EQ(r, 1);
        if (f->msg.status != PROTO_STATUS_OK) {
                check_budget_refusal(f);
                (*refused)++;
                close(sock);
                sock = -1;
        }
        h_frame_free(f);
        return sock;
}

/* Closes the attackers' connections and waits until the broker let them go: what it charged them
 * is all given back (held is what the case's own peers keep, held0), and nothing is queued. */
static void close_attackers(HCase *k, int *socks, int n, uint64_t held0)
{
        for (int i = 0; i < n; i++)
                if (socks[i] >= 0)
                        socks[i] = safe_close(socks[i]);
        WAIT_UNTIL(h_stats(k->obs, "peers") == 3, H_SOON_MS); /* the observer and the bystander's two */
        CHECK_EQ(h_stats(k->obs, "memory_held_bytes"), held0);
        CHECK_EQ(h_stats(k->obs, "memory_output_bytes"), 0);
}

/* ---- subscribers that never read ---- */

/* 48 connections of one uid, each with the 64 subscriptions --max-subs-per-peer lets it have, read
 * nothing, while a producer publishes and retires under their prefix: the subscriptions past the
 * uid's share are refused, the silent subscribers are dropped once their unread events pass it,
 * and the broker stays up, bounded, and gives the memory back. */
static void test_subscribers_never_read(void)
{
        static const char *const flags[] = { "--memory-budget", BUDGET, NULL };
        ProtoMsg sub = { .op = PROTO_OP_SUBSCRIBE, .prefix = proto_str("attack/") };
        static int socks[ATTACKERS];
        HFrame *f = h_frame_new();
        unsigned ok = 0, refused = 0, conns_refused = 0;
        uint64_t held0;
        gpuipc_buffer_t *b;
        gpuipc_t *prod;
        long before;
        HCase k;

        h_case_begin(&k, flags);
        held0 = h_stats(k.obs, "memory_held_bytes");
        /* The producer's buffer is registered before the attack: publishing it again costs nothing new. */
        prod = h_connect(k.broker, "producer");
        CHECK_OK(prod, gpuipc_buffer_alloc(prod, GPUIPC_KIND_MEMFD, 4096, 0, &b));
        CHECK_OK(prod, gpuipc_publish(prod, b, "attack/frame", NULL));
        CHECK_OK(prod, gpuipc_retire(prod, b));
        CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
        before = rss_peak_kb = h_broker_rss_kb(k.broker);

        sub.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_PREFIX);
        for (int i = 0; i < ATTACKERS; i++) {
                socks[i] = attacker(k.broker, &conns_refused);
                for (int j = 0; socks[i] >= 0 && j < 64; j++) {
                        sub.has &= ~PROTO_BIT(PF_ID);
                        if (h_raw_call(socks[i], &sub, -1, f) == PROTO_STATUS_OK) {
                                ok++;
                        } else {
                                check_budget_refusal(f);
                                refused++;
                        }
                }
        }
        h_log("%u subscriptions taken, %u refused by the budget; %u connections refused", ok, refused,
              conns_refused);
        CHECK(ok > 0);
        CHECK(refused > 0);
        sample_rss(k.broker);

        /* Every publish and retire is an event for each subscription; none is read. */
        for (int i = 0; i < 60; i++) {
                CHECK_OK(prod, gpuipc_publish(prod, b, "attack/frame", NULL));
                CHECK_OK(prod, gpuipc_retire(prod, b));
                CHECK_OK(prod, gpuipc_wait_drained(prod, b, H_SOON_MS));
                sample_rss(k.broker);
        }
        /* The silent subscribers went once their uid's unread events passed its share. */
        CHECK(h_stats(k.obs, "slow_peers_dropped_total") > 0);
        CHECK(h_broker_log_count(k.broker, "memory-budget") > 0);
        CHECK_OK(k.obs, gpuipc_ping(k.obs, H_SOON_MS));
        sample_rss(k.broker);

        CHECK_OK(prod, gpuipc_buffer_free(prod, b));
        gpuipc_close(prod);
        close_attackers(&k, socks, ATTACKERS, held0);
        CHECK(h_stats(k.obs, "memory_refused_total") > 0);
        check_rss(k.broker, before);
        h_frame_free(f);
        h_case_end(&k);
}

/* ---- waits, groups and claims under the longest names ---- */

/* A name of the longest length, numbered. */
static ProtoStr long_name(char *buf, const char *kind, int conn, int i)
{
        int n = snprintf(buf, PROTO_MAX_NAME + 1, "%s/%d/%d/", kind, conn, i);

        memset(buf + n, 'x', (size_t)(PROTO_MAX_NAME - n));
        buf[PROTO_MAX_NAME] = 0;
        return proto_str(buf);
}

/* Sends n requests that wait (their replies come later, or never), then a ping: a reply before the
 * ping's is a refusal. Returns how many were refused (each checked to be the budget's). */
static unsigned send_waiting(int sock, ProtoMsg *reqs, int n, HFrame *f)
{
        ProtoMsg ping = { .op = PROTO_OP_PING, .has = PROTO_BIT(PF_OP) };
        unsigned refused = 0;

        for (int i = 0; i < n; i++)
                CHECK_EQ(h_raw_send_msg(sock, &reqs[i], 0, NULL, 0), 0);
        CHECK_EQ(h_raw_send_msg(sock, &ping, 0, NULL, 0), 0);
        for (;;) {
                CHECK_EQ(h_raw_recv(sock, H_SOON_MS, f), 1);
                if (f->msg.type != PROTO_REPLY)
                        continue;
                if (f->msg.reply == ping.id)
                        return refused;
                check_budget_refusal(f);
                refused++;
        }
}

/* An attach wait (kind 0) or a group join (kind 1) under a name of the longest length (in buf) that
 * waits for ten minutes. */
static void waiting_request(ProtoMsg *m, int kind, char *buf, int conn, int i)
{
        if (kind == 0) {
                *m = (ProtoMsg){ .op = PROTO_OP_ATTACH, .timeout_ms = 600000, .name = long_name(buf, "wait", conn, i) };
                m->has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_TIMEOUT_MS);
        } else {
                *m = (ProtoMsg){ .op = PROTO_OP_GROUP_JOIN, .members = 2, .timeout_ms = 600000,
                                 .group = long_name(buf, "group", conn, i) };
                m->has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_GROUP) | PROTO_BIT(PF_MEMBERS) | PROTO_BIT(PF_TIMEOUT_MS);
        }
}

/* Reclaims one reference on a buffer nobody registered, under a name of the longest length (in
 * buf): 0 when it waits for its producer (pending), 1 when the budget refused it. */
static unsigned reclaim(int sock, uint64_t buffer, char *buf, HFrame *f)
{
        ProtoMsg m;

        proto_request_init(&m, PROTO_OP_RECLAIM);
        proto_set_id(&m, buffer);
        proto_set_buffer(&m, buffer);
        proto_set_generation(&m, 1);
        proto_set_refs(&m, 1);
        proto_set_uid(&m, getuid());
        proto_set_name(&m, long_name(buf, "claim", (int)(buffer / 100000), (int)(buffer % 100000)));
        proto_set_kind(&m, PROTO_KIND_MEMFD);
        if (h_raw_call(sock, &m, -1, f) == PROTO_STATUS_OK) {
                CHECK(f->msg.pending);
                return 0;
        }
        check_budget_refusal(f);
        return 1;
}

/* One producer publishes buffers with the longest names and the largest metadata until its uid's
 * share is full: the publish past it is refused with quota, and freeing them makes room again. */
static void publish_until_refused(HCase *k, uint64_t held0)
{
        static unsigned char meta[PROTO_MAX_META];
        static gpuipc_buffer_t *bufs[2000];
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .meta = meta };
        char name[PROTO_MAX_NAME + 1];
        gpuipc_t *prod = h_connect(k->broker, "producer");
        int n, r = 0;

        po.meta_len = h_largest_meta(meta);
        for (n = 0; n < 2000; n++) {
                CHECK_OK(prod, gpuipc_buffer_alloc(prod, GPUIPC_KIND_MEMFD, 4096, 0, &bufs[n]));
                r = gpuipc_publish(prod, bufs[n], long_name(name, "buffer", 0, n).ptr, &po);
                if (r < 0)
                        break;
                sample_rss(k->broker);
        }
        h_log("buffers: %d published before the budget refused one", n);
        CHECK_ERR(prod, r, GPUIPC_E_QUOTA);
        CHECKF(strstr(gpuipc_errmsg(prod), "--memory-budget"), "the refusal does not name the budget: %s",
               gpuipc_errmsg(prod));
        CHECK_OK(prod, gpuipc_buffer_free(prod, bufs[n]));
        while (n-- > 0)
                CHECK_OK(prod, gpuipc_buffer_free(prod, bufs[n]));
        gpuipc_close(prod);
        WAIT_UNTIL(h_stats(k->obs, "peers") == 3, H_SOON_MS);
        CHECK_EQ(h_stats(k->obs, "memory_held_bytes"), held0);
}

/* Connections of one uid each fill their --max-waits-per-peer with attach waits or group joins, or
 * ask to reclaim thousands of buffers during the restart grace, and a producer publishes buffers
 * with the largest metadata, all under names of 255 bytes: past the uid's share each is refused with
 * quota, and the broker stays up, bounded, and gives the memory back once they are gone. */
static void test_waits_groups_claims(void)
{
        static const char *const flags[] = { "--memory-budget", BUDGET, "--restart-grace-ms", "600000", NULL };
        static const char *const kinds[] = { "attach waits", "group joins", "reclaims" };
        static char names[64][PROTO_MAX_NAME + 1];
        static int socks[ATTACKERS];
        ProtoMsg reqs[64];
        HFrame *f = h_frame_new();
        uint64_t held0;
        long before;
        HCase k;

        h_case_begin(&k, flags);
        held0 = h_stats(k.obs, "memory_held_bytes");
        before = rss_peak_kb = h_broker_rss_kb(k.broker);
        for (int kind = 0; kind < 3; kind++) {
                unsigned refused = 0, conns_refused = 0;

                for (int c = 0; c < ATTACKERS; c++) {
                        socks[c] = attacker(k.broker, &conns_refused);
                        /* 256 waits per connection (its limit), 64 at a time. */
                        for (int batch = 0; socks[c] >= 0 && kind < 2 && batch < 4; batch++) {
                                for (int i = 0; i < 64; i++)
                                        waiting_request(&reqs[i], kind, names[i], c, batch * 64 + i);
                                refused += send_waiting(socks[c], reqs, 64, f);
                        }
                        /* Reclaims of buffers nobody registered wait for their producer until the grace ends. */
                        for (int i = 0; socks[c] >= 0 && kind == 2 && i < 1000; i++)
                                refused += reclaim(socks[c], (uint64_t)c * 100000 + (uint64_t)i + 1, names[0], f);
                        sample_rss(k.broker);
                }
                h_log("%s: %u refused by the budget, and %u connections", kinds[kind], refused, conns_refused);
                CHECK(refused > 0);
                /* Within its share, what a uid keeps still works: the observer is served. */
                CHECK_OK(k.obs, gpuipc_ping(k.obs, H_SOON_MS));
                CHECK(h_stats(k.obs, kind == 2 ? "claims_pending" : "waits") > 0);
                close_attackers(&k, socks, ATTACKERS, held0);
                CHECK_EQ(h_stats(k.obs, "waits"), 0);
                CHECK_EQ(h_stats(k.obs, "claims_pending"), 0);
        }
        publish_until_refused(&k, held0);
        check_rss(k.broker, before);
        h_frame_free(f);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_subscribers_never_read),
                H_TEST(test_waits_groups_claims),
        };

        return h_main(argc, argv, tests, ARRAY_SIZE(tests));
}
