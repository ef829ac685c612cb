/* The project's one reading of the clocks. Durations, deadlines and timeouts use the monotonic
 * clock (it never steps back when the wall clock is set), and so do generations, which must exceed
 * a previous broker's (CLOCK_BOOTTIME, which also counts time suspended); only what a person or
 * another program compares with the calendar (exported timestamps) uses CLOCK_REALTIME.
 * Header-only: gpuipcctl and the tests use it without linking util's library, and each call
 * inlines to one vDSO read (no system call, nothing for seccomp). */
#pragma once

#include <stdint.h>
#include <time.h>

/* Nanoseconds on clock `id`. uint64_t holds 584 years of them: no clock here overflows it. */
static inline uint64_t clock_ns(clockid_t id)
{
        struct timespec ts;

        clock_gettime(id, &ts);
        return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t monotonic_ns(void)
{
        return clock_ns(CLOCK_MONOTONIC);
}

static inline uint64_t monotonic_us(void)
{
        return clock_ns(CLOCK_MONOTONIC) / 1000;
}

static inline uint64_t monotonic_ms(void)
{
        return clock_ns(CLOCK_MONOTONIC) / 1000000;
}

static inline uint64_t realtime_ns(void)
{
        return clock_ns(CLOCK_REALTIME);
}
