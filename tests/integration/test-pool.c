/* Pools and views against the real broker: a view is published without a copy and without an fd of
 * its own (the segment's fd travels once per broker and per consumer), sub-allocation and export
 * caching, a range freed while published stays untouched until its views are gone, each view drains
 * on its own, nothing grows over 100 versions, a producer's death, a broker restart, and connections
 * abandoned (gpuipc_abandon) with their memory in use. The pool's
 * kind is $GPUIPC_TEST_POOL_KIND: memfd (the default; every CI run) or cuda-vmm (with the stand-in
 * libcuda as GPUIPC_LIBCUDA in CI, or a GPU). */
#include <dirent.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define MIB (1u << 20)
#define VERSIONS 100

static gpuipc_kind_t pool_kind(void)
{
        const char *k = getenv("GPUIPC_TEST_POOL_KIND");
        gpuipc_kind_t kind = GPUIPC_KIND_MEMFD;

        if (k && *k)
                CHECKF(gpuipc_kind_from_name(k, &kind) == 0, "GPUIPC_TEST_POOL_KIND=%s is no kind", k);
        return kind;
}

/* A connection that declares this process's GPUs (the harness's declare none): a cuda-vmm view's
 * consumer must see its device. */
static gpuipc_t *connect_to(const HBroker *b, const char *label, bool reconnect)
{
        gpuipc_options_t o = { .struct_size = sizeof(o), .socket_path = b->sock, .label = label,
                               .no_reconnect = !reconnect, .connect_timeout_ms = H_SOON_MS };
        gpuipc_t *c = NULL;
        int r = gpuipc_connect(&c, &o);

        CHECKF(r == 0, "connect to %s: %s [%s]", b->sock, gpuipc_strerror(r), gpuipc_errmsg(NULL));
        return c;
}

static gpuipc_pool_t *new_pool(gpuipc_t *c, size_t segment_size, size_t reserve)
{
        gpuipc_pool_options_t o = { .struct_size = sizeof(o), .kind = pool_kind(), .segment_size = segment_size,
                                    .reserve = reserve };
        gpuipc_pool_t *p = NULL;
        int r = gpuipc_pool_new(c, &o, &p);

        if (r == GPUIPC_E_NO_CUDA)
                h_skip("no CUDA for a cuda-vmm pool: %s", gpuipc_errmsg(c));
        CHECK_OK(c, r);
        return p;
}

static gpuipc_pool_stats_t stats_of(gpuipc_pool_t *p)
{
        gpuipc_pool_stats_t s;

        CHECK_EQ(gpuipc_pool_stats(p, &s), 0);
        return s;
}

/* Fills b with the pattern, whatever its kind (through the library's copy). */
static void fill(gpuipc_buffer_t *b, uint64_t seed)
{
        size_t n = gpuipc_buffer_size(b);
        uint8_t *tmp = malloc(n);

        CHECK(tmp);
        h_pattern_fill(tmp, n, seed);
        CHECK_EQ(gpuipc_buffer_write(b, 0, tmp, n), 0);
        free(tmp);
}

static void verify(const gpuipc_buffer_t *b, uint64_t seed)
{
        size_t n = gpuipc_buffer_size(b), at;
        uint8_t *tmp = malloc(n);

        CHECK(tmp);
        CHECK_EQ(gpuipc_buffer_read(b, 0, tmp, n), 0);
        at = h_pattern_check(tmp, n, seed);
        free(tmp);
        CHECKF(at == SIZE_MAX, "'%s' differs from pattern %" PRIu64 " at byte %zu", gpuipc_buffer_name(b), seed, at);
}

static unsigned count_entries(const char *dir)
{
        DIR *d = opendir(dir);
        struct dirent *de;
        unsigned n = 0;

        CHECK(d);
        while ((de = readdir(d)))
                n += de->d_name[0] != '.';
        closedir(d);
        return n;
}

/* Mappings of memfds in this process: every mapping of shared memory (memfd segments, and the
 * stand-in libcuda's device memory), none of the allocator's own (which ASan's grow). */
static unsigned count_memfd_maps(void)
{
        FILE *f = fopen("/proc/self/maps", "re");
        char line[512];
        unsigned n = 0;

        CHECK(f);
        while (fgets(line, sizeof(line), f))
                n += strstr(line, "/memfd:") != NULL;
        fclose(f);
        return n;
}

/* ---- a consumer process ---- */

typedef struct Follow {
        const HBroker *broker;
        unsigned versions;
} Follow;

/* Attaches "pv/N" for N = 0.. (each filled with pattern N + 1), verifies and releases it; reports the
 * segment of each and, after the second and the last version, its open fds and memfd mappings. */
static int follower(HChan *ch, void *arg)
{
        const Follow *a = arg;
        gpuipc_t *c = connect_to(a->broker, "follower", false);
        unsigned fds = 0, maps = 0;
        uint64_t segment = 0;

        for (unsigned v = 0; v < a->versions; v++) {
                char name[32];
                gpuipc_buffer_t *b;

                snprintf(name, sizeof(name), "pv/%u", v);
                CHECK_OK(c, gpuipc_attach(c, name, H_SOON_MS, &b));
                verify(b, v + 1);
                CHECK(gpuipc_buffer_segment(b) != 0);
                if (v == 0)
                        segment = gpuipc_buffer_segment(b);
                CHECK_EQ(gpuipc_buffer_segment(b), segment); /* the same mapping every time */
                CHECK_OK(c, gpuipc_release(c, b));
                if (v == 1) {
                        fds = count_entries("/proc/self/fd");
                        maps = count_memfd_maps();
                }
                h_report(ch, 'v', "%u", v);
        }
        h_report(ch, 'n', "%u %u %u %u", fds, count_entries("/proc/self/fd"), maps, count_memfd_maps());
        gpuipc_close(c);
        return 0;
}

/* ---- cases ---- */

/* Two views of one plain buffer: the broker holds one fd for both, a consumer maps the buffer once
 * (the second attach is cached: its view points into the same mapping) and reads each view's own
 * bytes; the buffer cannot be freed while its views exist. */
static void test_views_of_a_buffer(void)
{
        gpuipc_buffer_t *seg, *v1, *v2, *a1, *a2;
        gpuipc_t *prod, *cons;
        HCase k;
        int fds;

        h_case_begin(&k, NULL);
        prod = connect_to(k.broker, "producer", false);
        cons = connect_to(k.broker, "consumer", false);
        CHECK_OK(prod, gpuipc_buffer_alloc(prod, GPUIPC_KIND_MEMFD, 2 * MIB, 0, &seg));
        CHECK_OK(prod, gpuipc_buffer_view(prod, seg, 0, MIB, &v1));
        CHECK_OK(prod, gpuipc_buffer_view(prod, seg, MIB, MIB, &v2));
        CHECK_ERR(prod, gpuipc_buffer_view(prod, seg, MIB, MIB + 1, &a1), GPUIPC_E_INVALID);
        CHECK_ERR(prod, gpuipc_buffer_view(prod, v1, 0, 1, &a1), GPUIPC_E_INVALID);
        fill(v1, 11);
        fill(v2, 22);
        fds = h_broker_fds(k.broker);
        CHECK_OK(prod, gpuipc_publish(prod, v1, "views/a", NULL));
        CHECK_OK(prod, gpuipc_publish(prod, v2, "views/b", NULL));
        CHECK_EQ(h_broker_fds(k.broker), fds + 1);
        CHECK_EQ(gpuipc_buffer_segment(v1), gpuipc_buffer_id(seg));

        CHECK_OK(cons, gpuipc_attach(cons, "views/a", H_SOON_MS, &a1));
        CHECK_OK(cons, gpuipc_attach(cons, "views/b", H_SOON_MS, &a2));
        CHECK_EQ(h_stats(k.obs, "attaches_cached_total"), 1);
        CHECK_EQ(gpuipc_buffer_size(a1), MIB);
        CHECK_EQ(gpuipc_buffer_segment(a1), gpuipc_buffer_id(seg));
        CHECK((char *)gpuipc_buffer_ptr(a2) == (char *)gpuipc_buffer_ptr(a1) + MIB);
        verify(a1, 11);
        verify(a2, 22);

        /* Each view drains on its own. */
        CHECK_OK(prod, gpuipc_retire(prod, v1));
        CHECK_OK(cons, gpuipc_release(cons, a1));
        CHECK_OK(prod, gpuipc_wait_drained(prod, v1, H_SOON_MS));
        CHECK_ERR(prod, gpuipc_wait_drained(prod, v2, 0), GPUIPC_E_STATE); /* still published */
        CHECK_ERR(prod, gpuipc_buffer_free(prod, seg), GPUIPC_E_BUSY);
        CHECK_OK(prod, gpuipc_buffer_free(prod, v1));
        verify(a2, 22);
        CHECK_OK(cons, gpuipc_release(cons, a2));
        CHECK_OK(prod, gpuipc_buffer_free(prod, v2));
        CHECK_OK(prod, gpuipc_buffer_free(prod, seg));
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_case_end(&k);
}

/* Sub-allocation: aligned, disjoint ranges from few segments (each exported once, when made); an
 * allocation larger than a segment gets its own; freed ranges are handed out again; trim gives
 * empty segments back. */
static void test_pool_allocates(void)
{
        void *ptr[64], *big, *again;
        gpuipc_pool_stats_t st;
        gpuipc_pool_t *p;
        gpuipc_t *c;
        HCase k;

        h_case_begin(&k, NULL);
        c = connect_to(k.broker, "pool", false);
        p = new_pool(c, 4 * MIB, 0);
        CHECK_EQ(stats_of(p).segments, 0);
        for (int i = 0; i < 64; i++) {
                CHECK_OK(c, gpuipc_pool_alloc(p, 1000 + (size_t)i * 4096, &ptr[i]));
                CHECK_EQ((uintptr_t)ptr[i] % 512, 0);
                for (int j = 0; j < i; j++) {
                        uintptr_t a = (uintptr_t)ptr[i], b = (uintptr_t)ptr[j];
                        size_t na = 1000 + (size_t)i * 4096, nb = 1000 + (size_t)j * 4096;
                        CHECKF(a + na <= b || b + nb <= a, "allocations %d and %d overlap", i, j);
                }
        }
        st = stats_of(p);
        CHECK(st.segments >= 2 && st.segments <= 4); /* 8.3 MiB: 4 + 4 + 8 MiB at most */
        {
                void *bases[8];
                size_t sizes[8], total = 0;
                int n = gpuipc_pool_segments(p, bases, sizes, 8);

                CHECK_EQ((size_t)n, st.segments);
                for (int i = 0; i < n; i++) {
                        void *base = NULL;
                        size_t size = 0;

                        CHECK_OK(c, gpuipc_pool_segment(p, (char *)bases[i] + sizes[i] - 1, &base, &size));
                        CHECK(base == bases[i] && size == sizes[i]);
                        total += sizes[i];
                }
                CHECK_EQ(total, st.reserved);
        }
        CHECK_EQ(st.exports, st.segments);
        CHECK(st.allocated >= 64 * 1000);
        CHECK_OK(c, gpuipc_pool_alloc(p, 40 * MIB, &big));
        CHECK_EQ(stats_of(p).segments, st.segments + 1);
        CHECK_OK(c, gpuipc_pool_free(p, big));
        CHECK_ERR(c, gpuipc_pool_free(p, big), GPUIPC_E_INVALID);
        CHECK_ERR(c, gpuipc_pool_free(p, (char *)ptr[3] + 512), GPUIPC_E_INVALID);
        /* A freed range serves the next allocation that fits: no new segment, no new export. */
        CHECK_OK(c, gpuipc_pool_free(p, ptr[10]));
        CHECK_OK(c, gpuipc_pool_alloc(p, 1000 + 10 * 4096, &again));
        CHECK(again == ptr[10]);
        CHECK_EQ(stats_of(p).exports, st.segments + 1);
        /* trim: only the empty 40 MiB segment goes. */
        CHECK_OK(c, gpuipc_pool_trim(p));
        CHECK_EQ(stats_of(p).segments, st.segments);
        for (int i = 0; i < 64; i++)
                CHECK_OK(c, gpuipc_pool_free(p, ptr[i]));
        CHECK_EQ(stats_of(p).allocated, 0);
        CHECK_OK(c, gpuipc_pool_trim(p));
        CHECK_EQ(stats_of(p).segments, 0);
        CHECK_EQ(stats_of(p).reserved, 0);
        CHECK_OK(c, gpuipc_pool_close(p));
        gpuipc_close(c);
        h_case_end(&k);
}

/* 100 versions, each a new allocation published as a view and freed once drained: one segment, one
 * export, the broker's fds flat, and the consumer's fds and mappings flat (it mapped the segment once;
 * every later version is a view into that mapping). */
static void test_versions_flat(void)
{
        Follow arg;
        HChild *kid;
        gpuipc_pool_t *p;
        gpuipc_t *c;
        unsigned fds1, fdsN, maps1, mapsN;
        char text[128];
        int broker_fds = -1;
        HCase k;

        h_case_begin(&k, NULL);
        c = connect_to(k.broker, "producer", false);
        p = new_pool(c, 8 * MIB, 0);
        arg = (Follow){ k.broker, VERSIONS };
        kid = h_spawn("follower", follower, &arg);
        for (unsigned v = 0; v < VERSIONS; v++) {
                gpuipc_publish_options_t o = { .struct_size = sizeof(o), .retire_after = 1 };
                gpuipc_buffer_t *view;
                char name[32];
                void *ptr;

                CHECK_OK(c, gpuipc_pool_alloc(p, MIB + v * 512, &ptr));
                CHECK_OK(c, gpuipc_pool_view(p, ptr, MIB + v * 512, &view));
                fill(view, v + 1);
                snprintf(name, sizeof(name), "pv/%u", v);
                CHECK_OK(c, gpuipc_publish(c, view, name, &o));
                h_child_expect(kid, 'v', H_SOON_MS, NULL, 0);
                CHECK_OK(c, gpuipc_wait_drained(c, view, H_SOON_MS));
                CHECK_OK(c, gpuipc_buffer_free(c, view));
                CHECK_OK(c, gpuipc_pool_free(p, ptr));
                if (v == 1)
                        broker_fds = h_broker_fds(k.broker);
                /* One fd for the segment, held since v0. Checked while the follower still waits for
                 * the last version: after it, the follower may be closing its connection. */
                if (v == VERSIONS - 2)
                        CHECK_EQ(h_broker_fds(k.broker), broker_fds);
        }
        h_child_expect(kid, 'n', H_SOON_MS, text, sizeof(text));
        CHECK(sscanf(text, "%u %u %u %u", &fds1, &fdsN, &maps1, &mapsN) == 4);
        h_log("consumer fds %u -> %u, mappings %u -> %u", fds1, fdsN, maps1, mapsN);
        CHECK_EQ(fdsN, fds1);
        CHECK(maps1 > 0);
        CHECK_EQ(mapsN, maps1); /* the segment, mapped once: no mapping per version */
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        CHECK_EQ(stats_of(p).segments, 1);
        CHECK_EQ(stats_of(p).exports, 1);
        CHECK_EQ(stats_of(p).views, 0);
        CHECK_OK(c, gpuipc_pool_close(p));
        gpuipc_close(c);
        h_case_end(&k);
}

/* A range freed while a consumer holds its view is not handed out again (a new allocation gets other
 * memory, the consumer's bytes stay) until the view drained and was freed; then it is reused. */
static void test_free_while_published(void)
{
        gpuipc_buffer_t *view, *held;
        gpuipc_pool_t *p;
        gpuipc_t *c, *cons;
        void *a, *b, *again;
        HCase k;

        h_case_begin(&k, NULL);
        c = connect_to(k.broker, "producer", false);
        cons = connect_to(k.broker, "consumer", false);
        p = new_pool(c, 8 * MIB, 0);
        CHECK_OK(c, gpuipc_pool_alloc(p, MIB, &a));
        CHECK_OK(c, gpuipc_pool_view(p, a, MIB, &view));
        fill(view, 5);
        CHECK_OK(c, gpuipc_publish(c, view, "free/while", NULL));
        CHECK_OK(cons, gpuipc_attach(cons, "free/while", H_SOON_MS, &held));
        CHECK_OK(c, gpuipc_pool_free(p, a));
        CHECK_EQ(stats_of(p).deferred, MIB);
        CHECK_EQ(stats_of(p).allocated, 0);
        CHECK_OK(c, gpuipc_pool_alloc(p, MIB, &b));
        CHECK(b != a);
        /* The new owner of other memory writes; the held bytes do not change. */
        {
                gpuipc_buffer_t *w;
                CHECK_OK(c, gpuipc_pool_view(p, b, MIB, &w));
                fill(w, 6);
                CHECK_OK(c, gpuipc_buffer_free(c, w));
        }
        verify(held, 5);
        /* Views of freed memory are refused. */
        CHECK_ERR(c, gpuipc_pool_view(p, a, MIB, &held), GPUIPC_E_INVALID);
        CHECK_ERR(c, gpuipc_pool_close(p), GPUIPC_E_BUSY);
        CHECK_OK(c, gpuipc_retire(c, view));
        CHECK_EQ(stats_of(p).deferred, MIB); /* retired, still held */
        CHECK_OK(cons, gpuipc_release(cons, held));
        CHECK_OK(c, gpuipc_wait_drained(c, view, H_SOON_MS));
        /* Drained: nobody can hold it, so the range is free (the view itself may stay, idle). */
        CHECK_EQ(stats_of(p).deferred, 0);
        /* ... and an idle view of memory freed since is not published again. */
        CHECK_ERR(c, gpuipc_publish(c, view, "free/again", NULL), GPUIPC_E_INVALID);
        CHECK_OK(c, gpuipc_pool_alloc(p, MIB, &again));
        CHECK(again == a);
        CHECK_OK(c, gpuipc_publish(c, view, "free/again", NULL)); /* allocated again: it may */
        CHECK_OK(c, gpuipc_retire(c, view));
        CHECK_OK(c, gpuipc_buffer_free(c, view));
        CHECK_OK(c, gpuipc_pool_close(p));
        gpuipc_close(cons);
        gpuipc_close(c);
        h_case_end(&k);
}

/* What a view of a pool cannot be: outside the pool, across two segments, starting in memory not
 * allocated. */
static void test_view_errors(void)
{
        gpuipc_buffer_t *v;
        gpuipc_pool_t *p;
        gpuipc_t *c;
        void *a, *b;
        HCase k;

        h_case_begin(&k, NULL);
        c = connect_to(k.broker, "producer", false);
        p = new_pool(c, 2 * MIB, 0);
        CHECK_OK(c, gpuipc_pool_alloc(p, 2 * MIB, &a)); /* fills the first segment */
        CHECK_OK(c, gpuipc_pool_alloc(p, 2 * MIB, &b)); /* a second one */
        CHECK_ERR(c, gpuipc_pool_view(p, (char *)a + MIB, 2 * MIB, &v), GPUIPC_E_INVALID);
        CHECKF(strstr(gpuipc_errmsg(c), "spans two segments"), "%s", gpuipc_errmsg(c));
        CHECK_ERR(c, gpuipc_pool_view(p, &v, 8, &v), GPUIPC_E_NOT_FOUND);
        CHECK_OK(c, gpuipc_pool_free(p, b));
        CHECK_ERR(c, gpuipc_pool_view(p, b, 8, &v), GPUIPC_E_INVALID);
        CHECKF(strstr(gpuipc_errmsg(c), "does not start in memory the pool handed out"), "%s", gpuipc_errmsg(c));
        CHECK_OK(c, gpuipc_pool_view(p, (char *)a + 512, 4096, &v));
        CHECK_OK(c, gpuipc_buffer_free(c, v));
        CHECK_OK(c, gpuipc_pool_close(p));
        gpuipc_close(c);
        h_case_end(&k);
}

typedef struct Holder {
        const HBroker *broker;
} Holder;

/* Attaches "death/a" and "death/b" (views of one pool segment), reports, then waits for both to
 * be revoked while the bytes stay readable in its mapping. */
static int holder(HChan *ch, void *arg)
{
        const Holder *a = arg;
        gpuipc_t *c = connect_to(a->broker, "holder", false);
        gpuipc_buffer_t *x, *y;
        gpuipc_event_t ev;
        int revoked = 0;

        CHECK_OK(c, gpuipc_attach(c, "death/a", H_SOON_MS, &x));
        CHECK_OK(c, gpuipc_attach(c, "death/b", H_SOON_MS, &y));
        h_report(ch, 'a', "attached");
        while (revoked < 2) {
                CHECK_OK(c, h_next_event_of(c, GPUIPC_EVENT_REVOKED, H_SOON_MS, &ev));
                CHECK(ev.buffer == gpuipc_buffer_id(x) || ev.buffer == gpuipc_buffer_id(y));
                revoked++;
        }
        CHECK(gpuipc_buffer_revoked(x) && gpuipc_buffer_revoked(y));
        CHECK_OK(c, gpuipc_release(c, x));
        CHECK_OK(c, gpuipc_release(c, y));
        h_report(ch, 'r', "revoked");
        gpuipc_close(c);
        return 0;
}

static int doomed_producer(HChan *ch, void *arg)
{
        const Holder *a = arg;
        gpuipc_t *c = connect_to(a->broker, "doomed", false);
        gpuipc_pool_t *p = new_pool(c, 4 * MIB, 0);
        gpuipc_buffer_t *va, *vb;
        void *x, *y;

        CHECK_OK(c, gpuipc_pool_alloc(p, MIB, &x));
        CHECK_OK(c, gpuipc_pool_alloc(p, MIB, &y));
        CHECK_OK(c, gpuipc_pool_view(p, x, MIB, &va));
        CHECK_OK(c, gpuipc_pool_view(p, y, MIB, &vb));
        CHECK_OK(c, gpuipc_publish(c, va, "death/a", NULL));
        CHECK_OK(c, gpuipc_publish(c, vb, "death/b", NULL));
        h_report(ch, 'p', "published");
        h_await(ch, 'x', 60000);
        return 0;
}

/* A producer killed while a consumer holds two views of its pool: the consumer hears each view
 * revoked, under its own id, and the broker keeps nothing of it (fds back to the baseline). */
static void test_producer_death(void)
{
        Holder arg;
        HChild *prod, *cons;
        HCase k;

        h_case_begin(&k, NULL);
        arg = (Holder){ k.broker };
        prod = h_spawn("doomed", doomed_producer, &arg);
        h_child_expect(prod, 'p', H_SOON_MS, NULL, 0);
        cons = h_spawn("holder", holder, &arg);
        h_child_expect(cons, 'a', H_SOON_MS, NULL, 0);
        h_child_kill9(prod);
        h_child_expect(cons, 'r', H_SOON_MS, NULL, 0);
        h_child_wait_ok(cons, H_SOON_MS);
        h_child_free(cons);
        h_child_free(prod);
        WAIT_UNTIL(h_stats(k.obs, "buffers") == 1, H_SOON_MS); /* the bystander's */
        h_case_end(&k);
}

/* A broker restart with a live view held: the producer registers the view again (the segment's fd
 * travels with it, once), the consumer reclaims its reference, its handle stays valid, and a second
 * view of the same segment published afterwards is attached without an fd (the reclaim told the new
 * broker the consumer maps the segment). */
static void test_restart_keeps_views(void)
{
        static const char *const flags[] = { "--restart-grace-ms", "1500", NULL };
        gpuipc_buffer_t *v1, *v2, *a1, *a2;
        gpuipc_pool_t *p;
        gpuipc_t *prod, *cons;
        HStat st;
        void *x, *y;
        HBroker *b;

        b = h_broker_start(flags);
        prod = connect_to(b, "producer", true);
        cons = connect_to(b, "consumer", true);
        p = new_pool(prod, 4 * MIB, 0);
        CHECK_OK(prod, gpuipc_pool_alloc(p, MIB, &x));
        CHECK_OK(prod, gpuipc_pool_alloc(p, MIB, &y));
        CHECK_OK(prod, gpuipc_pool_view(p, x, MIB, &v1));
        fill(v1, 31);
        CHECK_OK(prod, gpuipc_publish(prod, v1, "rs/a", NULL));
        CHECK_OK(cons, gpuipc_attach(cons, "rs/a", H_SOON_MS, &a1));
        h_broker_kill9(b);
        h_broker_restart(b);
        CHECK_OK(prod, gpuipc_ping(prod, H_SOON_MS));
        CHECK_OK(cons, gpuipc_ping(cons, H_SOON_MS));
        CHECK(!gpuipc_buffer_revoked(a1));
        verify(a1, 31);
        CHECK_OK(cons, h_stat(cons, "rs/a", &st));
        CHECK_EQ(st.refs, 1);
        CHECK_OK(prod, gpuipc_pool_view(p, y, MIB, &v2));
        fill(v2, 32);
        CHECK_OK(prod, gpuipc_publish(prod, v2, "rs/b", NULL));
        CHECK_OK(cons, gpuipc_attach(cons, "rs/b", H_SOON_MS, &a2));
        CHECK_EQ(h_stats(cons, "attaches_cached_total"), 1);
        verify(a2, 32);
        CHECK_OK(cons, gpuipc_release(cons, a1));
        CHECK_OK(cons, gpuipc_release(cons, a2));
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_broker_stop(b);
}

/* Open fds of this process but the stand-in libcuda's (its "device memory": driver state that an
 * abandoned allocation keeps, as a real driver's does). */
static unsigned fds_not_fake(void)
{
        DIR *d = opendir("/proc/self/fd");
        char path[300], target[256];
        struct dirent *de;
        unsigned n = 0;
        ssize_t len;

        CHECK(d);
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
                len = readlink(path, target, sizeof(target) - 1);
                target[len > 0 ? len : 0] = 0;
                n += !strstr(target, "memfd:fakecuda");
        }
        closedir(d);
        return n;
}

/* The stand-in libcuda's fakecuda_teardown, when it is the libcuda loaded (NULL otherwise). */
static void (*fake_teardown(void))(void)
{
        const char *path = getenv("GPUIPC_LIBCUDA");
        void *dl = path && *path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;

        return dl ? (void (*)(void))dlsym(dl, "fakecuda_teardown") : NULL;
}

/* gpuipc_abandon on a producer (a pool with a published view, a buffer of its own, a ring) and a
 * consumer holding the view, as at a process's exit: every byte stays where the pointers say, the
 * connections' fds are closed, no CUDA call is made (on the stand-in, torn down first, any would
 * raise SIGBUS), the ring's member takes nothing more, the pool is gone for torch's hooks, and the
 * broker drops the publications. */
static void test_abandon(void)
{
        gpuipc_ring_options_t ro = { .struct_size = sizeof(ro), .slots = 2, .slot_size = 4096, .max_members = 1 };
        void (*teardown)(void);
        gpuipc_buffer_t *v, *own, *a;
        gpuipc_t *prod, *cons, *obs, *mem;
        const uint8_t *pv, *pown, *pa;
        gpuipc_ring_t *ring, *member;
        gpuipc_buffer_t *slot;
        unsigned fds;
        gpuipc_pool_t *p;
        HBroker *b;
        void *x;

        b = h_broker_start(NULL);
        obs = h_connect(b, "observer");
        fds = fds_not_fake();
        prod = connect_to(b, "producer", true);
        cons = connect_to(b, "consumer", true);
        p = new_pool(prod, 4 * MIB, 0);
        CHECK_OK(prod, gpuipc_pool_alloc(p, MIB, &x));
        CHECK_OK(prod, gpuipc_pool_view(p, x, MIB, &v));
        fill(v, 41);
        CHECK_OK(prod, gpuipc_publish(prod, v, "ab/view", NULL));
        CHECK_OK(prod, gpuipc_buffer_alloc(prod, pool_kind(), MIB, 0, &own));
        fill(own, 42);
        CHECK_OK(prod, gpuipc_publish(prod, own, "ab/own", NULL));
        CHECK_OK(prod, gpuipc_ring_create(prod, "ab/ring", &ro, &ring));
        mem = h_connect(b, "member");
        CHECK_OK(mem, gpuipc_ring_join(mem, "ab/ring", H_SOON_MS, &member));
        CHECK_OK(cons, gpuipc_attach(cons, "ab/view", H_SOON_MS, &a));
        verify(a, 41);
        /* Where the bytes are: host memory, or the stand-in's device memory (host memory too). */
        pv = gpuipc_buffer_ptr(v);
        pown = gpuipc_buffer_ptr(own);
        pa = gpuipc_buffer_ptr(a);
        CHECK(h_list_count(obs, "ab/") >= 3); /* the two buffers and the ring's parts */
        if (pool_kind() == GPUIPC_KIND_CUDA_VMM && getenv("GPUIPC_LIBCUDA")) {
                teardown = fake_teardown(); /* loaded by now */
                CHECK(teardown);
                teardown();
        }
        gpuipc_abandon(cons);
        gpuipc_abandon(prod);
        CHECK_EQ(h_pattern_check(pv, MIB, 41), SIZE_MAX);
        CHECK_EQ(h_pattern_check(pown, MIB, 42), SIZE_MAX);
        CHECK_EQ(h_pattern_check(pa, MIB, 41), SIZE_MAX);
        /* The ring's member takes nothing more (it sees the ring closed, or the producer gone). */
        CHECK_EQ(gpuipc_ring_take(member, H_SOON_MS, &slot, NULL), GPUIPC_E_REVOKED);
        gpuipc_ring_close(member);
        gpuipc_close(mem);
        CHECK_EQ(fds_not_fake(), fds);
        CHECK(gpuipc_torch_alloc(MIB, 0, NULL) == NULL);
        gpuipc_torch_free(x, MIB, 0, NULL); /* memory of no open pool: ignored */
        WAIT_UNTIL(h_list_count(obs, "ab/") == 0, H_SOON_MS);
        gpuipc_abandon(NULL);
        gpuipc_close(obs);
        h_broker_stop(b);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_views_of_a_buffer),
                H_TEST(test_pool_allocates),
                H_TEST(test_versions_flat),
                H_TEST(test_free_while_published),
                H_TEST(test_view_errors),
                H_TEST(test_producer_death),
                H_TEST(test_restart_keeps_views),
                H_TEST(test_abandon),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
