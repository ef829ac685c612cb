/* Preloaded (LD_PRELOAD) into a broker that a test starts, to show it a wall clock set
 * GPUIPC_TEST_CLOCK_OFFSET_S seconds away from the real one: what an administrator or NTP stepping
 * the clock between two broker starts does. The monotonic and boot clocks are left alone, as a
 * step leaves them. The broker reads the wall clock through clock_gettime only (util/clock.h,
 * its log and its sandbox's log lines); interposing it needs no privilege and puts no test hook
 * into the broker that ships. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*ClockGettime)(clockid_t id, struct timespec *ts);

static ClockGettime real_clock_gettime;
static time_t offset_s;

/* Before main (and before any sandbox): dlsym may need what a filter refuses. */
__attribute__((constructor)) static void clock_shift_init(void)
{
        const char *s = getenv("GPUIPC_TEST_CLOCK_OFFSET_S");

        real_clock_gettime = (ClockGettime)dlsym(RTLD_NEXT, "clock_gettime");
        offset_s = s ? (time_t)strtoll(s, NULL, 10) : 0;
}

/* Exported despite the project's -fvisibility=hidden: it is what the broker's calls must find. */
__attribute__((visibility("default"))) int clock_gettime(clockid_t id, struct timespec *ts)
{
        /* A library initialised before this one (a sanitizer's runtime) may read a clock first. */
        int r = real_clock_gettime ? real_clock_gettime(id, ts) : (int)syscall(SYS_clock_gettime, id, ts);

        if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI))
                ts->tv_sec += offset_s;
        return r;
}
