/* broker/cpuclock.h: a reading of the thread's CPU clock younger than the window stands for the
 * next one (no system call), plus the monotonic time since; an older one, or one forgotten, does
 * not; and the clock never goes back, even when a reused reading overshot the real one. */
#include <stdint.h>

#include "check.h"
#include "cpuclock.h"

#define WINDOW 20000

static uint64_t fake_cpu;
static unsigned reads;

static uint64_t fake_read(void)
{
        reads++;
        return fake_cpu;
}

/* Two readings a loop iteration apart: one system call; the second is the first plus the time. */
static void test_cpuclock_reuse(void)
{
        CpuClock c = { 0 };

        fake_cpu = 5000000;
        reads = 0;
        CHECK_EQ(cpu_clock_get(&c, 1000000, WINDOW, fake_read), 5000000);
        CHECK_EQ(reads, 1);
        CHECK_EQ(cpu_clock_get(&c, 1000700, WINDOW, fake_read), 5000700);
        CHECK_EQ(reads, 1);
        /* Past the window: a real reading (the thread was off its CPU for most of it). */
        fake_cpu = 5010000;
        CHECK_EQ(cpu_clock_get(&c, 1000000 + WINDOW, WINDOW, fake_read), 5010000);
        CHECK_EQ(reads, 2);
}

/* Forgotten (the loop may sleep): the next reading is real even a moment later. */
static void test_cpuclock_forget(void)
{
        CpuClock c = { 0 };

        fake_cpu = 100;
        reads = 0;
        cpu_clock_get(&c, 1000, WINDOW, fake_read);
        cpu_clock_forget(&c);
        fake_cpu = 150;
        CHECK_EQ(cpu_clock_get(&c, 1100, WINDOW, fake_read), 150);
        CHECK_EQ(reads, 2);
}

/* A reused reading counted time off the CPU (a short preemption); the real one after it is
 * lower: the clock stays where it was instead of going back (a frame's charge is never below 0). */
static void test_cpuclock_monotonic(void)
{
        CpuClock c = { 0 };

        fake_cpu = 1000;
        reads = 0;
        cpu_clock_get(&c, 1000, WINDOW, fake_read);
        CHECK_EQ(cpu_clock_get(&c, 1000 + WINDOW - 1, WINDOW, fake_read), 1000 + WINDOW - 1);
        fake_cpu = 1500; /* only 500 ns of it was on a CPU */
        CHECK_EQ(cpu_clock_get(&c, 1000 + WINDOW + 10, WINDOW, fake_read), 1000 + WINDOW - 1);
        CHECK_EQ(reads, 2);
        fake_cpu = 1000 + 2 * WINDOW;
        CHECK_EQ(cpu_clock_get(&c, 1000 + 3 * WINDOW, WINDOW, fake_read), 1000 + 2 * WINDOW);
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_cpuclock_reuse);
        TEST_RUN(argc, argv, test_cpuclock_forget);
        TEST_RUN(argc, argv, test_cpuclock_monotonic);
        return TEST_END();
}
