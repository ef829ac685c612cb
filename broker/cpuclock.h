/* The broker's CPU time for the fair scheduler (server.c's fair_cpu_ns), read with fewer system
 * calls. The thread's CPU clock (CLOCK_THREAD_CPUTIME_ID) counts time on a CPU only, but it has no
 * vDSO path: every reading is a system call. The scheduler reads it before and after each frame,
 * and while peers are ready the reading after one frame is followed within a loop iteration by
 * the one before the next: a reading younger than the reuse window (by the monotonic clock, a vDSO
 * read) stands for the next, plus the time since. That is off only by time the thread spent off
 * its CPU within the window (a preemption shorter than it; the owner forgets the reading before
 * the loop may sleep), and then too high, which lowers a frame's charge; the clock never goes
 * back, so a charge is never negative. Header-only: the unit test drives it with fake clocks. */
#pragma once

#include <stdint.h>

typedef struct CpuClock {
        uint64_t read_ns;     /* the last real reading */
        uint64_t read_at_ns;  /* the monotonic time it was taken (0: none to reuse) */
        uint64_t returned_ns; /* the largest value returned */
} CpuClock;

/* The CPU time at monotonic time now: the last reading plus the time since while it is younger
 * than reuse_ns, else read() (the system call), never less than a value returned before. */
static inline uint64_t cpu_clock_get(CpuClock *c, uint64_t now, uint64_t reuse_ns, uint64_t (*read)(void))
{
        uint64_t cpu;

        if (c->read_at_ns && now >= c->read_at_ns && now - c->read_at_ns < reuse_ns) {
                cpu = c->read_ns + (now - c->read_at_ns);
        } else {
                cpu = read();
                c->read_ns = cpu;
                c->read_at_ns = now;
        }
        if (cpu < c->returned_ns)
                cpu = c->returned_ns;
        c->returned_ns = cpu;
        return cpu;
}

/* The next get reads the clock: time from here on may be no CPU time (the loop may sleep). */
static inline void cpu_clock_forget(CpuClock *c)
{
        c->read_at_ns = 0;
}
