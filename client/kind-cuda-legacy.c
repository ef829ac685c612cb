/* The cuda-legacy kind: cuMemAlloc memory (ours, or the caller's through gpuipc_buffer_wrap_cuda)
 * shared by a 64-byte cuIpcGetMemHandle handle of its allocation's base plus an offset. As measured
 * (docs/legacy-ipc.md), the driver opens such a handle in any other process whose PID, as that
 * process sees it, differs from the exporter's, across PID namespaces too; the memory dies with its
 * producer. cuda-vmm has neither limit. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda.h"
#include "internal.h"
#include "macro.h"

/* A handle exports the whole allocation it points into, and the driver may place small
 * allocations side by side: whole 2 MiB blocks keep other data out of what consumers see. */
#define LEGACY_ALIGN (2u << 20)

static void set_device(gpuipc_buffer_t *b, int ordinal)
{
        b->ordinal = ordinal;
        snprintf(b->device, sizeof(b->device), "%s", cuda_device_uuid(ordinal));
}

/* ---- producer ---- */

static int legacy_alloc_in_ctx(gpuipc_t *c, gpuipc_buffer_t *b, size_t size, int ordinal)
{
        GcuDevicePtr p = 0;
        GcuResult cr;

        /* Checked before rounding up, which would otherwise wrap to a tiny allocation. */
        if (size > SIZE_MAX - (LEGACY_ALIGN - 1)) {
                client_errmsg(c, "%zu bytes is more than any GPU holds", size);
                return GPUIPC_E_INVALID;
        }
        cr = CU(cuMemAlloc, &p, (size + LEGACY_ALIGN - 1) / LEGACY_ALIGN * LEGACY_ALIGN);
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuMemAlloc", cr);
        b->ka.base = b->ka.dptr = p;
        b->ptr = (void *)(uintptr_t)p;
        b->size = size;
        set_device(b, ordinal);
        return 0;
}

/* The *_in_ctx split: every CUDA call runs with the device's context pushed, and the pop happens
 * on every path, success or not (cuda_ctx_pop passes the result through). */
static int legacy_alloc(gpuipc_t *c, gpuipc_buffer_t *b, size_t size, int device)
{
        int r = cuda_ctx_push(c, device);

        if (r < 0)
                return r;
        return cuda_ctx_pop(c, legacy_alloc_in_ctx(c, b, size, device));
}

static int legacy_export_in_ctx(gpuipc_t *c, gpuipc_buffer_t *b)
{
        GcuIpcMemHandle handle;
        GcuDevicePtr base = 0;
        size_t len = 0;
        GcuResult cr;

        /* The handle names an allocation by its base; consumers add the offset. */
        cr = CU(cuMemGetAddressRange, &base, &len, b->ka.dptr);
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuMemGetAddressRange", cr);
        cr = CU(cuIpcGetMemHandle, &handle, base);
        if (cr != GCU_SUCCESS)
                return cuda_error_why(c, "cuIpcGetMemHandle", cr,
                                      "only memory from cuMemAlloc/cudaMalloc has legacy IPC handles (not memory "
                                      "from cuMemCreate, cudaMallocAsync pools or managed memory): share that "
                                      "as cuda-vmm instead");
        _Static_assert(sizeof(handle) == sizeof(b->ka.ipc_handle), "legacy handle size");
        memcpy(b->ka.ipc_handle, &handle, sizeof(handle));
        b->ka.base = base;
        return 0;
}

/* writable cannot be enforced: an opened handle is always read-write. */
static int legacy_export(gpuipc_t *c, gpuipc_buffer_t *b, bool writable, int *ret_fd)
{
        int r;

        (void)writable;
        r = cuda_ctx_push(c, b->ordinal);
        if (r < 0)
                return r;
        r = cuda_ctx_pop(c, legacy_export_in_ctx(c, b));
        if (r < 0)
                return r;
        *ret_fd = -1;
        return 0;
}

static int legacy_sync(gpuipc_t *c, gpuipc_buffer_t *b)
{
        return cuda_sync(c, b->ordinal);
}

/* buffer.c calls this only once no consumer can hold the memory open (drained or never
 * published): freeing under an open handle is undefined behaviour. */
static void legacy_free(gpuipc_t *c, gpuipc_buffer_t *b)
{
        GcuResult cr;

        if (!b->ka.wrapped && b->ka.dptr && cuda_ctx_push(c, b->ordinal) == 0) {
                cr = CU(cuMemFree, b->ka.dptr);
                if (cr != GCU_SUCCESS)
                        cuda_error(c, "cuMemFree", cr);
                cuda_ctx_pop(c, 0);
        }
        b->ka.dptr = b->ka.base = 0;
        b->ptr = NULL;
}

/* ---- wrapping the caller's memory ---- */

/* The device ordinal of the memory at ptr, checking that legacy IPC can share it. */
static int wrap_find_device(gpuipc_t *c, GcuDevicePtr ptr, int *ret)
{
        unsigned int type = 0;
        int ordinal = -1, capable = 0;
        GcuResult cr;

        cr = CU(cuPointerGetAttribute, &type, GCU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
        if (cr != GCU_SUCCESS)
                return cuda_error_why(c, "cuPointerGetAttribute", cr,
                                      "the pointer is not CUDA memory of this process");
        if (type != GCU_MEMORYTYPE_DEVICE) {
                client_errmsg(c, "0x%llx is not device memory (CUDA memory type %u): only cuMemAlloc/cudaMalloc "
                              "memory can be shared as cuda-legacy", (unsigned long long)ptr, type);
                return GPUIPC_E_INVALID;
        }
        cr = CU(cuPointerGetAttribute, &ordinal, GCU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr);
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuPointerGetAttribute(DEVICE_ORDINAL)", cr);
        /* Drivers before 11.3 cannot say; cuIpcGetMemHandle will then. */
        cr = CU(cuPointerGetAttribute, &capable, GCU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr);
        if (cr == GCU_SUCCESS && !capable) {
                client_errmsg(c, "0x%llx cannot be shared with a legacy IPC handle (it comes from cuMemCreate, a "
                              "cudaMallocAsync pool or similar): allocate it with cudaMalloc, or allocate a "
                              "cuda-vmm buffer with gpuipc_buffer_alloc", (unsigned long long)ptr);
                return GPUIPC_E_KIND;
        }
        *ret = ordinal;
        return 0;
}

/* The allocation around ptr must hold all of [ptr, ptr + size). */
static int wrap_check_range(gpuipc_t *c, GcuDevicePtr ptr, size_t size, GcuDevicePtr *ret_base)
{
        GcuDevicePtr base = 0;
        size_t len = 0;
        GcuResult cr = CU(cuMemGetAddressRange, &base, &len, ptr);

        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuMemGetAddressRange", cr);
        if (size > len - (ptr - base)) {
                client_errmsg(c, "0x%llx + %zu bytes runs past the end of its allocation (0x%llx, %zu bytes)",
                              (unsigned long long)ptr, size, (unsigned long long)base, len);
                return GPUIPC_E_INVALID;
        }
        *ret_base = base;
        return 0;
}

static int wrap_probe(gpuipc_t *c, GcuDevicePtr ptr, size_t size, int *ret_ordinal, GcuDevicePtr *ret_base)
{
        int ordinal = -1, r;

        /* Pointer attributes need no current context: the address says where the memory lives. */
        r = wrap_find_device(c, ptr, &ordinal);
        if (r < 0)
                return r;
        r = cuda_ctx_push(c, ordinal);
        if (r < 0)
                return r;
        r = cuda_ctx_pop(c, wrap_check_range(c, ptr, size, ret_base));
        if (r < 0)
                return r;
        *ret_ordinal = ordinal;
        return 0;
}

_public_ int gpuipc_buffer_wrap_cuda(gpuipc_t *c, uint64_t device_ptr, size_t size, gpuipc_buffer_t **ret)
{
        CLIENT_LOCKED(c);
        GcuDevicePtr base = 0;
        gpuipc_buffer_t *b;
        int ordinal = -1, r;

        if (!c || !ret || !device_ptr || size == 0)
                return GPUIPC_E_INVALID;
        r = cuda_require(c);
        if (r < 0)
                return r;
        r = wrap_probe(c, device_ptr, size, &ordinal, &base);
        if (r < 0)
                return r;
        /* As gpuipc_buffer_alloc() makes them (with an id of its own), but the memory stays the
         * caller's. */
        b = buffer_new_own(c, GPUIPC_KIND_CUDA_LEGACY);
        if (!b)
                return -ENOMEM;
        b->ka.wrapped = true;
        b->ka.base = base;
        b->ka.dptr = device_ptr;
        b->ptr = (void *)(uintptr_t)device_ptr;
        b->size = size;
        set_device(b, ordinal);
        list_append(&c->own, &b->own_link);
        *ret = b;
        return 0;
}

/* ---- consumer ---- */

/* cuIpcOpenMemHandle's errors, explained by the causes that fit what this process knows: legacy IPC
 * fails in ways its codes do not name. producer_pid: the exporter's own PID as the broker reported it
 * (0: unknown); guessed: the device was chosen without the producer's UUID being visible here. */
static int legacy_open_error(gpuipc_t *c, GcuResult cr, uint64_t producer_pid, bool guessed)
{
        char why[320], theirs[24] = "unknown";

        if (producer_pid)
                snprintf(theirs, sizeof(theirs), "%llu", (unsigned long long)producer_pid);
        switch (cr) {
        case GCU_ERROR_INVALID_CONTEXT:
        case GCU_ERROR_INVALID_VALUE:
                if (producer_pid && producer_pid == (uint64_t)getpid()) {
                        snprintf(why, sizeof(why), "the producer is PID %llu in its PID namespace and so is this "
                                 "process in its own: CUDA takes such a handle for one of this process's own. Start "
                                 "one of them at another PID (gpuipcctl run -- CMD), or publish as cuda-vmm",
                                 (unsigned long long)producer_pid);
                        cuda_error_why(c, "cuIpcOpenMemHandle", cr, why);
                        return GPUIPC_E_SAME_PID;
                }
                snprintf(why, sizeof(why), "the PIDs differ (producer %s, this process %d), so the handle is "
                         "likely another GPU's: %s; or publish as cuda-vmm",
                         theirs, (int)getpid(),
                         guessed ? "the producer's GPU is not visible here, give both containers the same "
                                   "ResourceClaim" :
                                   "check that both containers see the buffer's GPU (the same ResourceClaim) and "
                                   "that the producer exported memory of that GPU");
                return cuda_error_why(c, "cuIpcOpenMemHandle", cr, why);
        case GCU_ERROR_INVALID_HANDLE:
                return cuda_error_why(c, "cuIpcOpenMemHandle", cr,
                                      "the producer's memory is gone (it exited or freed it): legacy memory dies "
                                      "with its producer; cuda-vmm buffers published broker-held outlive it");
        case GCU_ERROR_MAP_FAILED:
                return cuda_error_why(c, "cuIpcOpenMemHandle", cr,
                                      "the handle comes from this very process, or the driver could not map it "
                                      "into this one");
        }
        return cuda_error(c, "cuIpcOpenMemHandle", cr);
}

/* Opens the handle, checking that offset and size lie within what it exports. */
static int legacy_open_in_ctx(gpuipc_t *c, Mapping *m, const GcuIpcMemHandle *handle, uint64_t offset,
                              uint64_t producer_pid, bool guessed)
{
        GcuDevicePtr base = 0, range_base = 0;
        size_t len = 0;
        GcuResult cr;

        cr = CU(cuIpcOpenMemHandle, &base, *handle, GCU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (cr != GCU_SUCCESS)
                return legacy_open_error(c, cr, producer_pid, guessed);
        cr = CU(cuMemGetAddressRange, &range_base, &len, base);
        if (cr != GCU_SUCCESS || offset > len || m->size > len - offset) {
                int r = cr != GCU_SUCCESS ? cuda_error(c, "cuMemGetAddressRange", cr) : GPUIPC_E_BAD_REPLY;

                if (cr == GCU_SUCCESS)
                        client_errmsg(c, "the buffer (offset %llu, %zu bytes) lies outside the memory its handle "
                                      "exports (%zu bytes)", (unsigned long long)offset, m->size, len);
                (void)CU(cuIpcCloseMemHandle, base); /* the error above is the one to report */
                return r;
        }
        m->dptr = base;
        m->ptr = (void *)(uintptr_t)(base + offset);
        return 0;
}

static int legacy_import(gpuipc_t *c, Mapping *m, const ProtoMsg *reply, int fd)
{
        char uuid[PROTO_MAX_UUID + 1];
        GcuIpcMemHandle handle;
        bool guessed = false;
        int ordinal = 0, r;

        safe_close(fd); /* nothing travels but the handle */
        if (reply->handle.len != sizeof(handle)) {
                client_errmsg(c, "the broker attached a cuda-legacy buffer without its %zu-byte handle",
                              sizeof(handle));
                return GPUIPC_E_BAD_REPLY;
        }
        memcpy(&handle, reply->handle.ptr, sizeof(handle));
        snprintf(uuid, sizeof(uuid), "%.*s", (int)MIN(reply->device.len, (uint32_t)PROTO_MAX_UUID),
                 reply->device.ptr ? reply->device.ptr : "");
        r = cuda_import_device(c, uuid, &ordinal, &guessed);
        if (r < 0)
                return r;
        r = cuda_ctx_push(c, ordinal);
        if (r < 0)
                return r;
        r = cuda_ctx_pop(c, legacy_open_in_ctx(c, m, &handle, reply->offset, reply->self_pid, guessed));
        if (r == GPUIPC_E_CUDA && guessed)
                return cuda_device_unreachable(c, uuid, ordinal);
        if (r < 0)
                return r;
        m->ordinal = ordinal;
        return 0;
}

/* Opens are counted per context: one close for our one open, never more. */
static void legacy_unmap(gpuipc_t *c, Mapping *m)
{
        GcuResult cr;

        if (m->dptr && cuda_ctx_push(c, m->ordinal) == 0) {
                cr = CU(cuIpcCloseMemHandle, m->dptr);
                if (cr != GCU_SUCCESS)
                        cuda_error(c, "cuIpcCloseMemHandle", cr);
                cuda_ctx_pop(c, 0);
        }
        m->dptr = 0;
        m->ptr = NULL;
}

const KindOps kind_cuda_legacy_ops = {
        .alloc = legacy_alloc,
        .export = legacy_export,
        .sync = legacy_sync,
        .free = legacy_free,
        .import = legacy_import,
        .unmap = legacy_unmap,
        .copy = cuda_kind_copy,
};
