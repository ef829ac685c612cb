/* handoff-floor: the least a hand-over between processes costs on this machine, measured the
 * tightest way a small program can, to check gpuipc-bench --ring's raw floors against (the
 * bench runs it and prints its p50 beside its own; docs/performance.md). Built, never installed.
 *
 * One writer and N readers (processes) share one page. Per frame the writer stores a stamp
 * (CLOCK_MONOTONIC) and a sequence number on one cache line and wakes the readers (FUTEX_WAKE on
 * the sequence, a shared futex: the processes have different address spaces); each reader sleeps
 * in FUTEX_WAIT with no timeout (or, with --spin, spins on the line), reads the clock as soon as it
 * sees the new sequence and records now - stamp: the one-way time. It then acknowledges the frame;
 * the writer waits for every acknowledgement, then --pause-us more (default 20: the readers are
 * back asleep) before the next frame, busy unless --pause-sleep: a writer that sleeps between
 * frames lets a VM's CPUs idle deeper and wake slower (10-13 us instead of 7-8 on a 2-core KVM
 * guest). No frame overtakes a reader; one that a reader found before it slept (a busy machine)
 * is no hand-off to a sleeper, and is counted ("awake"), not sampled.
 *
 *   handoff-floor [--members N] [--frames N] [--spin] [--pause-us US] [--pause-sleep]
 *                 [--pin none|split|same]
 *
 * --pin split puts the writer on CPU 0 and reader i on CPU 1 + i % (CPUs - 1); same puts them all
 * on CPU 0; none (the default) leaves it to the scheduler. The writer spins while it waits unless
 * the readers need its CPU (--pin same, or more readers than other CPUs). Prints one line:
 *   p50 <us> p99 <us> n <samples> awake <frames>
 * Nothing here comes from the project's code: it is the independent check. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MEMBERS_MAX 8
#define FRAMES_MAX 1000000

typedef struct Line {
        _Alignas(64) uint32_t seq; /* the futex word; the stamp shares its cache line */
        uint64_t stamp;
        _Alignas(64) uint32_t acked; /* acknowledgements of all frames so far, all readers */
        _Alignas(64) uint32_t ready;
} Line;

static Line *line;
static float *samples; /* [MEMBERS_MAX][frames] nanoseconds */
static int frames = 20000, members = 1, spin, pause_us = 20, pause_sleep, ack_sleeps;
static const char *pin = "none";

static uint64_t now_ns(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
}

static void pin_cpu(int cpu)
{
        cpu_set_t set;

        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof(set), &set) < 0) {
                perror("handoff-floor: sched_setaffinity");
                exit(1);
        }
}

static int reader(int idx)
{
        float *out = samples + (size_t)idx * (size_t)frames;
        uint32_t seen = 0;

        __atomic_add_fetch(&line->ready, 1, __ATOMIC_SEQ_CST);
        while (seen < (uint32_t)frames) {
                uint32_t v;
                uint64_t t;
                int slept = spin;

                while ((v = __atomic_load_n(&line->seq, __ATOMIC_ACQUIRE)) == seen) {
                        if (spin)
                                relax();
                        else if (syscall(SYS_futex, &line->seq, FUTEX_WAIT, seen, NULL, NULL, 0) == 0)
                                slept = 1;
                }
                t = now_ns();
                /* A frame that came before this reader was asleep is no hand-off to a sleeper: it
                 * is left out (NAN) and counted. */
                out[seen] = slept ? (float)(t - __atomic_load_n(&line->stamp, __ATOMIC_RELAXED)) : NAN;
                seen = v;
                if (__atomic_add_fetch(&line->acked, 1, __ATOMIC_RELEASE) == seen * (uint32_t)members &&
                    ack_sleeps)
                        syscall(SYS_futex, &line->acked, FUTEX_WAKE, 1, NULL, NULL, 0);
        }
        return 0;
}

static int cmp_float(const void *a, const void *b)
{
        float x = *(const float *)a, y = *(const float *)b;

        return (x > y) - (x < y);
}

static int usage(void)
{
        fprintf(stderr, "usage: handoff-floor [--members 1..%d] [--frames 1..%d] [--spin] [--pause-us US] "
                        "[--pause-sleep] [--pin none|split|same]\n", MEMBERS_MAX, FRAMES_MAX);
        return 2;
}

int main(int argc, char **argv)
{
        pid_t pids[MEMBERS_MAX];
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        struct timespec pause;
        size_t n;

        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--spin") == 0)
                        spin = 1;
                else if (strcmp(argv[i], "--pause-sleep") == 0)
                        pause_sleep = 1;
                else if (i + 1 < argc && strcmp(argv[i], "--members") == 0)
                        members = atoi(argv[++i]);
                else if (i + 1 < argc && strcmp(argv[i], "--frames") == 0)
                        frames = atoi(argv[++i]);
                else if (i + 1 < argc && strcmp(argv[i], "--pause-us") == 0)
                        pause_us = atoi(argv[++i]);
                else if (i + 1 < argc && strcmp(argv[i], "--pin") == 0)
                        pin = argv[++i];
                else
                        return usage();
        }
        if (members < 1 || members > MEMBERS_MAX || frames < 1 || frames > FRAMES_MAX || pause_us < 0 ||
            pause_us > 1000000 || (strcmp(pin, "none") && strcmp(pin, "split") && strcmp(pin, "same")))
                return usage();
        if (strcmp(pin, "split") == 0 && cpus < 2) {
                fprintf(stderr, "handoff-floor: --pin split needs 2 CPUs\n");
                return 2;
        }
        line = mmap(NULL, sizeof(*line), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        samples = mmap(NULL, (size_t)MEMBERS_MAX * (size_t)frames * sizeof(float), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (line == MAP_FAILED || samples == MAP_FAILED) {
                perror("handoff-floor: mmap");
                return 1;
        }
        /* With more readers than other CPUs, or all on one, a spinning writer would take their CPU. */
        ack_sleeps = strcmp(pin, "same") == 0 || cpus < members + 1;
        /* The pause is the pause asked for, not 50 us more of timer slack. */
        (void)prctl(PR_SET_TIMERSLACK, 1UL);
        for (int i = 0; i < members; i++) {
                pids[i] = fork();
                if (pids[i] < 0) {
                        perror("handoff-floor: fork");
                        return 1;
                }
                if (pids[i] == 0) {
                        prctl(PR_SET_PDEATHSIG, SIGKILL);
                        if (strcmp(pin, "split") == 0)
                                pin_cpu(1 + i % (int)(cpus - 1));
                        else if (strcmp(pin, "same") == 0)
                                pin_cpu(0);
                        _exit(reader(i));
                }
        }
        if (strcmp(pin, "none") != 0)
                pin_cpu(0);
        while (__atomic_load_n(&line->ready, __ATOMIC_SEQ_CST) < (uint32_t)members)
                usleep(1000);
        usleep(20000); /* the readers are asleep in FUTEX_WAIT (or spinning) */
        pause = (struct timespec){ pause_us / 1000000, (long)(pause_us % 1000000) * 1000 };
        for (uint32_t f = 1, v; f <= (uint32_t)frames; f++) {
                __atomic_store_n(&line->stamp, now_ns(), __ATOMIC_RELAXED);
                __atomic_store_n(&line->seq, f, __ATOMIC_RELEASE);
                if (!spin)
                        syscall(SYS_futex, &line->seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
                /* The writer spins while it waits for the acknowledgements, unless that would take a
                 * CPU the readers need (then it sleeps until the last one wakes it). */
                while ((v = __atomic_load_n(&line->acked, __ATOMIC_ACQUIRE)) < f * (uint32_t)members) {
                        if (ack_sleeps)
                                syscall(SYS_futex, &line->acked, FUTEX_WAIT, v, NULL, NULL, 0);
                        else
                                relax();
                }
                /* The pause lets the readers go back to sleep; the writer stays busy through it (by
                 * default) because a writer that sleeps lets this machine idle deeper. */
                if (pause_us && pause_sleep) {
                        nanosleep(&pause, NULL);
                } else if (pause_us) {
                        uint64_t until = now_ns() + (uint64_t)pause_us * 1000;

                        while (now_ns() < until) {
                                if (ack_sleeps)
                                        sched_yield();
                                else
                                        relax();
                        }
                }
        }
        for (int i = 0; i < members; i++) {
                int st;

                if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                        fprintf(stderr, "handoff-floor: a reader failed\n");
                        return 1;
                }
        }
        /* All readers' samples together (they lie one after the other), as the bench pools its
         * members'. */
        n = 0;
        for (size_t i = 0; i < (size_t)members * (size_t)frames; i++)
                if (!isnan(samples[i]))
                        samples[n++] = samples[i];
        if (n == 0) {
                fprintf(stderr, "handoff-floor: no reader ever slept (a longer --pause-us)\n");
                return 1;
        }
        qsort(samples, n, sizeof(float), cmp_float);
        /* Nearest rank, as the bench's. */
        printf("p50 %.3f p99 %.3f n %zu awake %zu\n", samples[(n * 50 + 99) / 100 - 1] / 1000.0,
               samples[(n * 99 + 99) / 100 - 1] / 1000.0, n, (size_t)members * (size_t)frames - n);
        return 0;
}
