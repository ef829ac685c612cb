/* Placeholder until the CUDA kinds land: every operation says CUDA is unavailable. */
#include <unistd.h>

#include "internal.h"

static int no_alloc(gpuipc_t *c, gpuipc_buffer_t *b, size_t size, int device)
{
        (void)b; (void)size; (void)device;
        client_errmsg(c, "this libgpuipc has no CUDA support yet");
        return GPUIPC_E_NO_CUDA;
}

static int no_export(gpuipc_t *c, gpuipc_buffer_t *b, bool writable, int *ret_fd)
{
        (void)c; (void)b; (void)writable; (void)ret_fd;
        return GPUIPC_E_NO_CUDA;
}

static void no_free(gpuipc_t *c, gpuipc_buffer_t *b)
{
        (void)c; (void)b;
}

static int no_import(gpuipc_t *c, Mapping *m, const ProtoMsg *reply, int fd)
{
        (void)m; (void)reply;
        if (fd >= 0)
                close(fd);
        client_errmsg(c, "this libgpuipc has no CUDA support yet");
        return GPUIPC_E_NO_CUDA;
}

static void no_unmap(gpuipc_t *c, Mapping *m)
{
        (void)c; (void)m;
}

static int no_copy(void *ptr, int ordinal, void *host, size_t len, bool to_host)
{
        (void)ptr; (void)ordinal; (void)host; (void)len; (void)to_host;
        return GPUIPC_E_NO_CUDA;
}

const KindOps kind_cuda_legacy_ops = { no_alloc, no_export, NULL, no_free, no_import, no_unmap, no_copy };
