/* Rings (docs/design.md "Rings"): frames handed over in shared memory, members in processes of
 * their own. Ordering under contention, backpressure and latest-frame mode, a member killed while
 * it holds a frame, one that stalls past the lease, the producer killed, a member scribbling over
 * its own page while the others verify every frame, who may attach a ring's parts, and the fd for
 * event loops. Every frame's every word is checked; a frame that changes while held fails. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "ring.h"

#define SLOT_BYTES (16u << 10)

static uint64_t word_of(uint64_t frame, size_t i)
{
        return (frame << 20) ^ (i * UINT64_C(0x9e3779b97f4a7c15));
}

static void frame_fill(gpuipc_buffer_t *b, uint64_t frame)
{
        uint64_t *w = gpuipc_buffer_ptr(b);

        w[0] = frame;
        for (size_t i = 1; i < gpuipc_buffer_size(b) / 8; i++)
                w[i] = word_of(frame, i);
}

/* True when every word of the slot belongs to frame. */
static bool frame_is(const gpuipc_buffer_t *b, uint64_t frame)
{
        const volatile uint64_t *w = gpuipc_buffer_ptr(b);

        if (w[0] != frame)
                return false;
        for (size_t i = 1; i < gpuipc_buffer_size(b) / 8; i++)
                if (w[i] != word_of(frame, i))
                        return false;
        return true;
}

static gpuipc_ring_t *make_ring(gpuipc_t *c, const char *name, unsigned slots, unsigned members,
                                gpuipc_ring_mode_t mode, unsigned lease_ms)
{
        gpuipc_ring_options_t o = { .struct_size = sizeof(o), .slot_size = SLOT_BYTES, .slots = slots,
                                    .max_members = members, .mode = mode, .lease_ms = lease_ms };
        gpuipc_ring_t *r = NULL;

        CHECK_OK(c, gpuipc_ring_create(c, name, &o, &r));
        return r;
}

/* Publishes frames first..last, each filled with its pattern (frames are numbered from 1). */
static void produce(gpuipc_t *c, gpuipc_ring_t *r, uint64_t first, uint64_t last)
{
        for (uint64_t i = first; i <= last; i++) {
                gpuipc_buffer_t *slot;
                uint64_t frame;

                CHECK_OK(c, gpuipc_ring_acquire(r, H_SOON_MS, &slot));
                frame_fill(slot, i);
                CHECK_OK(c, gpuipc_ring_publish(r, &frame));
                CHECK_EQ(frame, i);
        }
}

typedef struct MemberArg {
        const HBroker *broker;
        const char *ring;
        uint64_t frames;      /* backpressure: take exactly these; latest: until this frame is seen */
        unsigned delay_us;    /* hold each frame this long */
        bool latest, use_fd;
        unsigned spin_us;
} MemberArg;

/* A member in its own process: joins, reports 'j', takes and checks every frame, reports the count. */
static int member(HChan *ch, void *arg)
{
        const MemberArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "ring-member");
        uint64_t taken = 0, expect = 0, last = 0, skipped = 0; /* expect: the next frame, once known */
        gpuipc_ring_t *r = NULL;
        int fd = -1;

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        gpuipc_ring_set_spin(r, a->spin_us);
        if (a->use_fd)
                CHECK((fd = gpuipc_ring_fd(r)) >= 0);
        h_report(ch, 'j', "joined");
        while (a->latest ? last < a->frames : taken < a->frames) {
                gpuipc_buffer_t *slot;
                uint64_t frame;
                int e;

                if (fd >= 0) {
                        struct pollfd p = { fd, POLLIN, 0 };
                        CHECKF(poll(&p, 1, H_SOON_MS) == 1, "the ring fd did not wake");
                        e = gpuipc_ring_take(r, 0, &slot, &frame);
                        if (e == GPUIPC_E_TIMEOUT)
                                continue;
                } else {
                        e = gpuipc_ring_take(r, H_SOON_MS, &slot, &frame);
                }
                /* An open-ended member runs until its producer closes the ring (told by the ring's
                 * state, not by the message). */
                if (e == GPUIPC_E_REVOKED && a->frames == UINT64_MAX && gpuipc_ring_closed(r))
                        break;
                CHECK_OK(c, e);
                CHECK(!gpuipc_ring_closed(r));
                if (a->latest) {
                        CHECKF(frame > last, "frame %" PRIu64 " after %" PRIu64, frame, last);
                        skipped += frame - last - 1;
                        last = frame;
                } else {
                        /* A member joins at some frame, then takes every one after it in order. */
                        CHECKF(!expect || frame == expect, "took frame %" PRIu64 ", expected %" PRIu64, frame,
                               expect);
                        expect = frame + 1;
                }
                CHECKF(frame_is(slot, frame), "frame %" PRIu64 " torn when taken", frame);
                if (a->delay_us)
                        usleep(a->delay_us);
                CHECKF(frame_is(slot, frame), "frame %" PRIu64 " changed while held", frame);
                CHECK_OK(c, gpuipc_ring_release(r));
                taken++;
        }
        h_report(ch, 'd', "%" PRIu64 " %" PRIu64, taken, skipped);
        h_await(ch, 'x', H_SOON_MS);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

/* Waits for a child's 'j' (joined), then lets the producer c read the member-joined event the
 * broker sent before its join reply: the member is seated from the next frame on, so it gets every
 * frame the test publishes from now. */
static void await_join(gpuipc_t *c, HChild *k)
{
        h_child_expect(k, 'j', H_SOON_MS, NULL, 0);
        CHECK_OK(c, gpuipc_process(c));
}

static HChild *spawn_member(gpuipc_t *c, MemberArg *a, const char *name)
{
        HChild *k = h_spawn(name, member, a);

        await_join(c, k);
        return k;
}

/* Collects a member's 'd' report and lets it end. */
static uint64_t member_done(HChild *k, uint64_t *ret_skipped)
{
        char text[64];
        unsigned long long taken = 0, skipped = 0;

        h_child_expect(k, 'd', H_SOON_MS * 3, text, sizeof(text));
        CHECK(sscanf(text, "%llu %llu", &taken, &skipped) == 2);
        h_child_tell(k, 'x');
        h_child_wait_ok(k, H_SOON_MS);
        h_child_free(k);
        if (ret_skipped)
                *ret_skipped = skipped;
        return taken;
}

/* Eight members of an eight-slot ring, some slow: each takes every one of 5000 frames, in order,
 * intact, and the producer never waits for nothing (it is held up only by the slowest). */
static void test_ring_order_under_contention(void)
{
        MemberArg args[8];
        HChild *kids[8];
        gpuipc_ring_t *r;
        gpuipc_t *c;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "rings/contended", 8, 8, GPUIPC_RING_BACKPRESSURE, 5000);
        for (int i = 0; i < 8; i++) {
                args[i] = (MemberArg){ k.broker, "rings/contended", 5000, i % 3 == 0 ? 50 : 0, false, i == 1, 0 };
                kids[i] = spawn_member(c, &args[i], "member");
        }
        produce(c, r, 1, 5000);
        for (int i = 0; i < 8; i++)
                CHECK_EQ(member_done(kids[i], NULL), 5000);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

/* A slow member holds the producer up (it never overwrites what the slow one holds): 200 frames at
 * 2 ms each take at least 400 ms, and the slow member still sees every frame. */
static void test_ring_backpressure(void)
{
        MemberArg slow, fast;
        HChild *ks, *kf;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        uint64_t t0;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "rings/slow", 4, 2, GPUIPC_RING_BACKPRESSURE, 5000);
        slow = (MemberArg){ k.broker, "rings/slow", 200, 2000, false, false, 0 };
        fast = (MemberArg){ k.broker, "rings/slow", 200, 0, false, false, 50 };
        ks = spawn_member(c, &slow, "slow");
        kf = spawn_member(c, &fast, "fast");
        t0 = monotonic_ms();
        produce(c, r, 1, 200);
        h_log("200 frames through a 2 ms member in %" PRIu64 " ms", monotonic_ms() - t0);
        CHECK(monotonic_ms() - t0 >= 200 * 2 - 4 * 2);
        CHECK_EQ(member_done(ks, NULL), 200);
        CHECK_EQ(member_done(kf, NULL), 200);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

/* Latest-frame mode: the producer never waits; a slow member takes the newest frame each time,
 * skipping the rest, and nothing it holds changes. */
static void test_ring_latest(void)
{
        MemberArg slow;
        HChild *ks;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        uint64_t skipped = 0, taken, t0;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "rings/latest", 4, 2, GPUIPC_RING_LATEST, 5000);
        slow = (MemberArg){ k.broker, "rings/latest", 3000, 1000, true, false, 0 };
        ks = spawn_member(c, &slow, "slow");
        t0 = monotonic_ms();
        /* 3000 frames as fast as the producer can: it must never wait for the slow one. */
        produce(c, r, 1, 3000);
        h_log("3000 frames in %" PRIu64 " ms", monotonic_ms() - t0);
        taken = member_done(ks, &skipped);
        h_log("the slow member took %" PRIu64 " frames and skipped %" PRIu64, taken, skipped);
        CHECK(skipped > 0);
        CHECK_EQ(taken + skipped, 3000);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

static int holder_dies(HChan *ch, void *arg)
{
        const MemberArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "doomed-member");
        gpuipc_buffer_t *slot;
        gpuipc_ring_t *r;
        uint64_t frame;

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        h_report(ch, 'j', "joined");
        CHECK_OK(c, gpuipc_ring_take(r, H_SOON_MS, &slot, &frame));
        h_report(ch, 't', "%" PRIu64, frame);
        h_await(ch, 'x', H_SOON_MS * 6); /* killed holding it */
        return 0;
}

/* A member is killed while it holds a frame: its seat (and the slot) come back well within the
 * lease, because the broker sees it die and tells the producer; a new member can take the seat. */
static void test_ring_member_killed_holding(void)
{
        MemberArg a;
        HChild *kid, *again;
        gpuipc_buffer_t *slot;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        uint64_t t0;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "rings/doomed", 2, 1, GPUIPC_RING_BACKPRESSURE, 60000);
        a = (MemberArg){ k.broker, "rings/doomed", 0, 0, false, false, 0 };
        kid = h_spawn("doomed", holder_dies, &a);
        await_join(c, kid);
        produce(c, r, 1, 2); /* it takes frame 1 and holds it; frame 3 would overwrite it */
        h_child_expect(kid, 't', H_SOON_MS, NULL, 0);
        CHECK_ERR(c, gpuipc_ring_acquire(r, 200, &slot), GPUIPC_E_TIMEOUT);
        t0 = monotonic_ms();
        h_child_kill9(kid);
        CHECK_OK(c, gpuipc_ring_acquire(r, H_SOON_MS, &slot));
        h_log("the producer went on %" PRIu64 " ms after the member died (lease 60 s)", monotonic_ms() - t0);
        CHECK(monotonic_ms() - t0 < 5000);
        frame_fill(slot, 3);
        CHECK_OK(c, gpuipc_ring_publish(r, NULL));
        h_child_free(kid);
        /* The seat is free again. */
        a = (MemberArg){ k.broker, "rings/doomed", 10, 0, false, false, 0 };
        again = spawn_member(c, &a, "next");
        for (uint64_t n = 4; n < 14; n++) {
                CHECK_OK(c, gpuipc_ring_acquire(r, H_SOON_MS, &slot));
                frame_fill(slot, n);
                CHECK_OK(c, gpuipc_ring_publish(r, NULL));
        }
        CHECK_EQ(member_done(again, NULL), 10);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

static int staller(HChan *ch, void *arg)
{
        const MemberArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "stalling-member");
        gpuipc_buffer_t *slot;
        gpuipc_ring_t *r;
        uint64_t frame;
        int e;

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        h_report(ch, 'j', "joined");
        CHECK_OK(c, gpuipc_ring_take(r, H_SOON_MS, &slot, &frame));
        h_report(ch, 't', "%" PRIu64, frame);
        h_await(ch, 'g', H_SOON_MS); /* the producer evicted us meanwhile, and overwrote the slot */
        e = gpuipc_ring_release(r);
        h_report(ch, 'r', "%d %s", e, gpuipc_errmsg(c));
        e = gpuipc_ring_take(r, 0, &slot, &frame);
        h_report(ch, 'T', "%d %s", e, gpuipc_errmsg(c));
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

/* A member alive but stuck past the lease is evicted: the producer goes on, and the member learns
 * it: its release says the frame changed, its next take says it was evicted. */
static void test_ring_lease_evicts(void)
{
        MemberArg a;
        HChild *kid;
        gpuipc_buffer_t *slot;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        char text[256];
        uint64_t t0;
        int e;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "rings/lease", 2, 1, GPUIPC_RING_BACKPRESSURE, 300);
        a = (MemberArg){ k.broker, "rings/lease", 0, 0, false, false, 0 };
        kid = h_spawn("staller", staller, &a);
        await_join(c, kid);
        produce(c, r, 1, 2);
        h_child_expect(kid, 't', H_SOON_MS, NULL, 0); /* it holds frame 1: frame 3 needs its slot */
        t0 = monotonic_ms();
        CHECK_OK(c, gpuipc_ring_acquire(r, H_SOON_MS, &slot));
        h_log("evicted after %" PRIu64 " ms (lease 300)", monotonic_ms() - t0);
        CHECK(monotonic_ms() - t0 >= 250);
        frame_fill(slot, 3);
        CHECK_OK(c, gpuipc_ring_publish(r, NULL));
        h_child_tell(kid, 'g');
        h_child_expect(kid, 'r', H_SOON_MS, text, sizeof(text));
        CHECKF(sscanf(text, "%d", &e) == 1 && e == GPUIPC_E_REVOKED && strstr(text, "lease"), "release: %s", text);
        h_child_expect(kid, 'T', H_SOON_MS, text, sizeof(text));
        CHECKF(sscanf(text, "%d", &e) == 1 && e == GPUIPC_E_REVOKED && strstr(text, "evicted"), "take: %s", text);
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

static int ring_producer(HChan *ch, void *arg)
{
        const MemberArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "doomed-producer");
        gpuipc_ring_t *r = make_ring(c, a->ring, 2, 2, GPUIPC_RING_BACKPRESSURE, 60000);

        h_report(ch, 'c', "created");
        /* a->frames frames once told (its member has joined), then nothing until killed. */
        if (a->frames) {
                h_await(ch, 'g', H_SOON_MS);
                CHECK_OK(c, gpuipc_process(c));
                produce(c, r, 1, a->frames);
                h_report(ch, 'p', "published");
                h_await(ch, 'x', H_SOON_MS * 6);
                return 0;
        }
        /* A frame every few milliseconds until killed (it blocks once the member stops taking). */
        for (uint64_t n = 1;; n++) {
                produce(c, r, n, n);
                h_sleep_ms(5);
        }
        return 0;
}

/* Starts ring_producer for a->ring in a child and joins its ring from a new connection of ours. */
static gpuipc_ring_t *join_doomed_producer(const MemberArg *a, HChild **ret_prod, gpuipc_t **ret_c)
{
        gpuipc_ring_t *r = NULL;

        *ret_prod = h_spawn("producer", ring_producer, (void *)a);
        h_child_expect(*ret_prod, 'c', H_SOON_MS, NULL, 0);
        *ret_c = h_connect(a->broker, "member");
        CHECK_OK(*ret_c, gpuipc_ring_join(*ret_c, a->ring, H_SOON_MS, &r));
        return r;
}

/* The producer is killed: a member waiting for the next frame learns it promptly. */
static void test_ring_producer_killed(void)
{
        MemberArg a;
        HChild *prod;
        gpuipc_buffer_t *slot;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        uint64_t frame, t0;
        int e = 0;
        HCase k;

        h_case_begin(&k, NULL);
        a = (MemberArg){ k.broker, "rings/orphan", 0, 0, false, false, 0 };
        r = join_doomed_producer(&a, &prod, &c);
        CHECK_OK(c, gpuipc_ring_take(r, H_SOON_MS, &slot, &frame));
        CHECK(frame_is(slot, frame));
        CHECK_OK(c, gpuipc_ring_release(r));
        t0 = monotonic_ms();
        h_child_kill9(prod);
        /* Frames it published before it died may still be taken (intact) until the news comes. */
        for (int i = 0; i < 3 && (e = gpuipc_ring_take(r, H_SOON_MS, &slot, &frame)) == 0; i++) {
                CHECK(frame_is(slot, frame));
                CHECK_OK(c, gpuipc_ring_release(r));
        }
        CHECK_ERR(c, e, GPUIPC_E_REVOKED);
        CHECK(!gpuipc_ring_closed(r)); /* lost, not closed */
        h_log("the member heard %" PRIu64 " ms after: %s", monotonic_ms() - t0, gpuipc_errmsg(c));
        CHECK(monotonic_ms() - t0 < 2000);
        gpuipc_ring_close(r);
        h_child_free(prod);
        gpuipc_close(c);
        h_case_end(&k);
}

/* An event-loop member whose producer dies while no frame comes: its ring fd becomes readable (the
 * library's helper thread sees the broker's news on the socket), and take says why. */
static void test_ring_fd_producer_killed(void)
{
        struct pollfd p = { .events = POLLIN };
        MemberArg a;
        HChild *prod;
        gpuipc_buffer_t *slot;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        uint64_t frame, t0;
        HCase k;

        h_case_begin(&k, NULL);
        a = (MemberArg){ k.broker, "rings/orphan-fd", 1, 0, false, true, 0 };
        r = join_doomed_producer(&a, &prod, &c);
        CHECK((p.fd = gpuipc_ring_fd(r)) >= 0);
        h_child_tell(prod, 'g');
        h_child_expect(prod, 'p', H_SOON_MS, NULL, 0);
        CHECK_OK(c, gpuipc_ring_take(r, H_SOON_MS, &slot, &frame));
        CHECK(frame == 1 && frame_is(slot, frame));
        CHECK_OK(c, gpuipc_ring_release(r));
        /* Take until there is nothing, which resets the fd; the helper thread may still say once
         * more that frame 1 came (a wake-up for nothing, which the fd allows). Then it is quiet. */
        CHECK_ERR(c, gpuipc_ring_take(r, 0, &slot, &frame), GPUIPC_E_TIMEOUT);
        for (int i = 0; i < 5 && poll(&p, 1, 300) == 1; i++)
                CHECK_ERR(c, gpuipc_ring_take(r, 0, &slot, &frame), GPUIPC_E_TIMEOUT);
        CHECK_EQ(poll(&p, 1, 300), 0);
        t0 = monotonic_ms();
        h_child_kill9(prod);
        CHECKF(poll(&p, 1, H_SOON_MS) == 1, "the ring fd stayed quiet after the producer died");
        CHECK_ERR(c, gpuipc_ring_take(r, 0, &slot, &frame), GPUIPC_E_REVOKED);
        h_log("the fd woke %" PRIu64 " ms after the producer died: %s", monotonic_ms() - t0, gpuipc_errmsg(c));
        CHECK(monotonic_ms() - t0 < 2000);
        gpuipc_ring_close(r);
        h_child_free(prod);
        gpuipc_close(c);
        h_case_end(&k);
}

/* Who may attach a ring's parts: members only, a member page only its own member, never by name. */
static void test_ring_parts_are_private(void)
{
        MemberArg a;
        HChild *kid;
        gpuipc_buffer_t *b;
        gpuipc_ring_t *r;
        gpuipc_t *c, *other;
        uint64_t ids[8];
        char names[8][PROTO_MAX_NAME + 1];
        unsigned n;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "rings/private", 2, 2, GPUIPC_RING_BACKPRESSURE, 5000);
        a = (MemberArg){ k.broker, "rings/private", 1, 0, false, false, 0 };
        kid = spawn_member(c, &a, "member");
        other = h_connect(k.broker, "outsider");
        n = h_list_ids(other, "rings/private@", ids, names, 8);
        CHECK_EQ(n, 1 + 2 + 2);
        for (unsigned i = 0; i < n; i++) {
                int e = gpuipc_attach_id(other, ids[i], &b);

                CHECKF(e == GPUIPC_E_DENIED, "an outsider attached %s: %d", names[i], e);
                CHECK_ERR(other, gpuipc_attach(other, names[i], 0, &b), GPUIPC_E_NOT_FOUND);
        }
        /* A member may attach the control page and the slots, but not another seat's page. */
        CHECKF(strstr(names[4], "@member.1"), "the last part is %s", names[4]);
        produce(c, r, 1, 1);
        CHECK_EQ(member_done(kid, NULL), 1);
        gpuipc_ring_close(r);
        gpuipc_close(other);
        gpuipc_close(c);
        h_case_end(&k);
}

typedef struct ForgeArg {
        const HBroker *broker;
        const char *ring;
} ForgeArg;

/* The id of a member page of the ring the broker lists, other than `except` (0: none). */
static uint64_t member_page_id(gpuipc_t *c, const char *ring, uint64_t except)
{
        char names[8][PROTO_MAX_NAME + 1];
        uint64_t ids[8];
        unsigned n = h_list_ids(c, ring, ids, names, 8);

        for (unsigned i = 0; i < n && i < 8; i++)
                if (strstr(names[i], "@member.") && ids[i] != except)
                        return ids[i];
        return 0;
}

/* A member that leaves the ring but keeps its page mapped, then writes on it as if whoever sits in
 * its seat next had released every frame. */
static int forger(HChan *ch, void *arg)
{
        const ForgeArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "forger");
        gpuipc_buffer_t *page = NULL;
        volatile RingMember *m;
        gpuipc_ring_t *r;
        uint64_t t0;

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        page = h_ring_own_page(c, a->ring);
        h_report(ch, 'j', "%" PRIu64, gpuipc_buffer_id(page));
        gpuipc_ring_close(r); /* the seat is free for the next member; the mapping stays ours */
        h_report(ch, 'l', "left");
        h_await(ch, 'f', H_SOON_MS);
        m = gpuipc_buffer_ptr(page);
        for (t0 = monotonic_ms(); monotonic_ms() - t0 < 1000;) {
                m->held = 0;
                __atomic_store_n(&m->released, UINT64_MAX >> 2, __ATOMIC_RELEASE);
                __atomic_fetch_add(&m->wake, 1, __ATOMIC_RELEASE);
                usleep(100);
        }
        h_report(ch, 's', "forged");
        gpuipc_release(c, page);
        gpuipc_close(c);
        return 0;
}

/* A member that takes one frame and holds it until told, then checks it and releases it. */
static int holder(HChan *ch, void *arg)
{
        const MemberArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "holder");
        gpuipc_buffer_t *slot;
        gpuipc_ring_t *r;
        uint64_t frame;
        bool intact;
        int e;

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        h_report(ch, 'j', "joined");
        CHECK_OK(c, gpuipc_ring_take(r, H_SOON_MS, &slot, &frame));
        h_report(ch, 't', "%" PRIu64, frame);
        h_await(ch, 'x', H_SOON_MS * 2);
        intact = frame_is(slot, frame);
        e = gpuipc_ring_release(r);
        h_report(ch, 'r', "%d %d", e, intact);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

/* A member page is never handed to the seat's next member: one that left (or was evicted, or whose
 * membership the broker ended) may still have the old page mapped, and could otherwise speak for
 * the next member (here: "everything released" while it holds frame 1). The broker lets go of the
 * page when the membership ends and hands the seat out again only once the producer has registered
 * a new one; the producer keeps waiting for the real holder. */
static void test_ring_seat_page_renewed(void)
{
        MemberArg ha;
        ForgeArg fa;
        HChild *bad, *kid;
        gpuipc_buffer_t *slot;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        char text[64];
        uint64_t old_page, t0, page = 0;
        int e, intact;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "rings/forged", 2, 1, GPUIPC_RING_BACKPRESSURE, 60000);
        fa = (ForgeArg){ k.broker, "rings/forged" };
        bad = h_spawn("forger", forger, &fa);
        h_child_expect(bad, 'j', H_SOON_MS, text, sizeof(text));
        old_page = strtoull(text, NULL, 10);
        CHECK_OK(c, gpuipc_process(c));
        h_child_expect(bad, 'l', H_SOON_MS, NULL, 0);
        /* The producer hears that the member left and renews the seat in its next call. */
        for (t0 = monotonic_ms(); monotonic_ms() - t0 < 2000; h_sleep_ms(2)) {
                CHECK((e = gpuipc_process(c)) >= 0);
                page = member_page_id(c, "rings/forged@member.", old_page);
                if (page)
                        break;
        }
        h_log("the seat's page was %" PRIu64 ", is %" PRIu64 " after %" PRIu64 " ms", old_page, page,
              monotonic_ms() - t0);
        ha = (MemberArg){ k.broker, "rings/forged", 1, 0, false, false, 0 };
        kid = h_spawn("holder", holder, &ha);
        await_join(c, kid);
        produce(c, r, 1, 2);
        h_child_expect(kid, 't', H_SOON_MS, NULL, 0); /* it holds frame 1: frame 3 needs its slot */
        h_child_tell(bad, 'f');
        h_sleep_ms(50);
        CHECK_ERR(c, gpuipc_ring_acquire(r, 500, &slot), GPUIPC_E_TIMEOUT);
        h_child_expect(bad, 's', H_SOON_MS, NULL, 0);
        h_child_tell(kid, 'x');
        h_child_expect(kid, 'r', H_SOON_MS, text, sizeof(text));
        CHECKF(sscanf(text, "%d %d", &e, &intact) == 2 && e == 0 && intact, "the holder's release: %s", text);
        CHECK_OK(c, gpuipc_ring_acquire(r, H_SOON_MS, &slot));
        frame_fill(slot, 3);
        CHECK_OK(c, gpuipc_ring_publish(r, NULL));
        h_child_wait_ok(bad, H_SOON_MS);
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(bad);
        h_child_free(kid);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

/* A member driven by an event loop: poll on gpuipc_ring_fd(), take with timeout 0. */
static void test_ring_fd(void)
{
        MemberArg a;
        HChild *kid;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "rings/fd", 4, 1, GPUIPC_RING_BACKPRESSURE, 5000);
        a = (MemberArg){ k.broker, "rings/fd", 500, 0, false, true, 0 };
        kid = spawn_member(c, &a, "poller");
        for (uint64_t n = 1; n <= 500; n++) {
                gpuipc_buffer_t *slot;

                CHECK_OK(c, gpuipc_ring_acquire(r, H_SOON_MS, &slot));
                frame_fill(slot, n);
                CHECK_OK(c, gpuipc_ring_publish(r, NULL));
                if (n % 50 == 0)
                        h_sleep_ms(5); /* let it sleep on the fd now and then */
        }
        CHECK_EQ(member_done(kid, NULL), 500);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

typedef struct ScribbleArg {
        const HBroker *broker;
        const char *ring;
        unsigned ms;
} ScribbleArg;

/* A member that writes garbage over its own page: random bytes, values that look plausible (its
 * epoch, released counts far ahead or behind), its wake word bumped without end, "sleeping" set. */
static int scribbler(HChan *ch, void *arg)
{
        const ScribbleArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "scribbler");
        uint64_t t0, *words = NULL;
        gpuipc_buffer_t *page = NULL;
        gpuipc_ring_t *r;
        unsigned seed = (unsigned)getpid();
        char text[256];

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        /* Our own page is the one member page we may attach (writable, as every member's is). */
        page = h_ring_own_page(c, a->ring);
        words = gpuipc_buffer_ptr(page);
        h_report(ch, 'j', "joined");
        t0 = monotonic_ms();
        while (monotonic_ms() - t0 < a->ms) {
                unsigned what = (unsigned)rand_r(&seed) % 4;

                for (unsigned i = 0; i < 8; i++) {
                        uint64_t v = (uint64_t)rand_r(&seed) << 32 | (uint64_t)rand_r(&seed);
                        if (what == 1)
                                v &= 0xff; /* small numbers: a plausible epoch, a frame long gone */
                        else if (what == 2)
                                v = UINT64_MAX - (v & 0xff);
                        words[i] = v;
                }
                if (what == 3)
                        for (unsigned i = 0; i < 1000; i++)
                                __atomic_fetch_add((uint32_t *)&words[3], 1, __ATOMIC_RELEASE);
                if (rand_r(&seed) % 16 == 0)
                        usleep(100);
        }
        snprintf(text, sizeof(text), "scribbled");
        h_report(ch, 's', "%s", text);
        gpuipc_release(c, page);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

static void scribble_case(gpuipc_ring_mode_t mode, unsigned ms)
{
        MemberArg honest[2];
        ScribbleArg sa;
        HChild *kids[2], *bad;
        gpuipc_ring_t *r;
        gpuipc_t *c;
        uint64_t t0, n = 0, taken, skipped;
        const char *name = mode == GPUIPC_RING_LATEST ? "rings/scribbled-latest" : "rings/scribbled";
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        /* The lease bounds how long the scribbler can hold the producer up; the honest members must
         * never need it, even starved of CPU by the scribbler's spinning on a loaded machine (at
         * 500 ms a sanitizer build on two busy cores evicted one of them). */
        r = make_ring(c, name, mode == GPUIPC_RING_LATEST ? 5 : 4, 3, mode, 5000);
        sa = (ScribbleArg){ k.broker, name, ms };
        bad = h_spawn("scribbler", scribbler, &sa);
        await_join(c, bad);
        for (int i = 0; i < 2; i++) {
                honest[i] = (MemberArg){ k.broker, name, UINT64_MAX, (unsigned)i * 200, mode == GPUIPC_RING_LATEST,
                                         false, 0 };
                kids[i] = spawn_member(c, &honest[i], "honest");
        }
        /* Frames for as long as the scribbler scribbles, and a little longer. */
        t0 = monotonic_ms();
        while (monotonic_ms() - t0 < ms + 500) {
                gpuipc_buffer_t *slot;

                CHECK_OK(c, gpuipc_ring_acquire(r, H_SOON_MS, &slot));
                frame_fill(slot, ++n);
                CHECK_OK(c, gpuipc_ring_publish(r, NULL));
        }
        h_child_expect(bad, 's', H_SOON_MS, NULL, 0);
        h_child_wait_ok(bad, H_SOON_MS);
        h_child_free(bad);
        /* The honest members took frames all along, in order, intact (their own checks); stop them. */
        gpuipc_ring_close(r);
        for (int i = 0; i < 2; i++) {
                char text[64];

                h_child_expect(kids[i], 'd', H_SOON_MS, text, sizeof(text));
                h_log("honest member %d: %s (taken, skipped) of %" PRIu64 " frames", i, text, n);
                CHECK(sscanf(text, "%" SCNu64 " %" SCNu64, &taken, &skipped) == 2 && taken > 0);
                h_child_tell(kids[i], 'x');
                h_child_wait_ok(kids[i], H_SOON_MS);
                h_child_free(kids[i]);
        }
        CHECK(n > 1000);
        CHECK_OK(k.obs, gpuipc_ping(k.obs, H_SOON_MS)); /* the broker is fine */
        gpuipc_close(c);
        h_case_end(&k);
}

/* A member scribbles over its own page for half a minute in each mode (GPUIPC_SCRIBBLE_MS): the
 * other members keep taking every frame (backpressure) or the newest (latest) intact, the producer
 * keeps publishing (the scribbler at worst holds it up until the lease evicts it), the broker is
 * unaffected. */
static unsigned scribble_ms(void)
{
        const char *env = getenv("GPUIPC_SCRIBBLE_MS");
        return env ? (unsigned)strtoul(env, NULL, 10) : 30000;
}

/* A member scribbling over its own page cannot stall or corrupt a backpressure ring: honest members take every
 * frame in order and intact, and the broker stays fine. */
static void test_ring_scribbler_backpressure(void)
{
        scribble_case(GPUIPC_RING_BACKPRESSURE, scribble_ms());
}

/* The same for a latest-mode ring. */
static void test_ring_scribbler_latest(void)
{
        scribble_case(GPUIPC_RING_LATEST, scribble_ms());
}

/* A consumer that attaches a buffer by name and releases it at once. */
static int attach_release(HChan *ch, void *arg)
{
        const MemberArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "attacher");
        gpuipc_buffer_t *b;

        CHECK_OK(c, gpuipc_attach(c, a->ring, H_SOON_MS, &b));
        CHECK_OK(c, gpuipc_release(c, b));
        h_report(ch, 'r', "released");
        gpuipc_close(c);
        return 0;
}

/* A connection with a ring has the library's ring thread reading its socket: an event the thread
 * read for the caller (here a buffer's drained) still makes gpuipc_fd() readable, until the caller
 * took it, so an event loop on gpuipc_fd() misses nothing. */
static void test_ring_thread_keeps_gpuipc_fd_readable(void)
{
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .retire_after = 1 };
        struct pollfd p = { .events = POLLIN };
        gpuipc_buffer_t *b;
        gpuipc_ring_t *r;
        gpuipc_event_t ev;
        gpuipc_t *c;
        MemberArg a;
        HChild *kid;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "loop-producer");
        r = make_ring(c, "rings/loop", 2, 1, GPUIPC_RING_BACKPRESSURE, 60000);
        CHECK_OK(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, 4096, 0, &b));
        CHECK_OK(c, gpuipc_publish(c, b, "loop/buf", &po));
        a = (MemberArg){ k.broker, "loop/buf", 0, 0, false, false, 0 };
        kid = h_spawn("attacher", attach_release, &a);
        h_child_expect(kid, 'r', H_SOON_MS, NULL, 0);
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        h_sleep_ms(200); /* by now the ring thread has read the drained event off the socket */
        p.fd = gpuipc_fd(c);
        CHECKF(poll(&p, 1, H_SOON_MS) == 1, "gpuipc_fd() stayed quiet with an event queued");
        CHECK(gpuipc_process(c) >= 1);
        CHECK_OK(c, gpuipc_next_event(c, 0, &ev));
        CHECKF(ev.type == GPUIPC_EVENT_DRAINED, "event %s", gpuipc_event_name(ev.type));
        CHECK(gpuipc_process(c) == 0);
        CHECKF(poll(&p, 1, 0) == 0, "gpuipc_fd() still readable with nothing queued");
        CHECK_OK(c, gpuipc_buffer_free(c, b));
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

/* The state of this process's ring threads (named "gpuipc-ring" once they run), as /proc says: 1
 * when one sleeps in poll(2) on nfds descriptors (its kick eventfd alone: 1; with the broker's
 * socket too: 2), 0 when none does (yet), -1 when /proc does not show a ring thread's system call. */
static int ring_thread_polls(unsigned long nfds)
{
        DIR *d = opendir("/proc/self/task");
        struct dirent *e;
        int seen = 0;

        CHECK(d);
        while (seen < 1 && (e = readdir(d))) {
                char path[300], comm[32] = "";
                unsigned long fds, n;
                long nr;
                FILE *f;

                if (e->d_name[0] == '.')
                        continue;
                snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
                if (!(f = fopen(path, "re")))
                        continue;
                if (!fgets(comm, sizeof(comm), f))
                        comm[0] = 0;
                fclose(f);
                if (strcmp(comm, "gpuipc-ring\n") != 0)
                        continue;
                snprintf(path, sizeof(path), "/proc/self/task/%s/syscall", e->d_name);
                if (!(f = fopen(path, "re"))) {
                        seen = errno == ENOENT ? seen : -1; /* ENOENT: it ended meanwhile */
                        continue;
                }
                if (fscanf(f, "%ld %lx %lx", &nr, &fds, &n) == 3 && n == nfds &&
#ifdef SYS_poll
                    (nr == SYS_poll || nr == SYS_ppoll)
#else
                    nr == SYS_ppoll
#endif
                )
                        seen = 1;
                fclose(f);
        }
        closedir(d);
        return seen;
}

/* A connection whose rings were all closed has its ring thread asleep without the socket (the
 * caller's own calls read it then). The next ring made on it must have the thread read the socket
 * again: a producer that only acquires and publishes hears its members join from the thread alone,
 * and a member it never hears of is never seated. The test waits for the thread to sleep without
 * the socket, then makes the ring and never reads the socket itself. */
static void test_ring_thread_watches_again(void)
{
        gpuipc_buffer_t *slot, *news;
        gpuipc_ring_t *r;
        gpuipc_t *c, *other;
        MemberArg a;
        HChild *kid;
        uint64_t t0, n = 0;
        char text[64];
        int e, intact;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        gpuipc_ring_close(make_ring(c, "rings/first", 2, 1, GPUIPC_RING_BACKPRESSURE, 60000));
        /* News for c that nobody reads: the thread wakes for it, finds no ring, sleeps without the
         * socket. */
        CHECK_OK(c, gpuipc_subscribe(c, "news/", NULL));
        other = h_connect(k.broker, "newsmaker");
        CHECK_OK(other, gpuipc_buffer_alloc(other, GPUIPC_KIND_MEMFD, 4096, 0, &news));
        CHECK_OK(other, gpuipc_publish(other, news, "news/item", NULL));
        for (t0 = monotonic_ms(); (e = ring_thread_polls(1)) != 1; h_sleep_ms(2)) {
                if (e < 0)
                        h_skip("/proc shows no system call of the ring thread");
                CHECKF(monotonic_ms() - t0 < H_SOON_MS, "the ring thread never slept without the socket");
        }
        r = make_ring(c, "rings/second", 2, 1, GPUIPC_RING_BACKPRESSURE, 60000);
        a = (MemberArg){ k.broker, "rings/second", 1, 0, false, false, 0 };
        kid = h_spawn("holder", holder, &a);
        h_child_expect(kid, 'j', H_SOON_MS, NULL, 0);
        /* Frames until the member took one: only once the producer has seated it. */
        for (t0 = monotonic_ms(); h_child_quiet(kid); h_sleep_ms(1)) {
                CHECKF(monotonic_ms() - t0 < H_SOON_MS * 2, "the member took nothing: it was never seated");
                e = gpuipc_ring_acquire(r, 0, &slot);
                if (e == GPUIPC_E_TIMEOUT)
                        continue; /* it holds a frame already: its report is on the way */
                CHECK_OK(c, e);
                frame_fill(slot, ++n);
                CHECK_OK(c, gpuipc_ring_publish(r, NULL));
        }
        h_child_expect(kid, 't', H_SOON_MS, NULL, 0);
        h_child_tell(kid, 'x');
        h_child_expect(kid, 'r', H_SOON_MS, text, sizeof(text));
        CHECKF(sscanf(text, "%d %d", &e, &intact) == 2 && e == 0 && intact, "the holder's release: %s", text);
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        gpuipc_ring_close(r);
        CHECK_OK(other, gpuipc_buffer_free(other, news));
        gpuipc_close(other);
        gpuipc_close(c);
        h_case_end(&k);
}

/* What a child forked from a process with rings does first: start a thread and allocate, in sizes
 * from small to a few pages, in both threads. */
static void *allocate_some(void *arg)
{
        for (size_t size = 16; size <= 65536; size *= 2)
                free(malloc(size));
        return arg;
}

static int forked_child_work(void)
{
        pthread_t t;

        allocate_some(NULL);
        if (pthread_create(&t, NULL, allocate_some, NULL) != 0)
                return 2;
        pthread_join(t, NULL);
        return 0;
}

/* A process forks (without exec) right after ring calls that started threads of the library's (a
 * join starts the connection's ring thread, gpuipc_ring_fd its helper): whatever those threads do
 * at that instant, the child can allocate and start threads. A lock one of them held at the fork
 * would stay held in the child for good; glibc's allocator guards against that itself,
 * AddressSanitizer's does not, and there such children hung within a few rounds. */
static void test_ring_fork_beside_library_threads(void)
{
        gpuipc_ring_t *r;
        gpuipc_t *c;
        HCase k;

        h_case_begin(&k, NULL);
        c = h_connect(k.broker, "ring-producer");
        r = make_ring(c, "rings/forked", 3, 1, GPUIPC_RING_LATEST, 60000);
        for (int round = 0; round < 300; round++) {
                gpuipc_t *m = h_connect(k.broker, "member");
                gpuipc_ring_t *mr = NULL;
                uint64_t t0;
                int status = 0;
                pid_t pid, got;

                CHECK_OK(m, gpuipc_ring_join(m, "rings/forked", H_SOON_MS, &mr));
                if (round % 2)
                        CHECK(gpuipc_ring_fd(mr) >= 0);
                pid = fork();
                CHECK(pid >= 0);
                if (pid == 0)
                        _exit(forked_child_work());
                for (t0 = monotonic_ms(); (got = waitpid(pid, &status, WNOHANG)) == 0; h_sleep_ms(1)) {
                        if (monotonic_ms() - t0 >= H_SOON_MS) {
                                kill(pid, SIGKILL);
                                waitpid(pid, &status, 0);
                                h_fail(__FILE__, __LINE__, "round %d: the child forked after a join hung for %d ms",
                                       round, H_SOON_MS);
                        }
                }
                CHECKF(got == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "round %d: the child ended with "
                       "status 0x%x", round, status);
                gpuipc_ring_close(mr);
                gpuipc_close(m);
        }
        gpuipc_ring_close(r);
        gpuipc_close(c);
        h_case_end(&k);
}

/* ---- a broker restart with a ring live ---- */

typedef struct LiveShared {
        atomic_bool stop;
        atomic_uint_fast64_t published, taken[2], during_outage[2];
        atomic_bool broker_down;
} LiveShared;

typedef struct LiveArg {
        const HBroker *broker;
        LiveShared *sh;
        int idx;
} LiveArg;

static gpuipc_t *connect_reconnecting(const HBroker *b, const char *label)
{
        gpuipc_options_t o = { .struct_size = sizeof(o), .label = label,
                               .connect_timeout_ms = H_SOON_MS };
        gpuipc_t *c = NULL;
        int r = h_try_connect(b, &o, &c);

        CHECKF(r == 0, "connect: %s [%s]", gpuipc_strerror(r), gpuipc_errmsg(NULL));
        return c;
}

static int live_producer(HChan *ch, void *arg)
{
        const LiveArg *a = arg;
        gpuipc_t *c = connect_reconnecting(a->broker, "live-producer");
        gpuipc_ring_t *r = make_ring(c, "rings/live", 4, 2, GPUIPC_RING_BACKPRESSURE, 20000);

        h_report(ch, 'c', "created");
        for (uint64_t n = 1; !atomic_load(&a->sh->stop); n++) {
                gpuipc_buffer_t *slot;

                CHECK_OK(c, gpuipc_ring_acquire(r, H_SOON_MS, &slot));
                frame_fill(slot, n);
                CHECK_OK(c, gpuipc_ring_publish(r, NULL));
                atomic_store(&a->sh->published, n);
                usleep(200);
        }
        h_report(ch, 'd', "done");
        h_await(ch, 'x', H_SOON_MS);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

static int live_member(HChan *ch, void *arg)
{
        const LiveArg *a = arg;
        gpuipc_t *c = connect_reconnecting(a->broker, "live-member");
        uint64_t expect = 0;
        gpuipc_ring_t *r;

        CHECK_OK(c, gpuipc_ring_join(c, "rings/live", H_SOON_MS, &r));
        h_report(ch, 'j', "joined");
        /* Until the producer stops and every frame it published is taken. */
        while (!atomic_load(&a->sh->stop) || expect <= atomic_load(&a->sh->published)) {
                gpuipc_buffer_t *slot;
                uint64_t frame;
                int e = gpuipc_ring_take(r, 200, &slot, &frame);

                if (e == GPUIPC_E_TIMEOUT)
                        continue;
                CHECK_OK(c, e);
                CHECKF(!expect || frame == expect, "took frame %" PRIu64 ", expected %" PRIu64, frame, expect);
                CHECKF(frame_is(slot, frame), "frame %" PRIu64 " torn", frame);
                expect = frame + 1;
                /* Member 1 is slower than the producer: a frame always waits for it, so only its
                 * ring calls themselves can notice the broker restart and take its seat back. */
                if (a->idx == 1)
                        usleep(2000);
                CHECK_OK(c, gpuipc_ring_release(r));
                atomic_fetch_add(&a->sh->taken[a->idx], 1);
                if (atomic_load(&a->sh->broker_down))
                        atomic_fetch_add(&a->sh->during_outage[a->idx], 1);
        }
        h_report(ch, 'd', "done");
        h_await(ch, 'x', H_SOON_MS);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

/* The broker is killed while a ring runs: frames keep flowing while it is away (they never needed
 * it), and once it is back the producer declares the ring again and the members take their seats
 * back, the slow one too (it never waits for a frame); no frame is lost or torn, and the broker
 * counts the ring and both members again. */
static void test_ring_broker_restart(void)
{
        static const char *const flags[] = { "--restart-grace-ms", "3000", NULL };
        LiveShared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        LiveArg pa, ma[2];
        HChild *prod, *mem[2];
        uint64_t before, t0;
        gpuipc_t *obs;
        HBroker *b;

        CHECK(sh != MAP_FAILED);
        memset(sh, 0, sizeof(*sh));
        b = h_broker_start(flags);
        pa = (LiveArg){ b, sh, 0 };
        prod = h_spawn("producer", live_producer, &pa);
        h_child_expect(prod, 'c', H_SOON_MS, NULL, 0);
        for (int i = 0; i < 2; i++) {
                ma[i] = (LiveArg){ b, sh, i };
                mem[i] = h_spawn("member", live_member, &ma[i]);
                h_child_expect(mem[i], 'j', H_SOON_MS, NULL, 0);
        }
        WAIT_UNTIL(atomic_load(&sh->taken[0]) > 100 && atomic_load(&sh->taken[1]) > 100, H_SOON_MS);

        h_broker_kill9(b);
        atomic_store(&sh->broker_down, true);
        before = atomic_load(&sh->published);
        h_sleep_ms(500);
        atomic_store(&sh->broker_down, false);
        h_log("during the outage: %" PRIu64 " frames published, %" PRIu64 " and %" PRIu64 " taken",
              atomic_load(&sh->published) - before, atomic_load(&sh->during_outage[0]),
              atomic_load(&sh->during_outage[1]));
        CHECK(atomic_load(&sh->published) - before > 50);
        CHECK(atomic_load(&sh->during_outage[0]) > 50 && atomic_load(&sh->during_outage[1]) > 50);

        h_broker_restart(b);
        obs = h_connect(b, "observer");
        t0 = monotonic_ms();
        WAIT_UNTIL(h_stats(obs, "rings") == 1 && h_stats(obs, "ring_members") == 2, H_SOON_MS);
        h_log("ring and seats back %" PRIu64 " ms after the restart", monotonic_ms() - t0);
        before = atomic_load(&sh->taken[0]);
        WAIT_UNTIL(atomic_load(&sh->taken[0]) > before + 100, H_SOON_MS);

        atomic_store(&sh->stop, true);
        h_child_expect(prod, 'd', H_SOON_MS, NULL, 0);
        for (int i = 0; i < 2; i++)
                h_child_expect(mem[i], 'd', H_SOON_MS, NULL, 0);
        h_log("%" PRIu64 " frames; the members took %" PRIu64 " and %" PRIu64, atomic_load(&sh->published),
              atomic_load(&sh->taken[0]), atomic_load(&sh->taken[1]));
        h_child_tell(prod, 'x');
        for (int i = 0; i < 2; i++) {
                h_child_tell(mem[i], 'x');
                h_child_wait_ok(mem[i], H_SOON_MS);
                h_child_free(mem[i]);
        }
        h_child_wait_ok(prod, H_SOON_MS);
        h_child_free(prod);
        gpuipc_close(obs);
        h_broker_settle(b);
        h_broker_stop(b);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_ring_order_under_contention),
                H_TEST(test_ring_backpressure),
                H_TEST(test_ring_latest),
                H_TEST(test_ring_member_killed_holding),
                H_TEST(test_ring_lease_evicts),
                H_TEST(test_ring_producer_killed),
                H_TEST(test_ring_fd_producer_killed),
                H_TEST(test_ring_parts_are_private),
                H_TEST(test_ring_seat_page_renewed),
                H_TEST(test_ring_fd),
                H_TEST(test_ring_thread_keeps_gpuipc_fd_readable),
                H_TEST(test_ring_thread_watches_again),
                H_TEST(test_ring_fork_beside_library_threads),
                H_TEST(test_ring_broker_restart),
                H_TEST(test_ring_scribbler_backpressure),
                H_TEST(test_ring_scribbler_latest),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
