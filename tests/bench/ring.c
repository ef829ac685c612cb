/* Section --ring: frames handed over through a ring's shared memory, against the broker round trip
 * measured in the same run (a ping: the least a frame costs when it goes through the broker).
 *
 * Handoff: the producer stamps CLOCK_MONOTONIC into the slot just before it publishes, each member
 * takes the frame and subtracts the stamp from its own clock: the one-way time from "published" to
 * "a member has it". Frames go out one at a time with a pause between them, so members that sleep
 * (futex wake) really sleep; with spin, members busy-wait instead. 1 and 8 members.
 * Frames/s: one member and a producer going as fast as the ring lets them. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "macro.h"

#define RING_MEMBERS_MAX 8
#define RING_SAMPLES_MAX 20000

typedef struct RingShared {
        int joined, done;
        uint64_t frames;                               /* how many each member takes */
        unsigned spin_us;
        uint32_t n[RING_MEMBERS_MAX];
        float ns[RING_MEMBERS_MAX][RING_SAMPLES_MAX];  /* handoff samples per member */
        uint64_t t_first[RING_MEMBERS_MAX], t_last[RING_MEMBERS_MAX];
} RingShared;

typedef struct RingChild {
        RingShared *sh;
        const Broker *broker;
        const char *name;
        int idx;
} RingChild;

static int ring_member_main(void *arg)
{
        RingChild *a = arg;
        RingShared *sh = a->sh;
        gpuipc_t *c = bench_connect(a->broker, "bench-ring-member");
        gpuipc_ring_t *r;

        TRY(c, gpuipc_ring_join(c, a->name, 10000, &r));
        gpuipc_ring_set_spin(r, sh->spin_us);
        __atomic_add_fetch(&sh->joined, 1, __ATOMIC_SEQ_CST);
        for (uint64_t i = 0; i < sh->frames; i++) {
                gpuipc_buffer_t *slot;
                uint64_t frame, stamp, t;

                TRY(c, gpuipc_ring_take(r, 30000, &slot, &frame));
                t = now_ns();
                stamp = *(volatile uint64_t *)gpuipc_buffer_ptr(slot);
                if (i == 0)
                        sh->t_first[a->idx] = t;
                sh->t_last[a->idx] = t;
                if (sh->n[a->idx] < RING_SAMPLES_MAX && stamp)
                        sh->ns[a->idx][sh->n[a->idx]++] = (float)(t - stamp);
                TRY(c, gpuipc_ring_release(r));
        }
        __atomic_add_fetch(&sh->done, 1, __ATOMIC_SEQ_CST);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

typedef struct RingRun {
        Broker *broker;
        gpuipc_t *prod;
        RingShared *sh;
        int members;
        unsigned spin_us;
        uint64_t frames;
        uint64_t pause_ns; /* between frames (0: as fast as it goes) */
        size_t slot_size;
        unsigned slots;
} RingRun;

/* Runs one ring: members in child processes, the producer here. Returns frames/s of the run. */
static double ring_run(RingRun *x, const char *name)
{
        gpuipc_ring_options_t o = { .struct_size = sizeof(o), .slot_size = x->slot_size, .slots = x->slots,
                                    .max_members = (unsigned)x->members, .lease_ms = 30000 };
        RingChild kids[RING_MEMBERS_MAX];
        pid_t pids[RING_MEMBERS_MAX];
        gpuipc_ring_t *r;
        uint64_t t0, t1;

        memset(x->sh, 0, sizeof(*x->sh));
        x->sh->frames = x->frames;
        x->sh->spin_us = x->spin_us;
        TRY(x->prod, gpuipc_ring_create(x->prod, name, &o, &r));
        gpuipc_ring_set_spin(r, x->spin_us);
        for (int i = 0; i < x->members; i++) {
                kids[i] = (RingChild){ x->sh, x->broker, name, i };
                pids[i] = spawn(ring_member_main, &kids[i], NULL, 0);
        }
        while (__atomic_load_n(&x->sh->joined, __ATOMIC_SEQ_CST) < x->members)
                sleep_ns(1000000);
        /* Seat them (the broker told us they joined) before the first frame. */
        sleep_ns(20000000);
        TRY(x->prod, gpuipc_process(x->prod));
        t0 = now_ns();
        for (uint64_t n = 0; n < x->frames; n++) {
                gpuipc_buffer_t *slot;

                TRY(x->prod, gpuipc_ring_acquire(r, 30000, &slot));
                *(volatile uint64_t *)gpuipc_buffer_ptr(slot) = x->pause_ns ? now_ns() : 0;
                TRY(x->prod, gpuipc_ring_publish(r, NULL));
                if (x->pause_ns)
                        sleep_ns(x->pause_ns);
        }
        for (int i = 0; i < x->members; i++)
                if (child_wait(pids[i]) != 0)
                        die("a ring member failed");
        t1 = 0;
        for (int i = 0; i < x->members; i++)
                t1 = MAX(t1, x->sh->t_last[i]);
        gpuipc_ring_close(r);
        return (double)x->frames * 1e9 / (double)(t1 - t0);
}

static void handoff_rows(RingRun *x, const char *what, double rtt_p50)
{
        Samples s = { 0 };
        char metric[80];
        Row *row;

        for (int i = 0; i < x->members; i++)
                for (uint32_t k = 0; k < x->sh->n[i]; k++)
                        samples_add(&s, x->sh->ns[i][k] / 1000.0);
        snprintf(metric, sizeof(metric), "ring handoff p50 (%s, %d member%s)", what, x->members,
                 x->members > 1 ? "s" : "");
        row = row_add(metric, samples_pct(&s, 50), "us", "broker round trip p50", rtt_p50);
        if (x->members == 1) {
                row_target_value_max(row, x->spin_us ? 1.0 : 5.0, x->spin_us ? "<= 1 us" : "<= 5 us");
                if (row->verdict == VERDICT_MET)
                        row_target_ratio_max(row, 0.1);
        }
        row_note(row, "%zu samples", s.n);
        snprintf(metric, sizeof(metric), "ring handoff p99 (%s, %d member%s)", what, x->members,
                 x->members > 1 ? "s" : "");
        row_add(metric, samples_pct(&s, 99), "us", "broker round trip p50", rtt_p50);
        samples_free(&s);
}

void section_ring(void)
{
        static const struct {
                int members;
                unsigned spin_us;
                const char *what;
        } cases[] = {
                { 1, 0, "futex wake" }, { 8, 0, "futex wake" }, { 1, 100000, "spin" }, { 8, 100000, "spin" },
        };
        Broker b;
        RingRun x = { 0 };
        Samples ping = { 0 };
        uint64_t frames = bench_opts.quick ? 2000 : 20000;
        double rtt, fps;
        char name[64];
        Row *row;

        section_name = "ring";
        broker_start(&b, NULL, 0);
        x.broker = &b;
        x.prod = bench_connect(&b, "bench-ring-producer");
        x.sh = shared_alloc(sizeof(*x.sh));
        /* The baseline: what a frame costs at least when the broker is on its path. */
        for (int i = 0; i < (bench_opts.quick ? 2000 : 20000); i++) {
                uint64_t t = now_ns();
                TRY(x.prod, gpuipc_ping(x.prod, 10000));
                samples_add(&ping, (double)(now_ns() - t) / 1000.0);
        }
        rtt = samples_pct(&ping, 50);
        row_add("broker round trip p50 (ping)", rtt, "us", "", NAN);
        samples_free(&ping);

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                /* Spinning members each need a core of their own, and the producer one more. */
                if (cases[i].spin_us && sysconf(_SC_NPROCESSORS_ONLN) < cases[i].members + 1) {
                        snprintf(name, sizeof(name), "ring handoff p50 (spin, %d members)", cases[i].members);
                        row = row_add(name, NAN, "us", "", NAN);
                        row_note(row, "not run: %d spinning members and a producer need %d cores, this machine has "
                                 "%ld", cases[i].members, cases[i].members + 1, sysconf(_SC_NPROCESSORS_ONLN));
                        continue;
                }
                x.members = cases[i].members;
                x.spin_us = cases[i].spin_us;
                x.frames = MIN(frames, (uint64_t)RING_SAMPLES_MAX);
                x.pause_ns = 50000;
                x.slot_size = 4096;
                x.slots = 8;
                snprintf(name, sizeof(name), "bench/ring/handoff/%zu", i);
                ring_run(&x, name);
                handoff_rows(&x, cases[i].what, rtt);
        }

        /* Frames/s through one ring, one member. */
        for (int spin = 0; spin < 2; spin++) {
                x.members = 1;
                x.spin_us = spin ? 100000 : 0;
                x.frames = bench_opts.quick ? 200000 : 2000000;
                x.pause_ns = 0;
                x.slot_size = 64;
                x.slots = 64;
                snprintf(name, sizeof(name), "bench/ring/rate/%d", spin);
                fps = ring_run(&x, name);
                row = row_add(spin ? "ring frames/s (spin, 1 member)" : "ring frames/s (futex wake, 1 member)", fps,
                              "1/s", "broker round trips/s", 1e6 / rtt);
                row_target_value_min(row, 1e6, ">= 1M/s");
                row_note(row, "%llu frames of 64 bytes, 64 slots", (unsigned long long)x.frames);
        }
        gpuipc_close(x.prod);
        broker_stop(&b);
}
