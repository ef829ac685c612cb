/* Section --ring: frames handed over through a ring's shared memory, against floors measured in the
 * same run: a broker round trip (a ping: the least a frame costs when it goes through the broker),
 * and the same hand-off done raw between processes, without a ring: a futex on one shared word
 * (the least a sleeping member can cost) and a spin on one cache line (the least a spinning one
 * can cost).
 *
 * Handoff: the producer stamps CLOCK_MONOTONIC into the slot just before it publishes, each member
 * takes the frame and subtracts the stamp from its own clock: the one-way time from "published" to
 * "a member has it". Frames go out one at a time, paced the tightest way that still finds members
 * asleep: every member acknowledges each frame (after its release), the producer waits for all
 * acknowledgements and then for HANDOFF_GAP_NS more, busy (a producer that sleeps between frames
 * lets a VM's CPUs idle deeper: 10-13 us instead of 7-8 on a 2-core KVM guest), before the next
 * one; it sleeps and yields instead only where it would take a member's CPU (pace_sleeps).
 * A frame a member found already there (it had not gone back to sleep: a busy machine) is no
 * hand-off to a sleeper and gives no sample; the note counts them. With spin, members busy-wait
 * instead. 1 and 8 members. The raw floors stamp and pace the same way, and handoff-floor (a
 * standalone program, no code of ours) measures them once more beside them: the bench's floor must
 * not be slower than that one (the row's ratio; --pin pins all three alike).
 * Frames/s: one member and a producer going as fast as the ring lets them. */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bench.h"
#include "futex.h"
#include "macro.h"

#define RING_MEMBERS_MAX 8
#define RING_SAMPLES_MAX 20000
#define HANDOFF_GAP_NS 20000

typedef struct RingShared {
        int joined, done;
        uint64_t frames;                               /* how many each member takes */
        unsigned spin_us;
        bool paced;                                    /* acknowledge each frame (the handoff runs) */
        bool pace_sleeps;                              /* pace_sleeps(members) */
        int members;
        _Alignas(64) uint32_t acked;                   /* acknowledgements, all members */
        _Alignas(64) uint32_t n[RING_MEMBERS_MAX];
        uint32_t awake[RING_MEMBERS_MAX];              /* frames that were there before the take */
        float ns[RING_MEMBERS_MAX][RING_SAMPLES_MAX];  /* handoff samples per member */
        uint64_t t_first[RING_MEMBERS_MAX], t_last[RING_MEMBERS_MAX];
} RingShared;

/* ---- pacing: each frame acknowledged by every member before the next ---- */

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
}

/* Whether the producer sleeps while it waits for acknowledgements (and yields in its gap): when
 * it shares a CPU with members (--pin same), or there are more members than other CPUs to run
 * them; elsewhere it spins, which keeps the members' CPUs to themselves and its own awake. */
static bool pace_sleeps(int members)
{
        return (bench_opts.pin && strcmp(bench_opts.pin, "same") == 0) ||
               sysconf(_SC_NPROCESSORS_ONLN) < members + 1;
}

/* A member has handled frame f (from 1): counts it; the last member wakes a sleeping producer. */
static void ack(uint32_t *acked, uint32_t f, int members, bool sleeps)
{
        if (__atomic_add_fetch(acked, 1, __ATOMIC_RELEASE) == f * (uint32_t)members && sleeps)
                futex_wake(acked, 1);
}

/* The producer: waits until every member acknowledged frame f, then HANDOFF_GAP_NS more (they go
 * back to sleep), without sleeping itself unless it must. */
static void pace(uint32_t *acked, uint32_t f, int members, bool sleeps)
{
        uint32_t v;
        uint64_t until;

        while ((v = __atomic_load_n(acked, __ATOMIC_ACQUIRE)) < f * (uint32_t)members) {
                if (sleeps)
                        (void)futex_wait(acked, v, 1000);
                else
                        relax();
        }
        until = monotonic_ns() + HANDOFF_GAP_NS;
        while (monotonic_ns() < until) {
                if (sleeps)
                        sched_yield();
                else
                        relax();
        }
}

/* Pins this process for --pin: the producer (and what it forks afterwards) on CPU 0; with split,
 * member idx moves to a CPU of its own from 1 on (shared round-robin when there are fewer). */
static void pin_member(int idx)
{
        if (bench_opts.pin && strcmp(bench_opts.pin, "split") == 0)
                pin_to_cpu(0, 1 + idx % (int)(sysconf(_SC_NPROCESSORS_ONLN) - 1));
}

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
        gpuipc_t *c;
        gpuipc_ring_t *r;

        pin_member(a->idx);
        c = bench_connect(a->broker, "bench-ring-member");
        TRY(c, gpuipc_ring_join(c, a->name, 10000, &r));
        gpuipc_ring_set_spin(r, sh->spin_us);
        __atomic_add_fetch(&sh->joined, 1, __ATOMIC_SEQ_CST);
        for (uint64_t i = 0; i < sh->frames; i++) {
                gpuipc_buffer_t *slot;
                uint64_t frame, stamp, t;
                int got = GPUIPC_E_TIMEOUT;
                bool awake;

                /* Paced: was the frame there before this member waited (no hand-off to a sleeper)? */
                if (sh->paced && !sh->spin_us)
                        got = gpuipc_ring_take(r, 0, &slot, &frame);
                awake = got >= 0;
                if (got == GPUIPC_E_TIMEOUT)
                        got = gpuipc_ring_take(r, 30000, &slot, &frame);
                TRY(c, got);
                t = monotonic_ns();
                stamp = *(volatile uint64_t *)gpuipc_buffer_ptr(slot);
                if (i == 0)
                        sh->t_first[a->idx] = t;
                sh->t_last[a->idx] = t;
                if (awake)
                        sh->awake[a->idx]++;
                else if (sh->n[a->idx] < RING_SAMPLES_MAX && stamp)
                        sh->ns[a->idx][sh->n[a->idx]++] = (float)(t - stamp);
                TRY(c, gpuipc_ring_release(r));
                if (sh->paced)
                        ack(&sh->acked, (uint32_t)(i + 1), sh->members, sh->pace_sleeps);
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
        bool paced;        /* one frame at a time, acknowledged (false: as fast as it goes) */
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
        x->sh->paced = x->paced;
        x->sh->members = x->members;
        x->sh->pace_sleeps = pace_sleeps(x->members);
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
        t0 = monotonic_ns();
        for (uint64_t n = 0; n < x->frames; n++) {
                gpuipc_buffer_t *slot;

                TRY(x->prod, gpuipc_ring_acquire(r, 30000, &slot));
                *(volatile uint64_t *)gpuipc_buffer_ptr(slot) = x->paced ? monotonic_ns() : 0;
                TRY(x->prod, gpuipc_ring_publish(r, NULL));
                if (x->paced)
                        pace(&x->sh->acked, (uint32_t)n + 1, x->members, x->sh->pace_sleeps);
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

/* ---- the raw floors: one cache line between processes, no ring ---- */

typedef struct RawLine {
        _Alignas(64) uint32_t seq; /* the futex word: bumped at every hand-over; the stamp shares its line */
        uint64_t stamp;
        _Alignas(64) uint32_t acked;
        _Alignas(64) int ready;
        bool sleeps; /* pace_sleeps */
        uint32_t n[RING_MEMBERS_MAX], awake[RING_MEMBERS_MAX];
        float ns[RING_MEMBERS_MAX][RING_SAMPLES_MAX];
} RawLine;

typedef struct RawChild {
        RawLine *l;
        int idx, members, frames;
        bool spin;
} RawChild;

/* Waits for each new seq (spinning, or in FUTEX_WAIT with no timeout: the least the kernel does)
 * and records now - stamp, then acknowledges. A frame that was there before the member slept is
 * counted, not sampled, as the ring's members do. */
static int raw_member_main(void *arg)
{
        RawChild *a = arg;
        RawLine *l = a->l;
        uint32_t seen = 0;

        pin_member(a->idx);
        __atomic_add_fetch(&l->ready, 1, __ATOMIC_SEQ_CST);
        while (seen < (uint32_t)a->frames) {
                bool slept = a->spin;
                uint32_t v;
                uint64_t t;

                while ((v = __atomic_load_n(&l->seq, __ATOMIC_ACQUIRE)) == seen) {
                        if (a->spin)
                                relax();
                        else if (syscall(SYS_futex, &l->seq, FUTEX_WAIT, seen, NULL, NULL, 0) == 0)
                                slept = true;
                }
                t = monotonic_ns();
                if (!slept)
                        l->awake[a->idx]++;
                else if (l->n[a->idx] < RING_SAMPLES_MAX)
                        l->ns[a->idx][l->n[a->idx]++] = (float)(t - __atomic_load_n(&l->stamp, __ATOMIC_RELAXED));
                seen = v;
                ack(&l->acked, seen, a->members, l->sleeps);
        }
        return 0;
}

/* The raw hand-off to `members` processes, paced as the ring's; p50 in us, the samples and the
 * frames that found a member awake. */
static double raw_handoff(RawLine *l, int members, bool spin, int frames, size_t *ret_n, size_t *ret_awake)
{
        RawChild kids[RING_MEMBERS_MAX];
        pid_t pids[RING_MEMBERS_MAX];
        Samples s = { 0 };
        double p50;

        memset(l, 0, sizeof(*l));
        l->sleeps = pace_sleeps(members);
        for (int i = 0; i < members; i++) {
                kids[i] = (RawChild){ l, i, members, frames, spin };
                pids[i] = spawn(raw_member_main, &kids[i], NULL, 0);
        }
        while (__atomic_load_n(&l->ready, __ATOMIC_SEQ_CST) < members)
                sleep_ns(1000000);
        sleep_ns(20000000);
        *ret_awake = 0;
        for (uint32_t n = 1; n <= (uint32_t)frames; n++) {
                /* Stamp, publish, wake: the least a hand-over to a sleeper can do. */
                __atomic_store_n(&l->stamp, monotonic_ns(), __ATOMIC_RELAXED);
                __atomic_store_n(&l->seq, n, __ATOMIC_RELEASE);
                if (!spin)
                        futex_wake(&l->seq, INT_MAX);
                pace(&l->acked, n, members, l->sleeps);
        }
        for (int i = 0; i < members; i++)
                if (child_wait(pids[i]) != 0)
                        die("a raw hand-off member failed");
        for (int i = 0; i < members; i++) {
                for (uint32_t k = 0; k < l->n[i]; k++)
                        samples_add(&s, l->ns[i][k] / 1000.0);
                *ret_awake += l->awake[i];
        }
        p50 = samples_pct(&s, 50);
        *ret_n = s.n;
        samples_free(&s);
        return p50;
}

/* The standalone handoff-floor program's p50 (us) for the same case; NAN when it did not run. */
static double standalone_handoff(int members, bool spin, int frames)
{
        char cmd[512];
        double p50 = NAN;
        FILE *f;

        snprintf(cmd, sizeof(cmd), "'%s/tests/bench/handoff-floor' --members %d --frames %d --pause-us %d%s --pin %s",
                 BENCH_BUILD_ROOT, members, frames, HANDOFF_GAP_NS / 1000, spin ? " --spin" : "",
                 bench_opts.pin ? bench_opts.pin : "none");
        fflush(stdout);
        fflush(stderr);
        f = popen(cmd, "r");
        if (!f)
                return NAN;
        if (fscanf(f, "p50 %lf", &p50) != 1)
                p50 = NAN;
        if (pclose(f) != 0)
                p50 = NAN;
        return p50;
}

static void handoff_rows(RingRun *x, const char *what, double rtt_p50, double raw_p50)
{
        Samples s = { 0 };
        unsigned awake = 0;
        char metric[80];
        Row *row;

        for (int i = 0; i < x->members; i++)
                for (uint32_t k = 0; k < x->sh->n[i]; k++)
                        samples_add(&s, x->sh->ns[i][k] / 1000.0);
        snprintf(metric, sizeof(metric), "ring handoff p50 (%s, %d member%s)%s%s%s", what, x->members,
                 x->members > 1 ? "s" : "", bench_opts.pin ? " [pin " : "", bench_opts.pin ? bench_opts.pin : "",
                 bench_opts.pin ? "]" : "");
        row = row_add(metric, samples_pct(&s, 50), "us",
                      x->spin_us ? "raw spin hand-off p50" : "raw futex hand-off p50", raw_p50);
        /* What the ring adds to the least a hand-over between processes costs: the raw futex (a
         * sleeping member) and the raw spin on one cache line (a spinning one). */
        if (x->members == 1)
                row_target_ratio_max(row, x->spin_us ? 1.5 : 1.3);
        for (int i = 0; i < x->members; i++)
                awake += x->sh->awake[i];
        row_note(row, "%zu samples (%u frames found a member awake); %.2fx the broker round trip (%.1f us)", s.n,
                 awake, samples_pct(&s, 50) / rtt_p50, rtt_p50);
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
        double rtt, fps, raw[sizeof(cases) / sizeof(cases[0])];
        RawLine *line;
        char name[64];
        Row *row;

        section_name = "ring";
        broker_start(&b, NULL, 0);
        x.broker = &b;
        x.prod = bench_connect(&b, "bench-ring-producer");
        x.sh = shared_alloc(sizeof(*x.sh));
        /* The baseline: what a frame costs at least when the broker is on its path. */
        for (int i = 0; i < (bench_opts.quick ? 2000 : 20000); i++) {
                uint64_t t = monotonic_ns();
                TRY(x.prod, gpuipc_ping(x.prod, 10000));
                samples_add(&ping, (double)(monotonic_ns() - t) / 1000.0);
        }
        rtt = samples_pct(&ping, 50);
        row_add("broker round trip p50 (ping)", rtt, "us", "", NAN);
        samples_free(&ping);

        /* The raw floors first, each case as the ring's below, each beside the standalone program's
         * measurement of the same case: the floor must be no slower than that (ratio <= 1.1). */
        if (bench_opts.pin)
                pin_to_cpu(0, 0); /* the producer; members move for split (pin_member) */
        line = shared_alloc(sizeof(*line));
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                int n_frames = (int)MIN(frames, RING_SAMPLES_MAX);
                size_t n = 0, awake = 0;
                double alone;

                raw[i] = NAN;
                if (cases[i].spin_us && sysconf(_SC_NPROCESSORS_ONLN) < cases[i].members + 1)
                        continue;
                raw[i] = raw_handoff(line, cases[i].members, cases[i].spin_us != 0, n_frames, &n, &awake);
                alone = standalone_handoff(cases[i].members, cases[i].spin_us != 0, n_frames);
                snprintf(name, sizeof(name), "raw %s hand-off p50 (%d member%s)%s%s%s",
                         cases[i].spin_us ? "spin" : "futex", cases[i].members, cases[i].members > 1 ? "s" : "",
                         bench_opts.pin ? " [pin " : "", bench_opts.pin ? bench_opts.pin : "",
                         bench_opts.pin ? "]" : "");
                row = row_add(name, raw[i], "us", "handoff-floor p50 (standalone)", alone);
                row_target_ratio_max(row, 1.1);
                row_note(row, "%zu samples (%zu frames found a member awake); one cache line between processes, "
                         "no ring", n, awake);
        }

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
                x.paced = true;
                x.slot_size = 4096;
                x.slots = 8;
                snprintf(name, sizeof(name), "bench/ring/handoff/%zu", i);
                ring_run(&x, name);
                handoff_rows(&x, cases[i].what, rtt, raw[i]);
        }

        /* Frames/s through one ring, one member. */
        for (int spin = 0; spin < 2; spin++) {
                x.members = 1;
                x.spin_us = spin ? 100000 : 0;
                x.frames = bench_opts.quick ? 200000 : 2000000;
                x.paced = false;
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
