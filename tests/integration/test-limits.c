/* Every request at its largest allowed size, against the real broker (under its seccomp filter in
 * the 'seccomp' suite, where the harness fails a case whose broker logged any call outside its
 * allow-list): the sweep of docs/security.md "The filter fails safe". A request path that only
 * big inputs take (glibc's qsort switching to a merge sort past 1 KiB, which asked the kernel for
 * sysinfo and got the broker killed by its own filter) shows up here, not in production.
 *   - a buffer with 1000 holders, one per connection: stat (paged, and by gpuipcctl), list, peers,
 *     stats, and a watcher that sees it retired and drained;
 *   - 2000 buffers with names of 255 bytes and metadata of 4096 bytes, listed page by page;
 *   - a ring of 64 slots with 64 members, listed and described. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "harness.h"

#define HOLDERS 1000
#define BUFFERS 2000

/* The case needs about n fds of its own: the soft limit is raised to the hard one, and a machine
 * whose hard limit is lower cannot run it. */
static void need_fds(rlim_t n)
{
        struct rlimit rl;

        CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < n)
                h_skip("needs %llu fds; the hard RLIMIT_NOFILE is %llu", (unsigned long long)n,
                       (unsigned long long)rl.rlim_max);
        rl.rlim_cur = rl.rlim_max;
        CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
}

/* stat over one raw connection, page after page: every holder once, in increasing peer order. */
static unsigned stat_all_holders(int sock, uint64_t buffer, uint32_t page)
{
        HFrame *f = h_frame_new();
        uint64_t after = 0, last = 0;
        unsigned seen = 0;
        bool more = true;

        while (more) {
                ProtoMsg stat = { .op = PROTO_OP_STAT, .buffer = buffer, .after = after, .limit = page };
                ProtoIter it;
                ProtoMsg rec;
                unsigned n = 0;

                stat.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER) | PROTO_BIT(PF_AFTER) | PROTO_BIT(PF_LIMIT);
                CHECK_EQ(h_raw_call(sock, &stat, -1, f), PROTO_STATUS_OK);
                proto_iter_init(&it, &f->msg.items);
                while (proto_iter_next(&it, &rec) == 1) {
                        CHECKF(rec.peer > last, "holders out of order or repeated: %llu after %llu",
                               (unsigned long long)rec.peer, (unsigned long long)last);
                        CHECK_EQ(rec.refs, 1);
                        last = rec.peer;
                        n++;
                }
                CHECK(n <= page);
                more = f->msg.more;
                after = f->msg.after;
                seen += n;
        }
        h_frame_free(f);
        return seen;
}

static unsigned count_peers(gpuipc_t *c)
{
        static gpuipc_peer_info_t items[64];
        uint64_t cursor = 0;
        unsigned n = 0;
        int r;

        do {
                r = gpuipc_list_peers(c, &cursor, items, 64);
                CHECK_OK(c, r);
                n += (unsigned)r;
        } while (cursor);
        return n;
}

/* A buffer held by 1000 connections can be described, listed and watched, by the library and by
 * gpuipcctl, and the broker stays up (it died at 43 holders: issue 18). */
static void test_thousand_holders(void)
{
        static int socks[HOLDERS];
        gpuipc_holder_info_t holders[GPUIPC_MAX_PAGE];
        gpuipc_buffer_info_t info, listed[8];
        gpuipc_stat_t stats[512];
        gpuipc_t *producer, *watcher;
        gpuipc_buffer_t *b;
        gpuipc_event_t ev;
        HFrame *f = h_frame_new();
        uint64_t sub, cursor = 0;
        HChild *ctl;
        HCase k;
        int n, sock;

        need_fds(HOLDERS + 256);
        h_case_begin(&k, NULL);
        producer = h_connect(k.broker, "producer");
        watcher = h_connect(k.broker, "watcher");
        CHECK_OK(watcher, gpuipc_subscribe(watcher, "limits/", &sub));
        b = h_publish(producer, "limits/held", 4096, 5, NULL);
        CHECK_OK(watcher, h_next_event_of(watcher, GPUIPC_EVENT_PUBLISHED, H_SOON_MS, &ev));
        for (int i = 0; i < HOLDERS; i++) {
                ProtoMsg attach = { .op = PROTO_OP_ATTACH, .buffer = gpuipc_buffer_id(b) };

                socks[i] = h_raw_connect(k.broker);
                h_raw_hello(socks[i]);
                attach.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER);
                CHECK_EQ(h_raw_call(socks[i], &attach, -1, f), PROTO_STATUS_OK);
        }
        h_log("%d holders attached", HOLDERS);

        /* stat: every holder, in pages of every size up to the largest. */
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        CHECK_EQ(stat_all_holders(sock, gpuipc_buffer_id(b), GPUIPC_MAX_PAGE), HOLDERS);
        CHECK_EQ(stat_all_holders(sock, gpuipc_buffer_id(b), 7), HOLDERS);
        close(sock);
        n = gpuipc_stat_buffer(watcher, "limits/held", 0, holders, GPUIPC_MAX_PAGE, &info);
        CHECK_OK(watcher, n);
        CHECK_EQ(info.holders, HOLDERS);
        CHECK_EQ(info.refs, HOLDERS);
        CHECK(n > 0 && n <= GPUIPC_MAX_PAGE);

        /* What an operator runs by hand. */
        if (*h_ctl_path()) {
                ctl = h_spawn_ctl(k.broker, "ctl-stat", "stat", "limits/held", NULL);
                h_child_wait_ok(ctl, H_SOON_MS);
                h_child_free(ctl);
        }

        /* list, peers, stats. */
        n = gpuipc_list_buffers(watcher, "limits/", &cursor, listed, 8);
        CHECK_OK(watcher, n);
        CHECK_EQ(n, 1);
        CHECK_EQ(listed[0].refs, HOLDERS);
        CHECK(count_peers(watcher) >= HOLDERS + 2);
        n = gpuipc_stats(watcher, stats, sizeof(stats) / sizeof(stats[0]));
        CHECK_OK(watcher, n);
        CHECK(n > 10);

        /* watch: retired now, drained once the last of the 1000 let go. */
        CHECK_OK(producer, gpuipc_retire(producer, b));
        CHECK_OK(watcher, h_next_event_of(watcher, GPUIPC_EVENT_RETIRED, H_SOON_MS, &ev));
        for (int i = 0; i < HOLDERS; i++)
                close(socks[i]);
        CHECK_OK(producer, gpuipc_wait_drained(producer, b, H_SOON_MS));
        CHECK_OK(watcher, h_next_event_of(watcher, GPUIPC_EVENT_DRAINED, H_SOON_MS, &ev));
        CHECK_EQ(ev.buffer, gpuipc_buffer_id(b));
        CHECK_OK(producer, gpuipc_buffer_free(producer, b));
        h_frame_free(f);
        gpuipc_close(watcher);
        gpuipc_close(producer);
        h_case_end(&k);
}

/* 2000 buffers with the longest names and the largest metadata: every one listed once, in pages
 * (a reply stays within its frame however large its records are). */
static void test_thousands_of_buffers(void)
{
        static unsigned char meta[PROTO_MAX_META];
        static gpuipc_buffer_t *bufs[BUFFERS];
        static unsigned char seen[BUFFERS];
        gpuipc_publish_options_t po = { .struct_size = sizeof(po) };
        gpuipc_buffer_info_t items[GPUIPC_MAX_PAGE];
        char name[PROTO_MAX_NAME + 1];
        uint64_t cursor = 0;
        unsigned total = 0, pages = 0;
        gpuipc_t *producer;
        HCase k;
        int n;

        need_fds(BUFFERS + 256);
        h_case_begin(&k, NULL);
        producer = h_connect(k.broker, "producer");
        po.meta = meta;
        po.meta_len = h_largest_meta(meta);
        for (int i = 0; i < BUFFERS; i++) {
                int len = snprintf(name, sizeof(name), "limits/%0*d", PROTO_MAX_NAME - 7, i);

                CHECK_EQ(len, PROTO_MAX_NAME);
                bufs[i] = h_publish(producer, name, 4096, (uint64_t)i + 1, &po);
        }
        do {
                n = gpuipc_list_buffers(k.obs, "limits/", &cursor, items, GPUIPC_MAX_PAGE);
                CHECK_OK(k.obs, n);
                pages++;
                for (int i = 0; i < n; i++) {
                        int idx = atoi(items[i].name + PROTO_MAX_NAME - 6);

                        CHECK_EQ(strlen(items[i].name), PROTO_MAX_NAME);
                        CHECK(idx >= 0 && idx < BUFFERS);
                        CHECK_EQ(seen[idx]++, 0);
                        total++;
                }
        } while (cursor);
        CHECK_EQ(total, BUFFERS);
        CHECK(pages > 1);
        h_log("%u buffers listed in %u pages", total, pages);
        for (int i = 0; i < BUFFERS; i++) {
                CHECK_OK(producer, gpuipc_retire(producer, bufs[i]));
                CHECK_OK(producer, gpuipc_buffer_free(producer, bufs[i]));
        }
        gpuipc_close(producer);
        h_case_end(&k);
}

typedef struct Members {
        const HBroker *broker;
        unsigned n;
} Members;

/* Joins the ring with n connections of its own, reports 'j', waits for 'x'. */
static int join_all(HChan *ch, void *arg)
{
        const Members *a = arg;
        static gpuipc_t *c[GPUIPC_RING_MAX_MEMBERS];
        static gpuipc_ring_t *r[GPUIPC_RING_MAX_MEMBERS];

        need_fds(a->n * (GPUIPC_RING_MAX_SLOTS + 8) + 256);
        for (unsigned i = 0; i < a->n; i++) {
                c[i] = h_connect(a->broker, "member");
                CHECK_OK(c[i], gpuipc_ring_join(c[i], "limits/ring", H_SOON_MS, &r[i]));
        }
        h_report(ch, 'j', "%u joined", a->n);
        h_await(ch, 'x', H_SOON_MS * 3);
        for (unsigned i = 0; i < a->n; i++) {
                gpuipc_ring_close(r[i]);
                gpuipc_close(c[i]);
        }
        return 0;
}

/* A ring of the most slots with every seat taken is listed and described whole. */
static void test_ring_at_limits(void)
{
        gpuipc_ring_options_t o = { .struct_size = sizeof(o), .slot_size = 4096,
                                    .slots = GPUIPC_RING_MAX_SLOTS, .max_members = GPUIPC_RING_MAX_MEMBERS,
                                    .lease_ms = 60000 };
        gpuipc_ring_member_info_t seats[GPUIPC_RING_MAX_MEMBERS];
        Members m = { .n = GPUIPC_RING_MAX_MEMBERS };
        gpuipc_ring_info_t rings[4], info;
        gpuipc_t *producer;
        gpuipc_ring_t *ring;
        uint64_t cursor = 0;
        char text[64];
        HChild *kid;
        HCase k;
        int n;

        need_fds(GPUIPC_RING_MAX_SLOTS * 4 + 256);
        h_case_begin(&k, NULL);
        m.broker = k.broker;
        producer = h_connect(k.broker, "producer");
        CHECK_OK(producer, gpuipc_ring_create(producer, "limits/ring", &o, &ring));
        kid = h_spawn("members", join_all, &m);
        /* The producer seats each member at its next call. */
        while (h_child_quiet(kid))
                CHECK_OK(producer, gpuipc_process(producer));
        h_child_expect(kid, 'j', H_SOON_MS, text, sizeof(text));
        n = gpuipc_list_rings(k.obs, "limits/", &cursor, rings, 4);
        CHECK_OK(k.obs, n);
        CHECK_EQ(n, 1);
        CHECK_EQ(rings[0].taken, GPUIPC_RING_MAX_MEMBERS);
        CHECK_EQ(rings[0].slots, GPUIPC_RING_MAX_SLOTS);
        n = gpuipc_stat_ring(k.obs, "limits/ring", seats, GPUIPC_RING_MAX_MEMBERS, &info);
        CHECK_OK(k.obs, n);
        CHECK_EQ(n, GPUIPC_RING_MAX_MEMBERS);
        for (int i = 0; i < n; i++)
                CHECK_EQ(seats[i].seat, (unsigned)i);
        h_child_tell(kid, 'x');
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        gpuipc_ring_close(ring);
        gpuipc_close(producer);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_thousand_holders),
                H_TEST(test_thousands_of_buffers),
                H_TEST(test_ring_at_limits),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
