/* Futex waits and wakes on shared memory (rings' host doorbells). Shared, never private: the word
 * lives in a mapping other processes have too, so the kernel keys it by the file and offset. */
#pragma once

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Sleeps while *word == expected, at most timeout_ms (< 0: no limit). 0 when woken (or the word
 * had changed already), -ETIMEDOUT, or -EINTR. Needs only read access to the word. */
static inline int futex_wait(const volatile uint32_t *word, uint32_t expected, int timeout_ms)
{
        struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
        long r = syscall(SYS_futex, word, FUTEX_WAIT, expected, timeout_ms < 0 ? NULL : &ts, NULL, 0);

        if (r == 0 || errno == EAGAIN)
                return 0;
        return -errno;
}

/* Wakes up to n sleepers on word. */
static inline void futex_wake(const volatile uint32_t *word, int n)
{
        (void)syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
}
