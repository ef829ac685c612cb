/* The one limit on the size of a buffer, met by every way of making one (gpuipc_buffer_alloc, pool
 * segments, ring slots; gpuipcctl publish and the Python package through them): at least one byte,
 * at most GPUIPC_MAX_BUFFER_SIZE, and a memfd buffer no larger than the memory this process may
 * still use. A memfd's pages are taken only when touched, so a larger one would be made without
 * complaint and fail later, as an OOM kill or a SIGBUS in whoever touches it last. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Reads "Key: N kB" from /proc/meminfo, in bytes; UINT64_MAX when absent. */
static uint64_t meminfo_bytes(const char *key)
{
        char line[256];
        uint64_t v = UINT64_MAX;
        size_t klen = strlen(key);
        FILE *f = fopen("/proc/meminfo", "re");

        if (!f)
                return v;
        while (fgets(line, sizeof(line), f)) {
                unsigned long long kb;
                if (strncmp(line, key, klen) == 0 && line[klen] == ':' && sscanf(line + klen + 1, "%llu", &kb) == 1) {
                        v = (uint64_t)kb * 1024;
                        break;
                }
        }
        fclose(f);
        return v;
}

/* One number from a cgroup v2 file of this process's cgroup (its namespace's root, as a container
 * sees it); UINT64_MAX for "max" or absent. */
static uint64_t cgroup_value(const char *file)
{
        char path[512], buf[64];
        unsigned long long v;
        FILE *f;

        snprintf(path, sizeof(path), "/sys/fs/cgroup/%s", file);
        f = fopen(path, "re");
        if (!f)
                return UINT64_MAX;
        if (!fgets(buf, sizeof(buf), f) || sscanf(buf, "%llu", &v) != 1)
                v = UINT64_MAX;
        fclose(f);
        return v;
}

uint64_t size_limit_host_memory(const char **ret_where)
{
        uint64_t avail = meminfo_bytes("MemAvailable");
        uint64_t max = cgroup_value("memory.max"), used = cgroup_value("memory.current");

        *ret_where = "available memory (MemAvailable)";
        /* The smaller bound wins: a container sees the host's MemAvailable, but its cgroup's limit is
         * what the OOM killer enforces. */
        if (max != UINT64_MAX && used != UINT64_MAX) {
                uint64_t left = used < max ? max - used : 0;
                if (left < avail) {
                        avail = left;
                        *ret_where = "memory this cgroup may still use (memory.max)";
                }
        }
        return avail;
}

int size_limit_check(gpuipc_t *c, gpuipc_kind_t kind, size_t size)
{
        const char *where;
        uint64_t avail;

        if (size == 0)
                return client_fail(c, GPUIPC_E_INVALID, "a buffer needs at least 1 byte");
        if ((uint64_t)size > GPUIPC_MAX_BUFFER_SIZE)
                return client_fail(c, GPUIPC_E_INVALID, "%zu bytes is more than any buffer may hold "
                                   "(GPUIPC_MAX_BUFFER_SIZE, 2^62 bytes)", size);
        if (kind != GPUIPC_KIND_MEMFD)
                return 0; /* the GPU's memory is the driver's to refuse, and it names the call */
        avail = size_limit_host_memory(&where);
        if (avail == UINT64_MAX || (uint64_t)size <= avail)
                return 0;
        return client_fail(c, -ENOMEM, "%zu bytes (%.1f GiB) is more than the %s: %.1f GiB; a memfd buffer lives "
                           "in RAM", size, (double)size / (1 << 30), where, (double)avail / (1 << 30));
}
