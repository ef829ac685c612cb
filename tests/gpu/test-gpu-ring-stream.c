/* Stream-ordered rings (GPUIPC_RING_STREAM): the hand-over between a producer and its members
 * happens in their CUDA streams, on counters in cuda-vmm memory; the host only queues.
 *
 * Every frame is written so that a broken order shows: the producer's stream first covers the slot
 * with junk, then runs a while (memsets of a scratch buffer), then writes the frame's value; every
 * member's stream waits, runs a while itself, then copies the slot out and releases it. A producer
 * stream that overwrote a slot before a member's copy finished, or a member stream that copied
 * before the frame was written, leaves junk or another frame's value in the copy. K is 2 slots, so
 * the producer is never far from overwriting.
 *
 * The faults: a member that takes a frame and never releases it (evicted after the lease, the
 * producer's stream goes on), a member killed while it holds a frame (its seat let go at once, long
 * before the lease), a producer killed with member streams queued behind frames it will never
 * write (they are let through; the member hears that its producer is gone).
 *
 * On a machine without a GPU the 'gpu' suite skips this; the integration suite runs the same cases
 * on the host stand-in for libcuda (tests/bench/fakecuda.c), whose streams are worker threads, so
 * the plumbing and the order are checked everywhere. */
#include <inttypes.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gpu.h"

#define SLOT      (4u << 20)
#define WORDS     (SLOT / 4)
#define SCRATCH   (16u << 20)
#define SLOW      2 /* scratch memsets per frame, on each side */
#define RING      "rs/frames"
#define START_MS  30000

/* Shared with the case process (an anonymous shared mapping): how far each member got, and when to
 * stop. */
typedef struct Progress {
        _Atomic uint64_t taken[2];
        _Atomic bool stop;
} Progress;

typedef struct StreamArg {
        const HBroker *broker;
        uint64_t frames;   /* the producer publishes this many, or (0) until told 'x' */
        unsigned lease_ms; /* 0: the library's default */
        unsigned members;
        uint64_t takes;    /* a member takes this many (0: one, never released: a staller) */
        bool reconnect;    /* through a broker restart */
        Progress *progress; /* a member takes frames until progress->stop (takes is ignored) */
        int idx;            /* ... counting them in progress->taken[idx] */
} StreamArg;

static uint32_t value_of(uint64_t frame)
{
        return 0x5a000000u + (uint32_t)frame;
}

#define JUNK 0xdeadbeefu

/* Whether the parent sent us something (a command we then read with h_await). */
static bool told(HChan *ch)
{
        struct pollfd p = { .fd = ch->rd, .events = POLLIN };

        return poll(&p, 1, 0) == 1;
}

static GcuStream stream_new(void)
{
        GcuStream s = NULL;

        gpu_push(0);
        CHECK_CU(CU(cuStreamCreate, &s, GCU_STREAM_NON_BLOCKING));
        gpu_pop();
        return s;
}

static void stream_free(GcuStream s)
{
        gpu_push(0);
        CHECK_CU(CU(cuStreamSynchronize, s));
        CHECK_CU(CU(cuStreamDestroy, s));
        gpu_pop();
}

static gpuipc_t *connect_to(const StreamArg *a, const char *label)
{
        gpuipc_options_t o = { .struct_size = sizeof(o), .socket_path = a->broker->sock, .label = label,
                               .no_reconnect = !a->reconnect };
        gpuipc_t *c = NULL;
        int r;

        if (!a->reconnect)
                return gpu_connect(a->broker, label);
        r = gpuipc_connect(&c, &o);
        CHECKF(r == 0, "connect: %s [%s]", gpuipc_strerror(r), gpuipc_errmsg(NULL));
        return c;
}

/* GPU work that takes a while, so that the other side gets ahead of this stream. */
static void slow_work(GcuDevicePtr scratch, GcuStream s)
{
        for (int k = 0; k < SLOW; k++)
                CHECK_CU(GX(cuMemsetD32Async, scratch, (unsigned)k, SCRATCH / 4, s));
}

/* The producer: creates the ring, reports 'p', waits for 'g' (then reads the member-joined events:
 * the members are seated from frame 1), publishes, reports 'd' with the count, waits for 'x'. */
static int producer(HChan *ch, void *arg)
{
        const StreamArg *a = arg;
        gpuipc_ring_options_t o = { .struct_size = sizeof(o), .kind = GPUIPC_KIND_CUDA_VMM, .slot_size = SLOT,
                                    .slots = 2, .max_members = a->members, .mode = GPUIPC_RING_STREAM,
                                    .lease_ms = a->lease_ms };
        GcuDevicePtr scratch;
        gpuipc_ring_t *r;
        bool stop = false;
        uint64_t n = 0;
        GcuStream s;
        gpuipc_t *c;

        gpu_init();
        c = connect_to(a, "producer");
        scratch = gpu_alloc(0, SCRATCH);
        s = stream_new();
        CHECK_OK(c, gpuipc_ring_create(c, RING, &o, &r));
        h_report(ch, 'p', "ready");
        h_await(ch, 'g', START_MS);
        CHECK_OK(c, gpuipc_process(c));
        while (!stop && (a->frames == 0 || n < a->frames)) {
                gpuipc_buffer_t *slot;
                uint64_t frame = 0;
                GcuDevicePtr p;

                CHECK_OK(c, gpuipc_ring_stream_acquire(r, s, H_SOON_MS, &slot));
                p = gpu_ptr(slot);
                gpu_push(0);
                CHECK_CU(GX(cuMemsetD32Async, p, JUNK, WORDS, s));
                slow_work(scratch, s);
                CHECK_CU(GX(cuMemsetD32Async, p, value_of(n + 1), WORDS, s));
                gpu_pop();
                CHECK_OK(c, gpuipc_ring_stream_publish(r, s, &frame));
                CHECK_EQ(frame, ++n);
                if (told(ch)) {
                        h_await(ch, 'x', 1000);
                        stop = true;
                }
        }
        gpu_push(0);
        CHECK_CU(CU(cuStreamSynchronize, s));
        gpu_pop();
        h_report(ch, 'd', "%" PRIu64, n);
        if (!stop)
                h_await(ch, 'x', 60000);
        gpuipc_ring_close(r);
        stream_free(s);
        gpu_free(0, scratch);
        gpuipc_close(c);
        return 0;
}

/* Checks the copy of frame n: every word its value. */
static void check_frame(const uint32_t *host, uint64_t n)
{
        size_t bad = 0, first = SIZE_MAX;

        for (size_t w = 0; w < WORDS; w++) {
                if (host[w] != value_of(n) && bad++ == 0)
                        first = w;
        }
        CHECKF(bad == 0, "frame %" PRIu64 ": %zu of %u words wrong (word %zu holds 0x%08x, expected 0x%08x%s)",
               n, bad, WORDS, first, host[first], value_of(n),
               host[first] == JUNK ? ": the producer's junk, the slot was being rewritten" : "");
}

/* A member: joins, reports 'j', takes a->takes frames (each copied out and checked), reports 'd'
 * with the first frame and the count, then waits for 'x'. A staller (takes 0) takes one frame,
 * reports 'h' and never releases it; on 'x' it tries to take again and reports what it heard. */
static int member(HChan *ch, void *arg)
{
        const StreamArg *a = arg;
        bool staller = !a->takes && !a->progress;
        uint64_t first = 0, n = 0, got = 0;
        GcuDevicePtr scratch;
        uint32_t *host = NULL;
        gpuipc_ring_t *r;
        GcuStream s;
        gpuipc_t *c;

        gpu_init();
        c = connect_to(a, "member");
        scratch = gpu_alloc(0, SCRATCH);
        s = stream_new();
        gpu_push(0);
        CHECK_CU(GX(cuMemAllocHost, (void **)&host, SLOT)); /* pinned: the copy is queued, not done at once */
        gpu_pop();
        CHECK_OK(c, gpuipc_ring_join(c, RING, START_MS, &r));
        h_report(ch, 'j', "joined");
        for (uint64_t i = 0; a->progress ? !atomic_load(&a->progress->stop) : i < (staller ? 1 : a->takes); i++) {
                gpuipc_buffer_t *slot;

                CHECK_OK(c, gpuipc_ring_stream_take(r, s, H_SOON_MS, &slot, &got));
                if (i == 0)
                        first = got;
                CHECK_EQ(got, first + i);
                gpu_push(0);
                slow_work(scratch, s);
                CHECK_CU(CU(cuMemcpyDtoHAsync, host, gpu_ptr(slot), SLOT, s));
                gpu_pop();
                if (staller)
                        break;
                CHECK_OK(c, gpuipc_ring_stream_release(r, s));
                gpu_push(0);
                CHECK_CU(CU(cuStreamSynchronize, s));
                gpu_pop();
                check_frame(host, got);
                n++;
                if (a->progress)
                        atomic_store(&a->progress->taken[a->idx], n);
        }
        if (!staller) {
                h_report(ch, 'd', "%" PRIu64 " %" PRIu64, first, n);
                h_await(ch, 'x', 60000);
        } else {
                gpuipc_buffer_t *slot;
                int e;

                gpu_push(0);
                CHECK_CU(CU(cuStreamSynchronize, s)); /* our frame was there to be copied */
                gpu_pop();
                check_frame(host, got);
                h_report(ch, 'h', "%" PRIu64, got);
                h_await(ch, 'x', 60000);
                /* Late: the producer went on without us, and the frame may have changed meanwhile. */
                CHECK_ERR(c, gpuipc_ring_stream_release(r, s), GPUIPC_E_REVOKED);
                CHECK(strstr(gpuipc_errmsg(c), "overwritten"));
                e = gpuipc_ring_stream_take(r, s, 2000, &slot, &got);
                h_report(ch, 'r', "%d %.200s", e, gpuipc_errmsg(c));
        }
        gpuipc_ring_close(r);
        stream_free(s);
        gpu_push(0);
        CHECK_CU(GX(cuMemFreeHost, host));
        gpu_pop();
        gpu_free(0, scratch);
        gpuipc_close(c);
        return 0;
}

static HBroker *begin(void)
{
        HBroker *br = h_broker_start(NULL);

        if (!gpu_machine.vmm[0] || !gpu_machine.mem_ops_64[0])
                h_skip("a stream ring needs cuda-vmm export and 64-bit stream memory operations on GPU 0");
        return br;
}

static HChild *spawn_member(const char *name, StreamArg *a, bool own_pidns)
{
        char why[256];
        HChild *k = own_pidns && gpu_pidns_possible(why, sizeof(why)) ? gpu_spawn_pidns(name, member, a)
                                                                         : h_spawn(name, member, a);

        h_child_expect(k, 'j', START_MS, NULL, 0);
        return k;
}

static void finish(HChild *p)
{
        h_child_tell(p, 'x');
        h_child_wait_ok(p, H_SOON_MS);
        h_child_free(p);
}

/* What operators see of the ring once both members released `released` frames and stopped: both
 * seated at that position (the host's view: the releases they queued), the producer's host at most
 * twice the ring's two slots ahead (it queues frames its stream has not reached: its stream waits
 * on the members' "done"), each member's lag what separates them. */
static void expect_positions(const HBroker *br, uint64_t released)
{
        gpuipc_ring_member_info_t seats[2];
        gpuipc_t *obs = h_connect(br, "observer");
        gpuipc_ring_info_t g;
        int n = gpuipc_stat_ring(obs, RING, seats, 2, &g);

        CHECK_OK(obs, n);
        CHECK(n == 2 && g.mode == GPUIPC_RING_STREAM && g.kind == GPUIPC_KIND_CUDA_VMM && g.head_known);
        CHECKF(g.head >= released && g.head <= released + 2 * 2, "head %" PRIu64 " after %" PRIu64 " frames released",
               g.head, released);
        for (int i = 0; i < n; i++) {
                CHECK(seats[i].state == GPUIPC_SEAT_SEATED && seats[i].position_known);
                CHECK_EQ(seats[i].position, released);
                CHECK_EQ(seats[i].lag, g.head - released);
        }
        CHECK(g.lag_known && g.lag == g.head - released);
        gpuipc_close(obs);
}

/* Two members (one in a PID namespace of its own where possible) take 150 consecutive frames each
 * from frame 1, every one intact. */
static void test_stream_ring_orders_frames(void)
{
        HBroker *br = begin();
        StreamArg pa = { .broker = br, .frames = 0, .members = 2 };
        StreamArg ma = { .broker = br, .members = 2, .takes = 150 };
        uint64_t first = 0, n = 0;
        char text[64];
        HChild *p, *k[2];

        p = h_spawn("producer", producer, &pa);
        h_child_expect(p, 'p', START_MS, NULL, 0);
        k[0] = spawn_member("member-0", &ma, false);
        k[1] = spawn_member("member-1", &ma, true);
        h_child_tell(p, 'g');
        for (int i = 0; i < 2; i++) {
                h_child_expect(k[i], 'd', 50000, text, sizeof(text));
                CHECK(sscanf(text, "%" SCNu64 " %" SCNu64, &first, &n) == 2);
                CHECK_EQ(first, 1);
                CHECK_EQ(n, ma.takes);
        }
        expect_positions(br, ma.takes);
        for (int i = 0; i < 2; i++)
                finish(k[i]);
        finish(p);
        printf("# 2 members took frames 1..%" PRIu64 " through a 2-slot stream ring, every word as written\n",
               ma.takes);
        h_broker_settle(br);
        h_broker_stop(br);
}

/* A member takes one frame and stops: after the lease the producer evicts it and goes on; the
 * other member gets every frame, and the staller hears that it was evicted. */
static void test_stream_ring_evicts_a_staller(void)
{
        HBroker *br = begin();
        /* A lease long enough that a loaded machine does not evict the healthy member too. */
        StreamArg pa = { .broker = br, .frames = 0, .members = 2, .lease_ms = 1500 };
        StreamArg ma = { .broker = br, .members = 2, .takes = 60 };
        StreamArg sa = { .broker = br, .members = 2, .takes = 0 };
        uint64_t first = 0, n = 0;
        char text[300];
        HChild *p, *good, *stall;
        int e = 0;

        p = h_spawn("producer", producer, &pa);
        h_child_expect(p, 'p', START_MS, NULL, 0);
        good = spawn_member("member", &ma, false);
        stall = spawn_member("staller", &sa, false);
        h_child_tell(p, 'g');
        h_child_expect(stall, 'h', H_SOON_MS, NULL, 0);
        h_child_expect(good, 'd', 50000, text, sizeof(text));
        CHECK(sscanf(text, "%" SCNu64 " %" SCNu64, &first, &n) == 2);
        CHECK_EQ(n, ma.takes);
        h_child_tell(stall, 'x');
        h_child_expect(stall, 'r', H_SOON_MS, text, sizeof(text));
        CHECK(sscanf(text, "%d", &e) == 1);
        CHECKF(e == GPUIPC_E_REVOKED && strstr(text, "evicted"), "the staller's take said: %s", text);
        h_child_wait_ok(stall, H_SOON_MS);
        h_child_free(stall);
        finish(good);
        finish(p);
        printf("# a member that never released was evicted after the 1.5 s lease; the other took %" PRIu64
               " frames\n", n);
        h_broker_settle(br);
        h_broker_stop(br);
}

/* A member killed while it holds a frame: its seat is let go as soon as the broker sees it die,
 * long before the (60 s) lease, and the producer's stream goes on. Once the other member left too,
 * a new member takes a seat again: with new counters (the old ones may still be mapped by whoever
 * had them), while the producer's stream may still have waits queued on the old ones. */
static void test_stream_ring_member_death(void)
{
        HBroker *br = begin();
        StreamArg pa = { .broker = br, .frames = 0, .members = 2, .lease_ms = 60000 };
        StreamArg ma = { .broker = br, .members = 2, .takes = 60 };
        StreamArg sa = { .broker = br, .members = 2, .takes = 0 };
        uint64_t first = 0, n = 0, t0;
        char text[64];
        HChild *p, *good, *dying;

        p = h_spawn("producer", producer, &pa);
        h_child_expect(p, 'p', START_MS, NULL, 0);
        good = spawn_member("member", &ma, false);
        dying = spawn_member("dying", &sa, false);
        h_child_tell(p, 'g');
        h_child_expect(dying, 'h', H_SOON_MS, NULL, 0);
        t0 = monotonic_ms();
        h_child_kill9(dying);
        h_child_free(dying);
        h_child_expect(good, 'd', 50000, text, sizeof(text));
        CHECK(sscanf(text, "%" SCNu64 " %" SCNu64, &first, &n) == 2);
        CHECK_EQ(n, ma.takes);
        CHECKF(monotonic_ms() - t0 < 30000, "the producer waited for the dead member's lease");
        printf("# a member killed holding a frame: the other took %" PRIu64 " more frames within %" PRIu64
               " ms (lease 60 s)\n", n, monotonic_ms() - t0);
        finish(good);
        good = spawn_member("successor", &ma, false);
        h_child_expect(good, 'd', 50000, text, sizeof(text));
        CHECK(sscanf(text, "%" SCNu64 " %" SCNu64, &first, &n) == 2);
        CHECK_EQ(n, ma.takes);
        printf("# then a member in a renewed seat took %" PRIu64 " frames from frame %" PRIu64 "\n", n, first);
        finish(good);
        finish(p);
        h_broker_settle(br);
        h_broker_stop(br);
}

/* The producer publishes 5 frames and is killed. The member took all 5 and 2 more (a member may run
 * as many frames ahead as the ring has slots), so its stream has waits queued for frames that will
 * never come; its next take says the producer is gone, and those waits are let through (the stream
 * drains). */
static int orphan(HChan *ch, void *arg)
{
        const StreamArg *a = arg;
        uint64_t got = 0, taken = 0;
        gpuipc_ring_t *r;
        GcuStream s;
        gpuipc_t *c;
        int e;

        gpu_init();
        c = gpu_connect(a->broker, "orphan");
        s = stream_new();
        CHECK_OK(c, gpuipc_ring_join(c, RING, START_MS, &r));
        h_report(ch, 'j', "joined");
        for (;;) {
                gpuipc_buffer_t *slot;

                e = gpuipc_ring_stream_take(r, s, H_SOON_MS, &slot, &got);
                if (e < 0)
                        break;
                taken++;
                CHECK_OK(c, gpuipc_ring_stream_release(r, s));
                CHECKF(taken <= a->frames + 2, "took %" PRIu64 " frames from a producer that made %" PRIu64
                       " in a ring of 2 slots", taken, a->frames);
                if (taken == a->frames + 2)
                        h_report(ch, 't', "queued");
        }
        CHECKF(e == GPUIPC_E_REVOKED, "take = %d (%s) [%s], expected GPUIPC_E_REVOKED", e, gpuipc_strerror(e),
               gpuipc_errmsg(c));
        gpu_push(0);
        CHECK_CU(CU(cuStreamSynchronize, s)); /* hangs (and the case times out) if a wait stayed queued */
        gpu_pop();
        h_report(ch, 'd', "%" PRIu64 " %.200s", taken, gpuipc_errmsg(c));
        gpuipc_ring_close(r);
        stream_free(s);
        gpuipc_close(c);
        return 0;
}

/* When a stream ring's producer dies, a member's next take says so and the waits queued in its stream are let
 * through (the stream drains). */
static void test_stream_ring_producer_death(void)
{
        HBroker *br = begin();
        StreamArg pa = { .broker = br, .frames = 5, .members = 1 };
        uint64_t taken = 0;
        char text[300];
        HChild *p, *k;

        p = h_spawn("producer", producer, &pa);
        h_child_expect(p, 'p', START_MS, NULL, 0);
        k = h_spawn("orphan", orphan, &pa);
        h_child_expect(k, 'j', START_MS, NULL, 0);
        h_child_tell(p, 'g');
        h_child_expect(p, 'd', H_SOON_MS, NULL, 0);
        h_child_expect(k, 't', H_SOON_MS, NULL, 0);
        h_child_kill9(p);
        h_child_free(p);
        h_child_expect(k, 'd', 50000, text, sizeof(text));
        CHECK(sscanf(text, "%" SCNu64, &taken) == 1);
        CHECK_EQ(taken, pa.frames + 2);
        CHECKF(strstr(text, "producer"), "the orphan heard: %s", text);
        h_child_wait_ok(k, H_SOON_MS);
        h_child_free(k);
        printf("# producer killed after 5 frames: the member queued %" PRIu64 " takes, then heard \"%s\"; its "
               "stream drained\n", taken, strchr(text, ' ') + 1);
        h_broker_settle(br);
        h_broker_stop(br);
}

/* Host calls on a stream ring and stream calls on a host ring are refused, with words that say
 * which to use; a stream ring of memfd slots is refused at creation. */
static int misuse(HChan *ch, void *arg)
{
        const StreamArg *a = arg;
        gpuipc_ring_options_t o = { .struct_size = sizeof(o), .kind = GPUIPC_KIND_MEMFD, .slot_size = 4096,
                                    .mode = GPUIPC_RING_STREAM };
        gpuipc_ring_t *host_ring, *stream_ring;
        gpuipc_buffer_t *slot;
        gpuipc_t *c;

        gpu_init();
        c = gpu_connect(a->broker, "misuse");
        CHECK_ERR(c, gpuipc_ring_create(c, "rs/memfd", &o, &stream_ring), GPUIPC_E_INVALID);
        CHECK(strstr(gpuipc_errmsg(c), "cuda-vmm"));
        o.kind = GPUIPC_KIND_CUDA_VMM;
        o.slot_size = SLOT;
        CHECK_OK(c, gpuipc_ring_create(c, "rs/stream", &o, &stream_ring));
        CHECK_ERR(c, gpuipc_ring_acquire(stream_ring, 0, &slot), GPUIPC_E_STATE);
        CHECK(strstr(gpuipc_errmsg(c), "gpuipc_ring_stream_"));
        CHECK_ERR(c, gpuipc_ring_stream_publish(stream_ring, NULL, NULL), GPUIPC_E_STATE); /* nothing acquired */
        o.mode = GPUIPC_RING_BACKPRESSURE;
        CHECK_OK(c, gpuipc_ring_create(c, "rs/host", &o, &host_ring));
        CHECK_ERR(c, gpuipc_ring_stream_acquire(host_ring, NULL, 0, &slot), GPUIPC_E_STATE);
        CHECK(strstr(gpuipc_errmsg(c), "not stream-ordered"));
        gpuipc_ring_close(host_ring);
        gpuipc_ring_close(stream_ring);
        gpuipc_close(c);
        h_report(ch, 'd', "ok");
        return 0;
}

/* Host calls on a stream ring and stream calls on a host ring are refused with words that say which to use; a
 * stream ring of memfd slots is refused at creation. */
static void test_stream_ring_misuse(void)
{
        HBroker *br = begin();
        StreamArg a = { .broker = br };
        HChild *k = h_spawn("misuse", misuse, &a);

        h_child_expect(k, 'd', START_MS, NULL, 0);
        h_child_wait_ok(k, H_SOON_MS);
        h_child_free(k);
        h_broker_settle(br);
        h_broker_stop(br);
}

/* The broker is killed and started again while frames flow: they never needed it. The producer
 * declares the ring again (its counters too), the members take their seats back, and every frame
 * of both members is intact and in order. */
static void test_stream_ring_broker_restart(void)
{
        static const char *const flags[] = { "--restart-grace-ms", "5000", NULL };
        Progress *pr = mmap(NULL, sizeof(*pr), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        HBroker *br = h_broker_start(flags);
        StreamArg pa = { .broker = br, .frames = 0, .members = 2, .reconnect = true }, ma[2];
        uint64_t first = 0, n = 0, before[2];
        char text[64];
        HChild *p, *k[2];
        gpuipc_t *obs;

        CHECK(pr != MAP_FAILED);
        if (!gpu_machine.vmm[0] || !gpu_machine.mem_ops_64[0])
                h_skip("a stream ring needs cuda-vmm export and 64-bit stream memory operations on GPU 0");
        p = h_spawn("producer", producer, &pa);
        h_child_expect(p, 'p', START_MS, NULL, 0);
        for (int i = 0; i < 2; i++) {
                ma[i] = (StreamArg){ .broker = br, .members = 2, .reconnect = true, .progress = pr, .idx = i };
                k[i] = spawn_member(i ? "member-1" : "member-0", &ma[i], false);
        }
        h_child_tell(p, 'g');
        WAIT_UNTIL(atomic_load(&pr->taken[0]) >= 20 && atomic_load(&pr->taken[1]) >= 20, H_SOON_MS);
        h_broker_kill9(br);
        h_sleep_ms(300);
        h_broker_restart(br);
        obs = h_connect(br, "observer");
        WAIT_UNTIL(h_stats(obs, "rings") == 1 && h_stats(obs, "ring_members") == 2, H_SOON_MS);
        for (int i = 0; i < 2; i++)
                before[i] = atomic_load(&pr->taken[i]);
        /* Past the grace: the seats are the members' for good. */
        WAIT_UNTIL(atomic_load(&pr->taken[0]) >= before[0] + 50 && atomic_load(&pr->taken[1]) >= before[1] + 50,
                   H_SOON_MS);
        h_sleep_ms(5000);
        CHECK_EQ(h_stats(obs, "ring_members"), 2);
        atomic_store(&pr->stop, true);
        for (int i = 0; i < 2; i++) {
                h_child_expect(k[i], 'd', 60000, text, sizeof(text));
                CHECK(sscanf(text, "%" SCNu64 " %" SCNu64, &first, &n) == 2);
                CHECK_EQ(first, 1);
                CHECK_EQ(n, atomic_load(&pr->taken[i]));
        }
        for (int i = 0; i < 2; i++)
                finish(k[i]);
        finish(p);
        printf("# broker killed and restarted while a stream ring ran: the ring and both seats came back and "
               "stayed past the grace; the members took %" PRIu64 " and %" PRIu64 " consecutive frames from 1, "
               "all intact\n", atomic_load(&pr->taken[0]), atomic_load(&pr->taken[1]));
        gpuipc_close(obs);
        munmap(pr, sizeof(*pr));
        h_broker_settle(br);
        h_broker_stop(br);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_stream_ring_orders_frames),
                H_TEST(test_stream_ring_evicts_a_staller),
                H_TEST(test_stream_ring_member_death),
                H_TEST(test_stream_ring_producer_death),
                H_TEST(test_stream_ring_misuse),
                H_TEST(test_stream_ring_broker_restart),
        };

        return gpu_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]), 1);
}
