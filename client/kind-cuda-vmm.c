/* The cuda-vmm kind: device memory from cuMemCreate, exported once as a POSIX fd. The fd travels
 * through the broker (SCM_RIGHTS), so producer and consumer need not share a PID namespace, and
 * an fd the broker holds keeps the memory alive after its producer exits. Each side reserves its
 * own address range, maps the memory there and grants its device access. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "cuda.h"
#include "internal.h"
#include "macro.h"

static GcuMemAllocationProp vmm_prop(int ordinal)
{
        return (GcuMemAllocationProp){
                /* PINNED: the only type cuMemCreate has; the memory stays resident on the device. */
                .type = GCU_MEM_ALLOCATION_TYPE_PINNED,
                /* The export type is fixed here, at creation: without it nothing can ever be shared. */
                .requested_handle_types = GCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                .location = { .type = GCU_MEM_LOCATION_TYPE_DEVICE, .id = cuda_device(ordinal) },
        };
}

/* Says which of the two capabilities a device lacks, in words, before CUDA says "not supported". */
static int vmm_check_support(gpuipc_t *c, int ordinal, bool export)
{
        int vmm = 0, fd = 0;

        if (cuda_attribute(ordinal, GCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, &vmm) != GCU_SUCCESS ||
            (export && cuda_attribute(ordinal, GCU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                      &fd) != GCU_SUCCESS))
                return 0; /* cannot tell: let the calls themselves report */
        if (!vmm) {
                client_errmsg(c, "device %d (%s) does not support CUDA virtual memory management, which cuda-vmm "
                              "buffers need: use cuda-legacy or memfd", ordinal, cuda_device_uuid(ordinal));
                return GPUIPC_E_KIND;
        }
        if (export && !fd) {
                client_errmsg(c, "device %d (%s) cannot export memory as a file descriptor (a driver or sandbox "
                              "limit), which cuda-vmm buffers need: use cuda-legacy or memfd", ordinal,
                              cuda_device_uuid(ordinal));
                return GPUIPC_E_KIND;
        }
        return 0;
}

int cuda_vmm_check(gpuipc_t *c, int ordinal)
{
        int r = cuda_require(c);

        if (r == 0)
                r = cuda_check_device(c, ordinal);
        return r < 0 ? r : vmm_check_support(c, ordinal, true);
}

/* size rounded up to the allocation granularity of prop: what cuMemCreate and cuMemMap need. */
static int vmm_round(gpuipc_t *c, const GcuMemAllocationProp *prop, size_t size, size_t *ret)
{
        size_t g = 0;
        GcuResult cr = CU(cuMemGetAllocationGranularity, &g, prop, GCU_MEM_ALLOC_GRANULARITY_MINIMUM);

        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuMemGetAllocationGranularity", cr);
        /* g == 0 would divide by zero below; the other test keeps the rounding from wrapping. */
        if (g == 0 || size > SIZE_MAX - (g - 1)) {
                client_errmsg(c, "cannot round %zu bytes up to the allocation granularity (%zu)", size, g);
                return GPUIPC_E_INVALID;
        }
        *ret = (size + g - 1) / g * g;
        return 0;
}

/* Gives ordinal access to the mapped range: read-write, or read-only for a consumer of a
 * read-only buffer where the driver supports that. The fd grants full access to whoever holds
 * it, so read-only guards against mistakes rather than against an adversary, and read-write is
 * an acceptable fallback where read-only mappings are refused. */
static int vmm_set_access(gpuipc_t *c, GcuDevicePtr p, size_t size, int ordinal, bool writable)
{
        GcuMemAccessDesc d = {
                .location = { .type = GCU_MEM_LOCATION_TYPE_DEVICE, .id = cuda_device(ordinal) },
                .flags = writable ? GCU_MEM_ACCESS_FLAGS_PROT_READWRITE : GCU_MEM_ACCESS_FLAGS_PROT_READ,
        };
        GcuResult cr = CU(cuMemSetAccess, p, size, &d, 1);

        if (cr != GCU_SUCCESS && !writable && (cr == GCU_ERROR_NOT_SUPPORTED || cr == GCU_ERROR_INVALID_VALUE)) {
                d.flags = GCU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                cr = CU(cuMemSetAccess, p, size, &d, 1);
        }
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuMemSetAccess", cr);
        return 0;
}

/* Undoes vmm_map(). Failures cannot be acted on; they are left in c's errmsg. */
static void vmm_unmap_range(gpuipc_t *c, GcuDevicePtr p, size_t size)
{
        GcuResult cr = CU(cuMemUnmap, p, size);

        if (cr != GCU_SUCCESS)
                cuda_error(c, "cuMemUnmap", cr);
        cr = CU(cuMemAddressFree, p, size);
        if (cr != GCU_SUCCESS)
                cuda_error(c, "cuMemAddressFree", cr);
}

/* Reserves an address range of size bytes, maps handle there and gives ordinal access. On
 * failure nothing stays reserved or mapped (the handle is the caller's either way). */
static int vmm_map(gpuipc_t *c, GcuMemHandle handle, size_t size, int ordinal, bool writable, GcuDevicePtr *ret)
{
        GcuDevicePtr p = 0;
        GcuResult cr;
        int r;

        cr = CU(cuMemAddressReserve, &p, size, 0, 0, 0);
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuMemAddressReserve", cr);
        cr = CU(cuMemMap, p, size, 0, handle, 0);
        if (cr != GCU_SUCCESS) {
                r = cuda_error(c, "cuMemMap", cr);
                (void)CU(cuMemAddressFree, p, size); /* the error above is the one to report */
                return r;
        }
        r = vmm_set_access(c, p, size, ordinal, writable);
        if (r < 0) {
                (void)CU(cuMemUnmap, p, size);
                (void)CU(cuMemAddressFree, p, size);
                return r;
        }
        *ret = p;
        return 0;
}

/* ---- producer ---- */

static int vmm_alloc_in_ctx(gpuipc_t *c, gpuipc_buffer_t *b, size_t size, int ordinal)
{
        GcuMemAllocationProp prop = vmm_prop(ordinal);
        GcuMemHandle handle = 0;
        GcuDevicePtr p = 0;
        size_t rounded = 0;
        GcuResult cr;
        int r;

        r = vmm_check_support(c, ordinal, true);
        if (r < 0)
                return r;
        r = vmm_round(c, &prop, size, &rounded);
        if (r < 0)
                return r;
        cr = CU(cuMemCreate, &handle, rounded, &prop, 0);
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuMemCreate", cr);
        r = vmm_map(c, handle, rounded, ordinal, true, &p);
        if (r < 0) {
                (void)CU(cuMemRelease, handle); /* the error above is the one to report */
                return r;
        }
        b->ka.handle = handle;
        b->ka.dptr = p;
        b->ka.reserved = rounded;
        b->ptr = (void *)(uintptr_t)p;
        b->size = size;
        b->ordinal = ordinal;
        snprintf(b->device, sizeof(b->device), "%s", cuda_device_uuid(ordinal));
        return 0;
}

static int vmm_alloc(gpuipc_t *c, gpuipc_buffer_t *b, size_t size, int device)
{
        int r = cuda_ctx_push(c, device);

        if (r < 0)
                return r;
        return cuda_ctx_pop(c, vmm_alloc_in_ctx(c, b, size, device));
}

/* Exports once (it costs about a millisecond) and keeps the fd in b for every later publish; the
 * broker gets its own copy with each send. writable cannot be enforced here: whoever holds the fd
 * may map it as it likes, so consumers' libraries honour it. */
static int vmm_export(gpuipc_t *c, gpuipc_buffer_t *b, bool writable, int *ret_fd)
{
        int fd = -1, r;
        GcuResult cr;

        (void)writable;
        if (b->ka.fd < 0) {
                r = cuda_ctx_push(c, b->ordinal);
                if (r < 0)
                        return r;
                cr = CU(cuMemExportToShareableHandle, &fd, b->ka.handle, GCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                r = cuda_ctx_pop(c, cr == GCU_SUCCESS ? 0 : cuda_error(c, "cuMemExportToShareableHandle", cr));
                if (r < 0) {
                        if (cr == GCU_SUCCESS)
                                safe_close(fd);
                        return r;
                }
                /* Not inherited by programs we might exec: the memory is only for those we give it to. */
                if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
                        r = -errno;
                        safe_close(fd);
                        return r;
                }
                b->ka.fd = fd;
        }
        *ret_fd = b->ka.fd;
        return 0;
}

static int vmm_sync(gpuipc_t *c, gpuipc_buffer_t *b)
{
        return cuda_sync(c, b->ordinal);
}

/* Consumers' mappings keep the memory alive by themselves, so this never waits for them. */
static void vmm_free(gpuipc_t *c, gpuipc_buffer_t *b)
{
        GcuResult cr;

        if (b->ka.dptr && cuda_ctx_push(c, b->ordinal) == 0) {
                vmm_unmap_range(c, b->ka.dptr, b->ka.reserved);
                cr = CU(cuMemRelease, b->ka.handle);
                if (cr != GCU_SUCCESS)
                        cuda_error(c, "cuMemRelease", cr);
                cuda_ctx_pop(c, 0);
        }
        b->ka.fd = safe_close(b->ka.fd);
        b->ka.dptr = b->ka.handle = b->ka.reserved = 0;
        b->ptr = NULL;
}

/* ---- consumer ---- */

/* Imports the fd (closing it: the imported handle is all we need), maps it and releases the
 * handle at once, since the mapping alone keeps the memory alive. */
static int vmm_import_in_ctx(gpuipc_t *c, Mapping *m, int *fd, int ordinal)
{
        GcuMemAllocationProp prop = vmm_prop(ordinal);
        GcuMemHandle handle = 0;
        GcuDevicePtr p = 0;
        size_t rounded = 0;
        GcuResult cr;
        int r;

        r = vmm_check_support(c, ordinal, false);
        if (r < 0)
                return r;
        cr = CU(cuMemImportFromShareableHandle, &handle, (void *)(uintptr_t)*fd,
                GCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        *fd = safe_close(*fd);
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuMemImportFromShareableHandle", cr);
        /* The granularity the producer rounded with is that of the memory's own properties; the
         * target device's serves when the driver will not tell them. Mapping less than the whole
         * allocation is allowed, more is not. */
        if (CU(cuMemGetAllocationPropertiesFromHandle, &prop, handle) != GCU_SUCCESS)
                prop = vmm_prop(ordinal);
        r = vmm_round(c, &prop, m->size, &rounded);
        if (r == 0)
                r = vmm_map(c, handle, rounded, ordinal, m->writable, &p);
        cr = CU(cuMemRelease, handle);
        if (r < 0)
                return r;
        if (cr != GCU_SUCCESS) {
                vmm_unmap_range(c, p, rounded);
                return cuda_error(c, "cuMemRelease", cr);
        }
        m->dptr = p;
        m->reserved = rounded;
        m->handle = 0;
        m->ptr = (void *)(uintptr_t)p;
        m->ordinal = ordinal;
        return 0;
}

static int vmm_import(gpuipc_t *c, Mapping *m, const ProtoMsg *reply, int fd)
{
        _cleanup_close_ int owned = fd;
        char uuid[PROTO_MAX_UUID + 1];
        bool guessed = false;
        int ordinal = 0, r;

        if (owned < 0) {
                client_errmsg(c, "the broker attached a cuda-vmm buffer without its fd");
                return GPUIPC_E_BAD_REPLY;
        }
        snprintf(uuid, sizeof(uuid), "%.*s", (int)MIN(reply->device.len, (uint32_t)PROTO_MAX_UUID),
                 reply->device.ptr ? reply->device.ptr : "");
        r = cuda_import_device(c, uuid, &ordinal, &guessed);
        if (r < 0)
                return r;
        r = cuda_ctx_push(c, ordinal);
        if (r < 0)
                return r;
        r = cuda_ctx_pop(c, vmm_import_in_ctx(c, m, &owned, ordinal));
        if (r == GPUIPC_E_CUDA && guessed)
                return cuda_device_unreachable(c, uuid, ordinal);
        return r;
}

static void vmm_unmap(gpuipc_t *c, Mapping *m)
{
        if (m->dptr && cuda_ctx_push(c, m->ordinal) == 0) {
                vmm_unmap_range(c, m->dptr, m->reserved);
                cuda_ctx_pop(c, 0);
        }
        m->dptr = m->reserved = 0;
        m->ptr = NULL;
}

const KindOps kind_cuda_vmm_ops = {
        .alloc = vmm_alloc,
        .export = vmm_export,
        .sync = vmm_sync,
        .free = vmm_free,
        .import = vmm_import,
        .unmap = vmm_unmap,
        .copy = cuda_kind_copy,
};
