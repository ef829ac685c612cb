/* Small language helpers shared by every module: cleanup attributes, container_of, bounds. */
#pragma once

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#ifndef MIN
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#endif
#ifndef MAX
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#endif
#define _public_ __attribute__((visibility("default")))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _cleanup_(f) __attribute__((cleanup(f)))
#define _cleanup_free_ _cleanup_(freep)
#define _cleanup_close_ _cleanup_(closep)

/* Defines func##p(type *p), which calls func(*p) unless it is NULL: a variable declared
 * `_cleanup_(funcp) Type *x = NULL;` is freed by func on every return that has not stolen it
 * (steal_ptr). Use: DEFINE_CLEANUP(Server *, server_free). */
#define DEFINE_CLEANUP(type, func)                                                                  \
        static inline void func##p(type *p)                                                         \
        {                                                                                           \
                if (*p)                                                                             \
                        func(*p);                                                                   \
        }

static inline void freep(void *p)
{
        free(*(void **)p);
}

/* Closes *fd if it is valid; preserves errno so it can run on error paths. */
static inline int safe_close(int fd)
{
        if (fd >= 0) {
                int saved = errno;
                close(fd);
                errno = saved;
        }
        return -1;
}

static inline void closep(int *fd)
{
        *fd = safe_close(*fd);
}

/* Replaces *data (freed) by a copy of the n bytes at src; none when src is NULL or n is 0.
 * 0, or -ENOMEM with *data unchanged. */
static inline int bytes_replace(uint8_t **data, const void *src, size_t n)
{
        uint8_t *copy = NULL;

        if (src && n) {
                copy = malloc(n);
                if (!copy)
                        return -ENOMEM;
                memcpy(copy, src, n);
        }
        free(*data);
        *data = copy;
        return 0;
}

/* Moves ownership out of a cleanup-managed variable. */
#define steal_fd(fd) ({ int _f = (fd); (fd) = -1; _f; })
#define steal_ptr(p) ({ __typeof__(p) _p = (p); (p) = NULL; _p; })
