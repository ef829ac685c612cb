/* What operators see of rings (docs/operations.md "Rings"): the rings and ring-stat replies, through
 * the public calls gpuipc_list_rings and gpuipc_stat_ring. The broker reads each ring's head and its
 * members' positions from the ring's shared memory when asked, so these cases check exact values:
 *   - rings set up by hand over raw connections, in every mode (stream included, on memfds the broker
 *     takes for cuda-vmm as it takes any opaque fd), whose control page and member pages the test
 *     writes itself: seat states, positions, lags, the clamps for scribbled pages, an invalid control
 *     page, a seat kept for a member after a restart;
 *   - rings of the library with members in processes of their own, one of them behind (backpressure)
 *     or holding an old frame (latest);
 *   - a member scribbling over its page while the broker is asked again and again;
 *   - the policy: a ring is seen like a buffer of its name, a member like a peer. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "ring.h"

#define SLOT_BYTES 4096
#define GPU_UUID "GPU-00000000-1111-2222-3333-444444444444"
#define NOBODY 65534

/* ---- a ring set up by hand ---- */

/* The test plays the producer (its raw connection registers the parts) and writes the members'
 * pages too, so it knows every word the broker reads. */
typedef struct RawRing {
        int sock;
        char name[64];
        RingCtl *ctl;
        RingMember *page[RING_MAX_MEMBERS];
        uint32_t n_slots, n_members;
        ProtoMode mode;
} RawRing;

static int memfd_of(size_t size)
{
        int fd = memfd_create("ringstat", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        CHECK(fd >= 0);
        CHECK(ftruncate(fd, (off_t)size) == 0);
        return fd;
}

/* Registers part index with fd (closed here). */
static void raw_part(RawRing *g, uint32_t index, ProtoKind kind, bool writable, int fd)
{
        ProtoMsg req = { .op = PROTO_OP_RING_PART };
        HFrame *f = h_frame_new();
        unsigned st;

        req.name = proto_str(g->name);
        req.index = index;
        req.kind = kind;
        req.size = SLOT_BYTES;
        req.writable = writable;
        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_INDEX) | PROTO_BIT(PF_KIND) |
                  PROTO_BIT(PF_SIZE) | PROTO_BIT(PF_WRITABLE);
        if (kind == PROTO_KIND_CUDA_VMM) {
                req.device = proto_str(GPU_UUID);
                proto_set(&req, PF_DEVICE);
        }
        st = h_raw_call(g->sock, &req, fd, f);
        CHECKF(st == PROTO_STATUS_OK, "ring-part %u: %s: %.*s", index, proto_status_name(st),
               (int)f->msg.message.len, f->msg.message.ptr);
        close(fd);
        h_frame_free(f);
}

/* A memfd page the test keeps mapped writable; read_only seals it as a control page must be. */
static void *raw_page(int *ret_fd, bool read_only)
{
        int fd = memfd_of(RING_PAGE);
        void *p = mmap(NULL, RING_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | (read_only ? F_SEAL_FUTURE_WRITE : 0);

        CHECK(p != MAP_FAILED);
        CHECK(fcntl(fd, F_ADD_SEALS, seals) == 0);
        *ret_fd = fd;
        return p;
}

/* ring-create and every part, restored with the given seats (epochs, 0: none) if seats is not NULL. */
static void raw_ring_create(RawRing *g, const HBroker *b, const char *name, ProtoMode mode, uint32_t slots,
                            uint32_t members, const uint64_t *seats)
{
        ProtoKind kind = mode == PROTO_MODE_STREAM ? PROTO_KIND_CUDA_VMM : PROTO_KIND_MEMFD;
        ProtoMsg req = { .op = PROTO_OP_RING_CREATE };
        HFrame *f = h_frame_new();
        ProtoItems items;
        uint32_t part = 0;
        unsigned st;
        int fd;

        memset(g, 0, sizeof(*g));
        snprintf(g->name, sizeof(g->name), "%s", name);
        g->n_slots = slots;
        g->n_members = members;
        g->mode = mode;
        g->sock = h_raw_connect(b);
        h_raw_hello(g->sock);
        req.name = proto_str(name);
        req.kind = kind;
        req.size = SLOT_BYTES;
        req.slots = slots;
        req.members = members;
        req.mode = mode;
        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE) |
                  PROTO_BIT(PF_SLOTS) | PROTO_BIT(PF_MEMBERS) | PROTO_BIT(PF_MODE);
        if (kind == PROTO_KIND_CUDA_VMM) {
                req.device = proto_str(GPU_UUID);
                proto_set(&req, PF_DEVICE);
        }
        proto_items_init(&items, PROTO_MAX_BODY / 2);
        if (seats) {
                uint64_t top = 0;

                for (uint32_t i = 0; i < members; i++) {
                        ProtoMsg rec = { .index = i, .generation = seats[i] };

                        rec.has = PROTO_BIT(PF_INDEX) | PROTO_BIT(PF_GENERATION);
                        if (seats[i])
                                CHECK(proto_items_add(&items, &rec));
                        top = seats[i] > top ? seats[i] : top;
                }
                req.restored = true;
                req.generation = top;
                req.items = proto_items_finish(&items);
                req.has |= PROTO_BIT(PF_RESTORED) | PROTO_BIT(PF_GENERATION) | PROTO_BIT(PF_ITEMS);
        }
        st = h_raw_call(g->sock, &req, -1, f);
        CHECKF(st == PROTO_STATUS_OK, "ring-create: %s: %.*s", proto_status_name(st), (int)f->msg.message.len,
               f->msg.message.ptr);
        proto_items_free(&items);
        h_frame_free(f);

        /* The control page as a producer initializes it, before members can map it. */
        g->ctl = raw_page(&fd, true);
        *g->ctl = (RingCtl){ .magic = RING_MAGIC, .version = RING_LAYOUT_VERSION, .n_slots = slots,
                             .n_members = members, .mode = (uint32_t)mode - 1, .slot_size = SLOT_BYTES };
        raw_part(g, part++, PROTO_KIND_MEMFD, false, fd);
        for (uint32_t i = 0; i < slots; i++) {
                fd = memfd_of(SLOT_BYTES);
                if (kind == PROTO_KIND_MEMFD)
                        CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE) ==
                              0);
                raw_part(g, part++, kind, false, fd);
        }
        for (uint32_t i = 0; i < members; i++) {
                g->page[i] = raw_page(&fd, false);
                raw_part(g, part++, PROTO_KIND_MEMFD, true, fd);
        }
        for (uint32_t i = 0; mode == PROTO_MODE_STREAM && i < members; i++)
                raw_part(g, part++, PROTO_KIND_CUDA_VMM, true, memfd_of(SLOT_BYTES));
}

static void raw_ring_free(RawRing *g)
{
        close(g->sock);
        munmap(g->ctl, RING_PAGE);
        for (uint32_t i = 0; i < g->n_members; i++)
                munmap(g->page[i], RING_PAGE);
}

/* A member on a raw connection: joins, returns its socket; its seat and epoch in *ret_seat, *ret_epoch. */
static int raw_join(const HBroker *b, const char *name, uint32_t *ret_seat, uint64_t *ret_epoch)
{
        ProtoMsg req = { .op = PROTO_OP_RING_JOIN, .name = proto_str(name),
                         .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) };
        HFrame *f = h_frame_new();
        int sock = h_raw_connect(b);

        h_raw_hello(sock);
        CHECK_EQ(h_raw_call(sock, &req, -1, f), PROTO_STATUS_OK);
        *ret_seat = (uint32_t)f->msg.index;
        *ret_epoch = f->msg.generation;
        h_frame_free(f);
        return sock;
}

/* What the producer writes when it seats a member (client/ring.c seat_activate). */
static void raw_seat(RawRing *g, uint32_t seat, uint64_t epoch, uint64_t start)
{
        g->ctl->member[seat].start = start;
        __atomic_store_n(&g->ctl->member[seat].epoch, epoch, __ATOMIC_RELEASE);
        __atomic_store_n(&g->ctl->member[seat].state, RING_MEMBER_ACTIVE, __ATOMIC_RELEASE);
}

/* What a member writes into its page: its membership, what it released and what it holds. */
static void raw_page_set(RawRing *g, uint32_t seat, uint64_t epoch, uint64_t released, uint64_t held)
{
        g->page[seat]->released = released;
        g->page[seat]->held = held;
        __atomic_store_n(&g->page[seat]->epoch, epoch, __ATOMIC_RELEASE);
}

/* ---- reading what the broker says ---- */

typedef struct RingStat {
        gpuipc_ring_info_t info;
        gpuipc_ring_member_info_t seat[RING_MAX_MEMBERS]; /* by seat index */
        bool taken[RING_MAX_MEMBERS];
        int n;
} RingStat;

static void ring_stat(gpuipc_t *c, const char *name, RingStat *ret)
{
        gpuipc_ring_member_info_t seats[RING_MAX_MEMBERS];
        int n;

        memset(ret, 0, sizeof(*ret));
        n = gpuipc_stat_ring(c, name, seats, RING_MAX_MEMBERS, &ret->info);
        CHECK_OK(c, n);
        CHECK_EQ(n, ret->info.taken);
        for (int i = 0; i < n; i++) {
                CHECK(seats[i].seat < ret->info.members);
                CHECKF(i == 0 || seats[i].seat > seats[i - 1].seat, "seats out of order");
                ret->seat[seats[i].seat] = seats[i];
                ret->taken[seats[i].seat] = true;
        }
        ret->n = n;
}

/* Seat i's state, position and lag as expected (position < 0: unknown). */
static void expect_seat(const RingStat *s, uint32_t i, gpuipc_seat_state_t state, int64_t position, uint64_t lag)
{
        const gpuipc_ring_member_info_t *m = &s->seat[i];

        CHECKF(s->taken[i], "seat %u is not taken", i);
        CHECKF(m->state == state, "seat %u is %s, expected %s", i, gpuipc_seat_state_name(m->state),
               gpuipc_seat_state_name(state));
        if (position < 0) {
                CHECKF(!m->position_known, "seat %u has a position (%" PRIu64 ")", i, m->position);
                return;
        }
        CHECKF(m->position_known && m->position == (uint64_t)position && m->lag == lag,
               "seat %u: position %" PRIu64 " (known %d) lag %" PRIu64 ", expected %" PRId64 " and %" PRIu64, i,
               m->position, m->position_known, m->lag, position, lag);
}

/* ---- rings by hand, in every mode ---- */

/* Every seat state, exact positions and lags, the clamps for a scribbled page, an invalid control
 * page, a member leaving, and the listing; in one mode. */
static void raw_modes_case(ProtoMode mode)
{
        bool latest = mode == PROTO_MODE_LATEST;
        uint64_t epoch[3];
        uint32_t seat[3];
        int member[3];
        char name[64];
        RingStat s;
        RawRing g;
        HCase k;

        h_case_begin(&k, NULL);
        snprintf(name, sizeof(name), "raw/%s", proto_mode_name(mode));
        raw_ring_create(&g, k.broker, name, mode, 6, 3, NULL);

        ring_stat(k.obs, name, &s);
        CHECK_EQ(s.info.mode, mode - 1);
        CHECK_EQ(s.info.kind, mode == PROTO_MODE_STREAM ? GPUIPC_KIND_CUDA_VMM : GPUIPC_KIND_MEMFD);
        CHECK(strcmp(s.info.name, name) == 0);
        CHECK_EQ(s.info.slot_size, SLOT_BYTES);
        CHECK_EQ(s.info.slots, 6);
        CHECK_EQ(s.info.members, 3);
        CHECK_EQ(s.info.taken, 0);
        CHECK_EQ(s.info.lease_ms, 2000);
        CHECK(strcmp(s.info.device, mode == PROTO_MODE_STREAM ? GPU_UUID : "") == 0);
        CHECK(s.info.ready && s.info.owner != 0);
        CHECK_EQ(s.info.uid, getuid());
        CHECK_EQ(s.info.pid, getpid());
        CHECK(s.info.head_known && s.info.head == 0 && !s.info.lag_known && s.info.why[0] == 0);

        /* Joined: the broker knows the members, the control page does not seat them yet. */
        for (int i = 0; i < 3; i++)
                member[i] = raw_join(k.broker, name, &seat[i], &epoch[i]);
        CHECK(seat[0] == 0 && seat[1] == 1 && seat[2] == 2);
        ring_stat(k.obs, name, &s);
        CHECK_EQ(s.info.taken, 3);
        CHECK(!s.info.lag_known);
        for (uint32_t i = 0; i < 3; i++) {
                expect_seat(&s, i, GPUIPC_SEAT_JOINED, -1, 0);
                CHECK_EQ(s.seat[i].epoch, epoch[i]);
                CHECK(s.seat[i].peer != 0 && s.seat[i].peer != s.info.owner);
                CHECK_EQ(s.seat[i].pid, getpid());
                CHECK_EQ(s.seat[i].uid, getuid());
                CHECK(strcmp(s.seat[i].label, "raw-test-peer") == 0);
        }

        /* Ten frames out; two members seated from frame 11, their pages not written yet: the producer
         * counts them as having released frame 10. */
        g.ctl->head = 10;
        raw_seat(&g, 0, epoch[0], 11);
        raw_seat(&g, 1, epoch[1], 11);
        ring_stat(k.obs, name, &s);
        CHECK_EQ(s.info.head, 10);
        expect_seat(&s, 0, GPUIPC_SEAT_UNCONFIRMED, latest ? 0 : 10, 0);
        expect_seat(&s, 1, GPUIPC_SEAT_UNCONFIRMED, latest ? 0 : 10, 0);
        expect_seat(&s, 2, GPUIPC_SEAT_JOINED, -1, 0);
        CHECK(s.info.lag_known && s.info.lag == 0);

        /* Frame 20 is out; member 0 is done with all of it, member 1 with frame 14 (latest: it holds
         * frame 14, and member 0 nothing). */
        g.ctl->head = 20;
        raw_page_set(&g, 0, epoch[0], latest ? 0 : 20, 0);
        raw_page_set(&g, 1, epoch[1], latest ? 0 : 14, latest ? 14 : 0);
        ring_stat(k.obs, name, &s);
        CHECK_EQ(s.info.head, 20);
        expect_seat(&s, 0, GPUIPC_SEAT_SEATED, latest ? 0 : 20, 0);
        expect_seat(&s, 1, GPUIPC_SEAT_SEATED, 14, 6);
        CHECK(s.info.lag_known && s.info.lag == 6);

        /* Scribbles: values beyond head are shown as head; released below what the member ever had
         * as the frame before its start; a page of another membership as the producer reads it. */
        raw_page_set(&g, 1, epoch[1], UINT64_MAX, UINT64_MAX);
        ring_stat(k.obs, name, &s);
        expect_seat(&s, 1, GPUIPC_SEAT_SEATED, 20, 0);
        raw_page_set(&g, 1, epoch[1], 3, latest ? 3 : 0);
        ring_stat(k.obs, name, &s);
        expect_seat(&s, 1, GPUIPC_SEAT_SEATED, latest ? 3 : 10, latest ? 17 : 10);
        raw_page_set(&g, 1, epoch[1] ^ 0x5a5a5a5a5a5a5a5aull, 20, 20);
        ring_stat(k.obs, name, &s);
        expect_seat(&s, 1, GPUIPC_SEAT_UNCONFIRMED, latest ? 0 : 10, latest ? 0 : 10);
        CHECK_EQ(s.info.lag, latest ? 0 : 10);
        raw_page_set(&g, 1, epoch[1], latest ? 0 : 14, latest ? 14 : 0);

        /* A control page that does not hold this ring: head unknown, and why. */
        g.ctl->magic = 0xdeadbeef;
        ring_stat(k.obs, name, &s);
        CHECK(!s.info.head_known && !s.info.lag_known && strstr(s.info.why, "control page"));
        for (uint32_t i = 0; i < 3; i++)
                expect_seat(&s, i, GPUIPC_SEAT_JOINED, -1, 0);
        g.ctl->magic = RING_MAGIC;
        g.ctl->n_members = 4; /* another shape */
        ring_stat(k.obs, name, &s);
        CHECK(!s.info.head_known);
        g.ctl->n_members = 3;

        /* The third seated at frame 21; then member 1 leaves. */
        raw_seat(&g, 2, epoch[2], 21);
        close(member[1]);
        WAIT_UNTIL((ring_stat(k.obs, name, &s), s.info.taken == 2), H_SOON_MS);
        CHECK(!s.taken[1]);
        expect_seat(&s, 0, GPUIPC_SEAT_SEATED, latest ? 0 : 20, 0);
        expect_seat(&s, 2, GPUIPC_SEAT_UNCONFIRMED, latest ? 0 : 20, 0);

        /* The listing says the same of the ring. */
        {
                gpuipc_ring_info_t items[4];
                uint64_t cursor = 0;
                int n = gpuipc_list_rings(k.obs, "raw/", &cursor, items, 4);

                CHECK_OK(k.obs, n);
                CHECK_EQ(n, 1);
                CHECK_EQ(cursor, 0);
                CHECK(strcmp(items[0].name, name) == 0 && items[0].head_known && items[0].head == 20);
                CHECK(items[0].taken == 2 && items[0].lag_known && items[0].lag == 0);
        }
        close(member[0]);
        close(member[2]);
        raw_ring_free(&g);
        h_case_end(&k);
}

/* A hand-made backpressure ring is listed exactly: every seat state, positions and lags, clamps for a scribbled
 * page, an invalid control page, a member leaving. */
static void test_ringstat_raw_backpressure(void)
{
        raw_modes_case(PROTO_MODE_BACKPRESSURE);
}

/* The same exact listing for a hand-made latest-mode ring. */
static void test_ringstat_raw_latest(void)
{
        raw_modes_case(PROTO_MODE_LATEST);
}

/* Stream rings: the position is the host side's (the frame whose release the member queued). */
static void test_ringstat_raw_stream(void)
{
        raw_modes_case(PROTO_MODE_STREAM);
}

/* After a broker restart the producer declares its ring again with the seats it counts as seated:
 * such a seat waits for its member, and meanwhile shows what its page says (frames never stopped). */
static void test_ringstat_waiting_seat(void)
{
        static const uint64_t seats[2] = { 3, 0 };
        uint64_t epoch;
        uint32_t seat;
        RingStat s;
        RawRing g;
        HCase k;
        int member;

        h_case_begin(&k, NULL);
        raw_ring_create(&g, k.broker, "raw/restored", PROTO_MODE_BACKPRESSURE, 4, 2, seats);
        g.ctl->head = 9;
        raw_seat(&g, 0, 3, 1);
        raw_page_set(&g, 0, 3, 7, 0);
        ring_stat(k.obs, "raw/restored", &s);
        CHECK_EQ(s.info.taken, 1);
        expect_seat(&s, 0, GPUIPC_SEAT_WAITING, 7, 2);
        CHECK(s.seat[0].peer == 0 && s.seat[0].pid == 0 && s.seat[0].label[0] == 0);
        CHECK_EQ(s.seat[0].epoch, 3);
        /* A new member takes the free seat, with the next epoch. */
        member = raw_join(k.broker, "raw/restored", &seat, &epoch);
        CHECK(seat == 1 && epoch == 4);
        ring_stat(k.obs, "raw/restored", &s);
        CHECK_EQ(s.info.taken, 2);
        expect_seat(&s, 1, GPUIPC_SEAT_JOINED, -1, 0);
        close(member);
        raw_ring_free(&g);
        h_case_end(&k);
}

/* Pages of the listing: a cursor over five rings, two at a time, each once, oldest first; a prefix. */
static void test_ringstat_listing_pages(void)
{
        gpuipc_ring_info_t items[2];
        RawRing g[5];
        uint64_t cursor = 0;
        unsigned seen = 0, calls = 0;
        HCase k;

        h_case_begin(&k, NULL);
        for (int i = 0; i < 5; i++) {
                char name[32];

                snprintf(name, sizeof(name), "%s/%d", i == 4 ? "other" : "paged", i);
                raw_ring_create(&g[i], k.broker, name, PROTO_MODE_BACKPRESSURE, 2, 1, NULL);
        }
        do {
                int n = gpuipc_list_rings(k.obs, "paged/", &cursor, items, 2);

                CHECK_OK(k.obs, n);
                CHECK(n <= 2 && ++calls <= 3);
                for (int i = 0; i < n; i++) {
                        char want[32];

                        snprintf(want, sizeof(want), "paged/%u", seen++);
                        CHECKF(strcmp(items[i].name, want) == 0, "listed %s, expected %s", items[i].name, want);
                }
        } while (cursor);
        CHECK_EQ(seen, 4);
        CHECK_ERR(k.obs, gpuipc_stat_ring(k.obs, "paged/9", NULL, 0, &items[0]), GPUIPC_E_NOT_FOUND);
        CHECK_ERR(k.obs, gpuipc_stat_ring(k.obs, "../bad", NULL, 0, &items[0]), GPUIPC_E_INVALID);
        for (int i = 0; i < 5; i++)
                raw_ring_free(&g[i]);
        h_case_end(&k);
}

/* A listing reads a bounded number of pages of shared memory per request: 300 rings (a control
 * page each) come in more than one page even when the page size allows all of them, every ring
 * once. */
static void test_ringstat_listing_budget(void)
{
        static RawRing g[300];
        gpuipc_ring_info_t *items = calloc(1024, sizeof(*items));
        static bool seen[300];
        uint64_t cursor = 0;
        unsigned total = 0, pages = 0;
        HCase k;

        CHECK(items);
        h_case_begin(&k, NULL);
        for (int i = 0; i < 300; i++) {
                char name[32];

                snprintf(name, sizeof(name), "many/%03d", i);
                raw_ring_create(&g[i], k.broker, name, PROTO_MODE_BACKPRESSURE, 1, 1, NULL);
        }
        do {
                int n = gpuipc_list_rings(k.obs, "many/", &cursor, items, 1024);

                CHECK_OK(k.obs, n);
                CHECK(n > 0 && n < 300 && ++pages <= 300);
                for (int i = 0; i < n; i++) {
                        unsigned idx = (unsigned)strtoul(items[i].name + 5, NULL, 10);

                        CHECKF(idx < 300 && !seen[idx], "ring %s listed twice", items[i].name);
                        seen[idx] = true;
                        CHECK(items[i].head_known);
                }
                total += (unsigned)n;
        } while (cursor);
        h_log("300 rings in %u pages", pages);
        CHECK_EQ(total, 300);
        CHECK(pages >= 2);
        for (int i = 0; i < 300; i++)
                raw_ring_free(&g[i]);
        free(items);
        h_case_end(&k);
}

/* A member page's count of frames taken, as the broker sums it: only from a page that speaks for
 * its seat, at most the frames published since the member's first, and never going back. */
static void test_ringstat_taken_clamped(void)
{
        uint64_t epoch[2];
        uint32_t seat[2];
        int member[2];
        RingStat s;
        RawRing g;
        HCase k;

        h_case_begin(&k, NULL);
        raw_ring_create(&g, k.broker, "raw/taken", PROTO_MODE_BACKPRESSURE, 6, 2, NULL);
        for (int i = 0; i < 2; i++)
                member[i] = raw_join(k.broker, "raw/taken", &seat[i], &epoch[i]);
        g.ctl->head = 100;
        raw_seat(&g, 0, epoch[0], 11);
        raw_seat(&g, 1, epoch[1], 11);
        /* Seat 1's page speaks for another membership: what it says counts for nothing. */
        g.page[1]->taken = 50;
        raw_page_set(&g, 1, epoch[1] + 7, 100, 0);
        g.page[0]->taken = UINT64_MAX;
        raw_page_set(&g, 0, epoch[0], 100, 0);
        ring_stat(k.obs, "raw/taken", &s);
        CHECK_EQ(h_stats(k.obs, "ring_frames_taken_total"), 90); /* frames 11 to 100 */
        /* Less than before, then as much again: nothing goes back, nothing counts twice. */
        __atomic_store_n(&g.page[0]->taken, 3, __ATOMIC_RELAXED);
        ring_stat(k.obs, "raw/taken", &s);
        CHECK_EQ(h_stats(k.obs, "ring_frames_taken_total"), 90);
        __atomic_store_n(&g.page[0]->taken, 90, __ATOMIC_RELAXED);
        ring_stat(k.obs, "raw/taken", &s);
        CHECK_EQ(h_stats(k.obs, "ring_frames_taken_total"), 90);
        /* The head moves on: the page may say more, and the listing (rings) reads it too. */
        g.ctl->head = 104;
        __atomic_store_n(&g.page[0]->taken, 92, __ATOMIC_RELAXED);
        {
                gpuipc_ring_info_t items[4];
                uint64_t cursor = 0;

                CHECK_OK(k.obs, gpuipc_list_rings(k.obs, "raw/", &cursor, items, 4));
        }
        CHECK_EQ(h_stats(k.obs, "ring_frames_taken_total"), 92);
        for (int i = 0; i < 2; i++)
                close(member[i]);
        raw_ring_free(&g);
        h_case_end(&k);
}

/* ---- rings of the library, members in processes of their own ---- */

typedef struct MemberArg {
        const HBroker *broker;
        const char *ring;
        uint64_t frames; /* take and release this many, then report 'n' */
        bool hold_last;  /* keep the last one (latest mode: it then shows as held) */
} MemberArg;

/* Joins, reports 'j', waits for 'g', takes its frames, reports 'n', waits for 'x' and leaves. */
static int member(HChan *ch, void *arg)
{
        const MemberArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "lagging-member");
        gpuipc_ring_t *r;
        uint64_t frame = 0;

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        h_report(ch, 'j', "joined");
        h_await(ch, 'g', H_SOON_MS);
        for (uint64_t i = 0; i < a->frames; i++) {
                gpuipc_buffer_t *slot;

                CHECK_OK(c, gpuipc_ring_take(r, H_SOON_MS, &slot, &frame));
                if (!(a->hold_last && i + 1 == a->frames))
                        CHECK_OK(c, gpuipc_ring_release(r));
        }
        h_report(ch, 'n', "%" PRIu64, frame);
        h_await(ch, 'x', H_SOON_MS * 3);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

static gpuipc_ring_t *make_ring(gpuipc_t *c, const char *name, unsigned slots, unsigned members,
                                gpuipc_ring_mode_t mode)
{
        gpuipc_ring_options_t o = { .struct_size = sizeof(o), .slot_size = SLOT_BYTES, .slots = slots,
                                    .max_members = members, .mode = mode, .lease_ms = 60000 };
        gpuipc_ring_t *r = NULL;

        CHECK_OK(c, gpuipc_ring_create(c, name, &o, &r));
        return r;
}

static void publish(gpuipc_t *c, gpuipc_ring_t *r, unsigned n)
{
        for (unsigned i = 0; i < n; i++) {
                gpuipc_buffer_t *slot;

                CHECK_OK(c, gpuipc_ring_acquire(r, H_SOON_MS, &slot));
                memset(gpuipc_buffer_ptr(slot), (int)i, SLOT_BYTES);
                CHECK_OK(c, gpuipc_ring_publish(r, NULL));
        }
}

static uint64_t member_frame(HChild *k)
{
        char text[32];

        h_child_expect(k, 'n', H_SOON_MS * 2, text, sizeof(text));
        return strtoull(text, NULL, 10);
}

/* Backpressure: a member that stopped five frames in holds the producer at 5 + slots; the other
 * keeps up. The broker shows the seats unconfirmed as soon as the producer seated them (without a
 * call of its own), then seated with exact lags. */
static void test_ringstat_backpressure_members(void)
{
        MemberArg fast, slow;
        HChild *kf, *ks;
        gpuipc_buffer_t *slot;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        RingStat s;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "lag/bp", 8, 3, GPUIPC_RING_BACKPRESSURE);
        fast = (MemberArg){ k.broker, "lag/bp", 13, false };
        slow = (MemberArg){ k.broker, "lag/bp", 5, false };
        kf = h_spawn("fast", member, &fast);
        h_child_expect(kf, 'j', H_SOON_MS, NULL, 0);
        ks = h_spawn("slow", member, &slow);
        h_child_expect(ks, 'j', H_SOON_MS, NULL, 0);
        /* The producer seats them without a call of its own: its ring thread reads the broker's
         * member-joined as it arrives (until then a seat shows joined). */
        WAIT_UNTIL((ring_stat(k.obs, "lag/bp", &s), s.taken[0] && s.taken[1] &&
                    s.seat[0].state == GPUIPC_SEAT_UNCONFIRMED && s.seat[1].state == GPUIPC_SEAT_UNCONFIRMED),
                   H_SOON_MS);
        CHECK(s.info.taken == 2 && s.info.head_known && s.info.head == 0);
        CHECK(strcmp(s.seat[0].label, "lagging-member") == 0 && s.seat[0].pid == (uint64_t)kf->pid);
        CHECK_EQ(s.seat[1].pid, ks->pid);
        {
                gpuipc_connection_info_t producer;

                CHECK_OK(c, gpuipc_connection_info(c, &producer));
                CHECK_EQ(s.info.owner, producer.peer);
        }
        expect_seat(&s, 0, GPUIPC_SEAT_UNCONFIRMED, 0, 0);
        expect_seat(&s, 1, GPUIPC_SEAT_UNCONFIRMED, 0, 0);

        h_child_tell(kf, 'g');
        h_child_tell(ks, 'g');
        publish(c, r, 13);
        CHECK_EQ(member_frame(ks), 5);
        CHECK_EQ(member_frame(kf), 13);
        /* Frame 14 would overwrite frame 6, which the slow one never released. */
        CHECK_ERR(c, gpuipc_ring_acquire(r, 100, &slot), GPUIPC_E_TIMEOUT);
        ring_stat(k.obs, "lag/bp", &s);
        CHECK_EQ(s.info.head, 13);
        expect_seat(&s, 0, GPUIPC_SEAT_SEATED, 13, 0);
        expect_seat(&s, 1, GPUIPC_SEAT_SEATED, 5, 8);
        CHECK(s.info.lag_known && s.info.lag == 8);
        /* The stat just read the members' pages: 13 frames taken by one, 5 by the other. */
        CHECK_EQ(h_stats(k.obs, "ring_frames_taken_total"), 18);

        h_child_tell(ks, 'x');
        h_child_wait_ok(ks, H_SOON_MS);
        WAIT_UNTIL((ring_stat(k.obs, "lag/bp", &s), s.info.taken == 1), H_SOON_MS);
        /* A member that left takes nothing back. */
        CHECK_EQ(h_stats(k.obs, "ring_frames_taken_total"), 18);
        h_child_tell(kf, 'x');
        h_child_wait_ok(kf, H_SOON_MS);
        h_child_free(kf);
        h_child_free(ks);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

/* Latest: a member holding frame 3 while the producer goes on to 40 lags by 37; one that released
 * everything holds nothing and lags by nothing. */
static void test_ringstat_latest_members(void)
{
        MemberArg holder, done;
        HChild *kh, *kd;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        RingStat s;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "lag/latest", 4, 2, GPUIPC_RING_LATEST);
        holder = (MemberArg){ k.broker, "lag/latest", 1, true };
        done = (MemberArg){ k.broker, "lag/latest", 1, false };
        kh = h_spawn("holder", member, &holder);
        h_child_expect(kh, 'j', H_SOON_MS, NULL, 0);
        kd = h_spawn("done", member, &done);
        h_child_expect(kd, 'j', H_SOON_MS, NULL, 0);
        CHECK_OK(c, gpuipc_process(c));
        publish(c, r, 3);
        h_child_tell(kh, 'g');
        h_child_tell(kd, 'g');
        CHECK_EQ(member_frame(kh), 3);
        CHECK_EQ(member_frame(kd), 3);
        publish(c, r, 37); /* never waits: a slot nobody holds is always there */
        ring_stat(k.obs, "lag/latest", &s);
        CHECK_EQ(s.info.head, 40);
        expect_seat(&s, 0, GPUIPC_SEAT_SEATED, 3, 37);
        expect_seat(&s, 1, GPUIPC_SEAT_SEATED, 0, 0);
        CHECK(s.info.lag_known && s.info.lag == 37);
        h_child_tell(kh, 'x');
        h_child_tell(kd, 'x');
        h_child_wait_ok(kh, H_SOON_MS);
        h_child_wait_ok(kd, H_SOON_MS);
        h_child_free(kh);
        h_child_free(kd);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

/* ---- a scribbling member ---- */

typedef struct ScribbleArg {
        const HBroker *broker;
        const char *ring;
        unsigned ms;
} ScribbleArg;

/* Writes random words, and plausible ones (small numbers, numbers near the top), over its own page. */
static int scribbler(HChan *ch, void *arg)
{
        const ScribbleArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "scribbler");
        uint64_t t0, *words = NULL;
        gpuipc_buffer_t *page = NULL;
        unsigned seed = (unsigned)getpid();
        gpuipc_ring_t *r;

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        page = h_ring_own_page(c, a->ring);
        words = gpuipc_buffer_ptr(page);
        h_report(ch, 'j', "joined");
        for (t0 = monotonic_ms(); monotonic_ms() - t0 < a->ms;) {
                unsigned what = (unsigned)rand_r(&seed) % 3;

                for (unsigned i = 0; i < 4; i++) {
                        uint64_t v = (uint64_t)rand_r(&seed) << 32 | (uint64_t)rand_r(&seed);
                        words[i] = what == 1 ? v & 0xff : what == 2 ? UINT64_MAX - (v & 0xff) : v;
                }
        }
        h_report(ch, 's', "scribbled");
        gpuipc_release(c, page);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

/* The broker is asked about the ring again and again while a member scribbles over its page and the
 * producer publishes: every answer is within what can be true, and the broker stays fine. */
static void scribble_case(gpuipc_ring_mode_t mode)
{
        const char *name = mode == GPUIPC_RING_LATEST ? "scribbled/latest" : "scribbled/bp";
        unsigned asked = 0, seen_seated = 0;
        gpuipc_ring_t *r;
        ScribbleArg sa;
        HChild *bad;
        gpuipc_t *c;
        RingStat s;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, name, 4, 2, mode);
        sa = (ScribbleArg){ k.broker, name, 1500 };
        bad = h_spawn("scribbler", scribbler, &sa);
        h_child_expect(bad, 'j', H_SOON_MS, NULL, 0);
        CHECK_OK(c, gpuipc_process(c)); /* seat it */
        while (h_child_quiet(bad)) {
                gpuipc_buffer_t *slot;

                /* Backpressure: the scribbler's page may hold the producer up; it publishes when it can. */
                if (gpuipc_ring_acquire(r, 1, &slot) == 0)
                        CHECK_OK(c, gpuipc_ring_publish(r, NULL));
                ring_stat(k.obs, name, &s);
                asked++;
                CHECK(s.info.head_known);
                for (uint32_t i = 0; i < s.info.members; i++) {
                        const gpuipc_ring_member_info_t *m = &s.seat[i];
                        uint64_t want;

                        if (!s.taken[i] || !m->position_known)
                                continue;
                        seen_seated++;
                        CHECKF(m->position <= s.info.head, "position %" PRIu64 " beyond head %" PRIu64, m->position,
                               s.info.head);
                        want = mode == GPUIPC_RING_LATEST && m->position == 0 ? 0 : s.info.head - m->position;
                        CHECKF(m->lag == want, "lag %" PRIu64 " at position %" PRIu64 ", head %" PRIu64, m->lag,
                               m->position, s.info.head);
                }
        }
        h_child_expect(bad, 's', H_SOON_MS, NULL, 0);
        h_child_wait_ok(bad, H_SOON_MS);
        h_child_free(bad);
        h_log("asked %u times, %u seated answers", asked, seen_seated);
        CHECK(asked > 20 && seen_seated > 0);
        CHECK_OK(k.obs, gpuipc_ping(k.obs, H_SOON_MS));
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

/* Asked again and again while a member scribbles over its page, the broker's answers about a backpressure ring stay
 * within what can be true. */
static void test_ringstat_scribbler_backpressure(void)
{
        scribble_case(GPUIPC_RING_BACKPRESSURE);
}

/* The same for a latest-mode ring. */
static void test_ringstat_scribbler_latest(void)
{
        scribble_case(GPUIPC_RING_LATEST);
}

/* ---- the policy ---- */

/* Lets other users traverse dir and its ancestors (temporary directories are 0700). */
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

/* The names of the rings c sees, each followed by a space. */
static void ring_names(gpuipc_t *c, char *out, size_t cap)
{
        gpuipc_ring_info_t items[8];
        uint64_t cursor = 0;
        size_t len = 0;

        out[0] = 0;
        do {
                int n = gpuipc_list_rings(c, NULL, &cursor, items, 8);

                CHECK_OK(c, n);
                for (int i = 0; i < n; i++)
                        len += (size_t)snprintf(out + len, cap - len, "%s ", items[i].name);
                CHECK(len < cap);
        } while (cursor);
}

static int limited_child(HChan *ch, void *arg)
{
        const HBroker *b = arg;
        gpuipc_ring_t *joined, *own;
        gpuipc_ring_info_t info;
        gpuipc_t *c;
        char names[512];
        RingStat s;

        CHECK(setgid(NOBODY) == 0 && setuid(NOBODY) == 0);
        c = h_connect(b, "limited");
        /* It may produce under pub/ (not attach there): its own ring stays visible to it. */
        own = make_ring(c, "pub/own", 2, 1, GPUIPC_RING_BACKPRESSURE);
        ring_names(c, names, sizeof(names));
        CHECKF(strstr(names, "mine/r ") && strstr(names, "pub/own "), "a ring it may see is not listed: %s", names);
        CHECKF(!strstr(names, "theirs/"), "rings lists a ring the policy does not let it join: %s", names);
        CHECK_ERR(c, gpuipc_stat_ring(c, "theirs/r", NULL, 0, &info), GPUIPC_E_NOT_FOUND);
        /* It joins mine/r next to root's member: it sees its own seat's member, not root's. */
        CHECK_OK(c, gpuipc_ring_join(c, "mine/r", H_SOON_MS, &joined));
        ring_stat(c, "mine/r", &s);
        CHECK_EQ(s.info.taken, 2);
        CHECK(s.seat[0].peer == 0 && s.seat[0].pid == 0 && s.seat[0].uid == 0 && s.seat[0].label[0] == 0);
        CHECK(s.seat[1].peer != 0 && s.seat[1].uid == NOBODY && strcmp(s.seat[1].label, "limited") == 0);
        h_report(ch, 'j', "joined");
        h_await(ch, 'x', H_SOON_MS);
        gpuipc_ring_close(joined);
        gpuipc_ring_close(own);
        gpuipc_close(c);
        return 0;
}

/* A ring is shown to the peers that would see a buffer of its name and its producer's uid; its
 * members' identities to the peers that may see them in `peers`. */
static void test_ringstat_policy(void)
{
        char policy[256], names[512];
        const char *flags[] = { "--policy", policy, "--socket-mode", "0666", NULL };
        gpuipc_ring_t *theirs, *mine, *root_member;
        HChild *kid;
        RingStat s;
        FILE *f;
        HCase k;

        if (getuid() != 0)
                h_skip("switching uid needs root");
        let_others_reach(h_case_dir());
        snprintf(policy, sizeof(policy), "%s/policy.conf", h_case_dir());
        CHECK((f = fopen(policy, "we")));
        fputs("allow all uid=0\n"
              "allow publish,attach uid=65534 prefix=mine/\n"
              "allow publish uid=65534 prefix=pub/\n",
              f);
        fclose(f);
        h_case_begin(&k, flags);
        let_others_reach(k.broker->dir);
        theirs = make_ring(k.by_prod, "theirs/r", 2, 1, GPUIPC_RING_BACKPRESSURE);
        mine = make_ring(k.by_prod, "mine/r", 2, 2, GPUIPC_RING_BACKPRESSURE);
        CHECK_OK(k.by_cons, gpuipc_ring_join(k.by_cons, "mine/r", H_SOON_MS, &root_member));
        kid = h_spawn("limited", limited_child, k.broker);
        h_child_expect(kid, 'j', H_SOON_MS, NULL, 0);
        /* An administrator of every name sees every ring and every member. */
        ring_names(k.obs, names, sizeof(names));
        CHECKF(strstr(names, "theirs/r ") && strstr(names, "mine/r ") && strstr(names, "pub/own "),
               "the administrator's rings: %s", names);
        ring_stat(k.obs, "mine/r", &s);
        CHECK(s.seat[0].peer != 0 && s.seat[1].peer != 0 && s.seat[1].uid == NOBODY);
        h_child_tell(kid, 'x');
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        gpuipc_ring_close(root_member);
        gpuipc_ring_close(mine);
        gpuipc_ring_close(theirs);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_ringstat_raw_backpressure),
                H_TEST(test_ringstat_raw_latest),
                H_TEST(test_ringstat_raw_stream),
                H_TEST(test_ringstat_waiting_seat),
                H_TEST(test_ringstat_listing_pages),
                H_TEST(test_ringstat_listing_budget),
                H_TEST(test_ringstat_taken_clamped),
                H_TEST(test_ringstat_backpressure_members),
                H_TEST(test_ringstat_latest_members),
                H_TEST(test_ringstat_scribbler_backpressure),
                H_TEST(test_ringstat_scribbler_latest),
                H_TEST(test_ringstat_policy),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
