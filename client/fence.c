/* GPU-side fences between processes: a 64-bit counter in a small cuda-vmm buffer, advanced with
 * cuStreamWriteValue64 and awaited with cuStreamWaitValue64, both ordered in the caller's stream.
 * CUDA's IPC events need distinct PIDs and one /dev/shm between the two containers; cuda-vmm memory
 * needs neither. Fences made of an IPC event are in fence-event.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "fence.h"
#include "internal.h"
#include "macro.h"

/* Both ends need 64-bit stream memory operations on their device. */
static int fence_check_device(gpuipc_t *c, int ordinal)
{
        bool ok = false;
        GcuResult cr = cuda_can_mem_ops_64(ordinal, &ok);

        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuDeviceGetAttribute(CAN_USE_64_BIT_STREAM_MEM_OPS)", cr);
        if (!ok) {
                client_errmsg(c, "device %d (%s) cannot run 64-bit stream memory operations, which gpuipc fences "
                              "use: update the NVIDIA driver (before 12.0 they also needed the nvidia module "
                              "option NVreg_EnableStreamMemOPs=1), or synchronize on the host instead",
                              ordinal, cuda_device_uuid(ordinal));
                return GPUIPC_E_KIND;
        }
        return 0;
}

static int fence_new(gpuipc_t *c, gpuipc_buffer_t *b, gpuipc_fence_t **ret)
{
        gpuipc_fence_t *f = calloc(1, sizeof(*f));

        if (!f)
                return -ENOMEM;
        f->conn = c;
        f->buf = b;
        f->counter = (GcuDevicePtr)(uintptr_t)b->ptr;
        f->ordinal = b->ordinal;
        *ret = f;
        return 0;
}

/* Undoes a half-made fence, keeping the message of the step that failed: dropping the buffer may
 * itself set an error message, which would replace the one that explains r. */
int fence_undo(gpuipc_t *c, gpuipc_buffer_t *b, int r)
{
        char why[sizeof(c->errmsg)];

        memcpy(why, client_errbuf(c), sizeof(why));
        buffer_drop(c, b);
        memcpy(client_errbuf(c), why, sizeof(why));
        return r;
}

_public_ int gpuipc_fence_create(gpuipc_t *c, const char *name, int device, gpuipc_fence_t **ret)
{
        CLIENT_LOCKED(c);
        gpuipc_publish_options_t opts = {
                .struct_size = sizeof(opts),
                .writable = 1,          /* either end may signal */
                .broker_held = 0,       /* a fence is about live work: it goes with its creator */
        };
        uint64_t zero = 0;
        gpuipc_buffer_t *b = NULL;
        int r;

        if (!c || !name || !ret)
                return GPUIPC_E_INVALID;
        r = cuda_require(c);
        if (r < 0)
                return r;
        r = cuda_check_device(c, device);
        if (r < 0)
                return r;
        r = fence_check_device(c, device);
        if (r < 0)
                return r;
        /* The allocation is one granule (2 MiB on current GPUs) whatever we ask for. */
        r = gpuipc_buffer_alloc(c, GPUIPC_KIND_CUDA_VMM, sizeof(uint64_t), device, &b);
        if (r < 0)
                return r;
        /* Zeroed before it is published: a waiter that opens the fence at once must see 0, not
         * whatever the fresh allocation held. */
        r = cuda_copy(c, b->ptr, b->ordinal, &zero, sizeof(zero), false);
        if (r == 0)
                r = gpuipc_publish(c, b, name, &opts);
        if (r == 0)
                r = fence_new(c, b, ret);
        if (r < 0)
                return fence_undo(c, b, r);
        return 0;
}

_public_ int gpuipc_fence_open(gpuipc_t *c, const char *name, int timeout_ms, gpuipc_fence_t **ret)
{
        CLIENT_LOCKED(c);
        gpuipc_buffer_t *b = NULL;
        int r;

        if (!c || !name || !ret)
                return GPUIPC_E_INVALID;
        /* Before the attach: without CUDA there is no point taking a reference. */
        r = cuda_require(c);
        if (r < 0)
                return r;
        r = gpuipc_attach(c, name, timeout_ms, &b);
        if (r < 0)
                return r;
        if (fence_event_is(b))
                return fence_event_open(c, b, ret);
        if (b->kind != GPUIPC_KIND_CUDA_VMM || b->size < sizeof(uint64_t)) {
                client_errmsg(c, "'%s' is not a gpuipc fence (a cuda-vmm buffer of at least 8 bytes)", name);
                return fence_undo(c, b, GPUIPC_E_KIND);
        }
        r = fence_check_device(c, b->ordinal);
        if (r == 0)
                r = fence_new(c, b, ret);
        if (r < 0)
                return fence_undo(c, b, r);
        return 0;
}

static int fence_enqueue(gpuipc_fence_t *f, GcuStream s, uint64_t value, bool wait)
{
        gpuipc_t *c = f->conn;
        GcuResult cr;
        int r;

        r = cuda_check_stream(c, f->ordinal, s, "the fence is mapped on");
        if (r < 0)
                return r;
        if (f->event)
                return fence_event_enqueue(f, s, wait);
        if (wait) {
                /* A cyclic >=: (int64_t)(*counter - value) >= 0, so counters may wrap. */
                cr = CU(cuStreamWaitValue64, s, f->counter, value, GCU_STREAM_WAIT_VALUE_GEQ);
                return cr == GCU_SUCCESS ? 0 : cuda_error(c, "cuStreamWaitValue64", cr);
        }
        /* The default flags put a memory barrier before the write: work the stream ran before is
         * visible to whoever sees the new value. */
        cr = CU(cuStreamWriteValue64, s, f->counter, value, GCU_STREAM_WRITE_VALUE_DEFAULT);
        return cr == GCU_SUCCESS ? 0 : cuda_error(c, "cuStreamWriteValue64", cr);
}

static int fence_op(gpuipc_fence_t *f, void *cu_stream, uint64_t value, bool wait)
{
        int r;

        if (!f)
                return GPUIPC_E_INVALID;
        /* Its creator is gone, so nobody will signal it again: a wait queued now would hold the
         * caller's stream forever, so the call fails instead. */
        if (f->buf->revoked) {
                client_errmsg(f->conn, "the fence '%s' was revoked: its creator died", f->buf->name);
                return GPUIPC_E_REVOKED;
        }
        if (!wait && f->event && !f->buf->own) {
                client_errmsg(f->conn, "only the creator of the IPC-event fence '%s' signals it", f->buf->name);
                return -EACCES;
        }
        if (!wait && !f->buf->own && !f->buf->writable) {
                client_errmsg(f->conn, "the fence '%s' was published read-only: only its creator signals it",
                              f->buf->name);
                return -EACCES;
        }
        /* The fence's device context for the enqueue, popped whatever it returned: the caller's
         * thread keeps the context it had. */
        r = cuda_ctx_push(f->conn, f->ordinal);
        if (r < 0)
                return r;
        return cuda_ctx_pop(f->conn, fence_enqueue(f, (GcuStream)cu_stream, value, wait));
}

_public_ int gpuipc_fence_signal(gpuipc_fence_t *f, void *cu_stream, uint64_t value)
{
        CLIENT_LOCKED(f ? f->conn : NULL);
        return fence_op(f, cu_stream, value, false);
}

_public_ int gpuipc_fence_wait(gpuipc_fence_t *f, void *cu_stream, uint64_t value)
{
        CLIENT_LOCKED(f ? f->conn : NULL);
        return fence_op(f, cu_stream, value, true);
}

/* Reads the counter through a stream of its own that does not wait for the legacy default
 * stream, so a read never hangs behind a wait that is still pending there. */
static int fence_read(gpuipc_fence_t *f, uint64_t *ret)
{
        gpuipc_t *c = f->conn;
        GcuResult cr;

        if (!f->reader) {
                cr = CU(cuStreamCreate, &f->reader, GCU_STREAM_NON_BLOCKING);
                if (cr != GCU_SUCCESS) {
                        f->reader = NULL;
                        return cuda_error(c, "cuStreamCreate", cr);
                }
        }
        cr = CU(cuMemcpyDtoHAsync, ret, f->counter, sizeof(*ret), f->reader);
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuMemcpyDtoHAsync", cr);
        cr = CU(cuStreamSynchronize, f->reader);
        return cr == GCU_SUCCESS ? 0 : cuda_error(c, "cuStreamSynchronize", cr);
}

_public_ int gpuipc_fence_value(gpuipc_fence_t *f, uint64_t *ret)
{
        CLIENT_LOCKED(f ? f->conn : NULL);
        uint64_t v = 0;
        int r;

        if (!f || !ret)
                return GPUIPC_E_INVALID;
        r = cuda_ctx_push(f->conn, f->ordinal);
        if (r < 0)
                return r;
        r = cuda_ctx_pop(f->conn, f->event ? fence_event_done(f, &v) : fence_read(f, &v));
        if (r < 0)
                return r;
        *ret = v;
        return 0;
}

_public_ void gpuipc_fence_close(gpuipc_fence_t *f)
{
        CLIENT_LOCKED(f ? f->conn : NULL);
        GcuResult cr;

        if (!f)
                return;
        if ((f->reader || f->event) && cuda_ctx_push(f->conn, f->ordinal) == 0) {
                cr = f->reader ? CU(cuStreamDestroy, f->reader) : GCU_SUCCESS;
                if (cr != GCU_SUCCESS)
                        cuda_error(f->conn, "cuStreamDestroy", cr);
                cr = f->event ? CU(cuEventDestroy, f->event) : GCU_SUCCESS;
                if (cr != GCU_SUCCESS)
                        cuda_error(f->conn, "cuEventDestroy", cr);
                cuda_ctx_pop(f->conn, 0);
        }
        buffer_drop(f->conn, f->buf);
        free(f);
}
