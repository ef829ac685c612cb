/* A stand-in for libcuda.so.1 with host memory, so that the plumbing of `gpuipc-bench --gpu`
 * (processes, attach and release order, drains, rows) can run on a machine without a GPU:
 *
 *   GPUIPC_LIBCUDA=build/tests/bench/libgpuipc-bench-fakecuda.so gpuipc-bench --gpu --quick
 *
 * Its numbers mean nothing. "Device memory" is a memfd mapped at the same address on every fake
 * device; cuMemCreate memory exports that memfd, a legacy handle names the producer's pid and fd
 * (opened through /proc), copies are memcpy; a stream is a worker thread that runs its queue in
 * order, so that work is as asynchronous as on a GPU. $FAKECUDA_DEVICES sets the device count (default 2);
 * $FAKECUDA_NO_VMM makes the devices say they lack virtual memory management. fakecuda_teardown()
 * makes it a driver whose state is gone (as at a process's exit).
 * Only what libgpuipc and gpuipc-bench call is here; everything else is absent. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#pragma GCC diagnostic ignored "-Wmissing-prototypes"

#define API               __attribute__((visibility("default")))
#define OK                0
#define E_INVALID_VALUE   1
#define E_OUT_OF_MEMORY   2
#define E_NOT_SUPPORTED   801
#define E_INVALID_HANDLE  400
#define E_INVALID_CONTEXT 201
#define CTX_BASE          0x1000

typedef unsigned int Res;
typedef unsigned long long DevPtr;

typedef struct Alloc {
        bool used;
        DevPtr base;
        size_t size;
        int fd;      /* cuMemAlloc: the memfd (for legacy handles); -1 for opened handles */
        bool opened; /* cuIpcOpenMemHandle */
} Alloc;

typedef struct Handle {
        bool used;
        int fd;
        size_t size;
} Handle;

typedef struct IpcHandle {
        char magic[8];
        int32_t pid, fd;
        uint64_t size;
        char pad[40];
} IpcHandle;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Alloc allocs[1024];
static Handle handles[1024];
static __thread uintptr_t ctx_stack[16];
static __thread int ctx_depth;

static int n_devices(void)
{
        const char *e = getenv("FAKECUDA_DEVICES");
        return e && *e ? atoi(e) : 2;
}

static int memfd(size_t size)
{
        int fd = memfd_create("fakecuda", MFD_CLOEXEC);

        if (fd >= 0 && ftruncate(fd, (off_t)size) < 0) {
                close(fd);
                return -1;
        }
        return fd;
}

static Alloc *alloc_find(DevPtr p)
{
        for (size_t i = 0; i < sizeof(allocs) / sizeof(allocs[0]); i++) {
                if (allocs[i].used && p >= allocs[i].base && p < allocs[i].base + allocs[i].size)
                        return &allocs[i];
        }
        return NULL;
}

static Res alloc_add(DevPtr base, size_t size, int fd, bool opened)
{
        for (size_t i = 0; i < sizeof(allocs) / sizeof(allocs[0]); i++) {
                if (!allocs[i].used) {
                        allocs[i] = (Alloc){true, base, size, fd, opened};
                        return OK;
                }
        }
        return E_OUT_OF_MEMORY;
}

/* ---- driver, devices, contexts ---- */

static volatile int torn_down;

/* What a driver whose contexts and mappings are gone looks like to a caller: from now on every call
 * that needs a context or frees memory raises SIGBUS, as a call into such a driver can. Tests call
 * it (at exit) to see that nothing calls CUDA once it may be gone. */
API void fakecuda_teardown(void)
{
        torn_down = 1;
}

static void require_driver(void)
{
        if (torn_down)
                raise(SIGBUS);
}

API Res cuInit(unsigned flags)
{
        (void)flags;
        return n_devices() > 0 ? OK : 100;
}

API Res cuDriverGetVersion(int *v)
{
        *v = 12080;
        return OK;
}

API Res cuGetErrorName(Res r, const char **s)
{
        *s = r == OK ? "CUDA_SUCCESS" : "CUDA_ERROR_FAKE";
        return OK;
}

API Res cuGetErrorString(Res r, const char **s)
{
        *s = r == OK ? "no error" : "an error of the fake driver";
        return OK;
}

API Res cuDeviceGetCount(int *n)
{
        *n = n_devices();
        return OK;
}

API Res cuDeviceGet(int *dev, int ordinal)
{
        if (ordinal < 0 || ordinal >= n_devices())
                return 101;
        *dev = ordinal;
        return OK;
}

API Res cuDeviceGetName(char *name, int len, int dev)
{
        snprintf(name, (size_t)len, "Fake GPU %d (gpuipc-bench fakecuda)", dev);
        return OK;
}

static Res uuid(char *bytes, int dev)
{
        memset(bytes, 0, 16);
        bytes[0] = (char)0xfa;
        bytes[1] = (char)0xce;
        bytes[15] = (char)dev;
        return OK;
}

API Res cuDeviceGetUuid(char *bytes, int dev)
{
        return uuid(bytes, dev);
}

API Res cuDeviceGetUuid_v2(char *bytes, int dev)
{
        return uuid(bytes, dev);
}

API Res cuDeviceGetAttribute(int *v, unsigned attr, int dev)
{
        (void)dev;
        *v = attr == 20 ? 0 : 1; /* compute mode default; every capability present, */
        if (attr == 102 && getenv("FAKECUDA_NO_VMM"))
                *v = 0; /* ... but virtual memory management where the test asks */
        return OK;
}

API Res cuDeviceGetPCIBusId(char *id, int len, int dev)
{
        snprintf(id, (size_t)len, "0000:%02x:00.0", dev + 1);
        return OK;
}

API Res cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
        *ctx = (void *)(uintptr_t)(CTX_BASE + dev);
        return OK;
}

API Res cuCtxPushCurrent_v2(void *ctx)
{
        require_driver();
        if (ctx_depth == 16)
                return E_INVALID_CONTEXT;
        ctx_stack[ctx_depth++] = (uintptr_t)ctx;
        return OK;
}

API Res cuCtxPopCurrent_v2(void **ctx)
{
        require_driver();
        if (!ctx_depth)
                return E_INVALID_CONTEXT;
        ctx_depth--;
        if (ctx)
                *ctx = (void *)ctx_stack[ctx_depth];
        return OK;
}

static Res streams_synchronize(void);

/* As on a GPU: waits for every stream's work (streams here are the process's, not the context's). */
API Res cuCtxSynchronize(void)
{
        require_driver();
        return ctx_depth ? streams_synchronize() : E_INVALID_CONTEXT;
}

API Res cuCtxGetDevice(int *dev)
{
        if (!ctx_depth)
                return E_INVALID_CONTEXT;
        *dev = (int)(ctx_stack[ctx_depth - 1] - CTX_BASE);
        return OK;
}

API Res cuPointerGetAttribute(void *data, unsigned attr, DevPtr p)
{
        Alloc *a;

        pthread_mutex_lock(&lock);
        a = alloc_find(p);
        pthread_mutex_unlock(&lock);
        if (!a)
                return E_INVALID_VALUE;
        if (attr == 2)
                *(unsigned *)data = 2; /* device memory */
        else if (attr == 9)
                *(int *)data = 0;
        else if (attr == 10)
                *(int *)data = !a->opened;
        else
                return E_NOT_SUPPORTED;
        return OK;
}

/* ---- cuMemAlloc memory and legacy handles ---- */

API Res cuMemAlloc_v2(DevPtr *p, size_t size)
{
        int fd = memfd(size);
        void *m;
        Res r;

        if (fd < 0)
                return E_OUT_OF_MEMORY;
        m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
                close(fd);
                return E_OUT_OF_MEMORY;
        }
        pthread_mutex_lock(&lock);
        r = alloc_add((DevPtr)(uintptr_t)m, size, fd, false);
        pthread_mutex_unlock(&lock);
        *p = (DevPtr)(uintptr_t)m;
        return r;
}

static Res unmap_alloc(DevPtr p, bool opened)
{
        Alloc *a;

        pthread_mutex_lock(&lock);
        a = alloc_find(p);
        if (!a || a->base != p || a->opened != opened) {
                pthread_mutex_unlock(&lock);
                return E_INVALID_VALUE;
        }
        munmap((void *)(uintptr_t)a->base, a->size);
        if (a->fd >= 0)
                close(a->fd);
        a->used = false;
        pthread_mutex_unlock(&lock);
        return OK;
}

API Res cuMemFree_v2(DevPtr p)
{
        return unmap_alloc(p, false);
}

API Res cuMemGetAddressRange_v2(DevPtr *base, size_t *size, DevPtr p)
{
        Alloc *a;

        pthread_mutex_lock(&lock);
        a = alloc_find(p);
        if (a) {
                *base = a->base;
                *size = a->size;
        }
        pthread_mutex_unlock(&lock);
        return a ? OK : E_INVALID_VALUE;
}

API Res cuIpcGetMemHandle(IpcHandle *h, DevPtr p)
{
        Alloc *a;

        pthread_mutex_lock(&lock);
        a = alloc_find(p);
        if (a && !a->opened)
                *h = (IpcHandle){"fakecud", (int32_t)getpid(), a->fd, a->size, {0}};
        pthread_mutex_unlock(&lock);
        return a && !a->opened ? OK : E_INVALID_VALUE;
}

API Res cuIpcOpenMemHandle_v2(DevPtr *p, IpcHandle h, unsigned flags)
{
        char path[64];
        void *m;
        int fd;
        Res r;

        (void)flags;
        if (memcmp(h.magic, "fakecud", 8) != 0)
                return E_INVALID_VALUE;
        if (h.pid == (int32_t)getpid())
                return 205; /* as the real driver: not in the exporting process */
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return E_INVALID_HANDLE;
        m = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
                return E_OUT_OF_MEMORY;
        pthread_mutex_lock(&lock);
        r = alloc_add((DevPtr)(uintptr_t)m, h.size, -1, true);
        pthread_mutex_unlock(&lock);
        *p = (DevPtr)(uintptr_t)m;
        return r;
}

API Res cuIpcCloseMemHandle(DevPtr p)
{
        return unmap_alloc(p, true);
}

/* ---- virtual memory management ---- */

API Res cuMemGetAllocationGranularity(size_t *g, const void *prop, unsigned option)
{
        (void)prop;
        (void)option;
        *g = 2u << 20;
        return OK;
}

static Res handle_add(int fd, size_t size, unsigned long long *ret)
{
        pthread_mutex_lock(&lock);
        for (size_t i = 0; i < sizeof(handles) / sizeof(handles[0]); i++) {
                if (!handles[i].used) {
                        handles[i] = (Handle){true, fd, size};
                        *ret = i + 1;
                        pthread_mutex_unlock(&lock);
                        return OK;
                }
        }
        pthread_mutex_unlock(&lock);
        return E_OUT_OF_MEMORY;
}

static Handle *handle_get(unsigned long long h)
{
        return h >= 1 && h <= sizeof(handles) / sizeof(handles[0]) && handles[h - 1].used ? &handles[h - 1]
                                                                                          : NULL;
}

API Res cuMemCreate(unsigned long long *h, size_t size, const void *prop, unsigned long long flags)
{
        int fd = memfd(size);

        (void)prop;
        (void)flags;
        if (fd < 0)
                return E_OUT_OF_MEMORY;
        return handle_add(fd, size, h);
}

API Res cuMemRelease(unsigned long long h)
{
        Handle *x;

        require_driver();
        x = handle_get(h);
        if (!x)
                return E_INVALID_HANDLE;
        close(x->fd);
        x->used = false;
        return OK;
}

API Res cuMemAddressReserve(DevPtr *p, size_t size, size_t align, DevPtr addr, unsigned long long flags)
{
        void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

        (void)align;
        (void)addr;
        (void)flags;
        if (m == MAP_FAILED)
                return E_OUT_OF_MEMORY;
        *p = (DevPtr)(uintptr_t)m;
        return OK;
}

API Res cuMemAddressFree(DevPtr p, size_t size)
{
        require_driver();
        return munmap((void *)(uintptr_t)p, size) == 0 ? OK : E_INVALID_VALUE;
}

API Res cuMemMap(DevPtr p, size_t size, size_t offset, unsigned long long h, unsigned long long flags)
{
        Handle *x = handle_get(h);

        (void)flags;
        if (!x || offset + size > x->size)
                return E_INVALID_VALUE;
        if (mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, x->fd, (off_t)offset) ==
            MAP_FAILED)
                return E_OUT_OF_MEMORY;
        return OK;
}

API Res cuMemUnmap(DevPtr p, size_t size)
{
        void *m;

        require_driver();
        m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
                 0);
        return m == MAP_FAILED ? E_INVALID_VALUE : OK;
}

typedef struct AccessDesc {
        int type, id, flags;
} AccessDesc;

API Res cuMemSetAccess(DevPtr p, size_t size, const AccessDesc *d, size_t count)
{
        (void)count;
        return mprotect((void *)(uintptr_t)p, size, d->flags == 1 ? PROT_READ : PROT_READ | PROT_WRITE) == 0
                       ? OK
                       : E_INVALID_VALUE;
}

API Res cuMemExportToShareableHandle(void *out, unsigned long long h, unsigned type,
                                     unsigned long long flags)
{
        Handle *x = handle_get(h);

        (void)flags;
        if (!x || type != 1)
                return E_INVALID_VALUE;
        *(int *)out = fcntl(x->fd, F_DUPFD_CLOEXEC, 3);
        return *(int *)out >= 0 ? OK : E_OUT_OF_MEMORY;
}

API Res cuMemImportFromShareableHandle(unsigned long long *h, void *os_handle, unsigned type)
{
        int fd = (int)(uintptr_t)os_handle, copy;
        off_t size;

        if (type != 1 || (size = lseek(fd, 0, SEEK_END)) < 0)
                return E_INVALID_VALUE;
        copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (copy < 0)
                return E_OUT_OF_MEMORY;
        return handle_add(copy, (size_t)size, h);
}

API Res cuMemGetAllocationPropertiesFromHandle(void *prop, unsigned long long h)
{
        (void)prop;
        (void)h;
        return E_NOT_SUPPORTED;
}

/* ---- copies, streams ---- */

API Res cuMemcpyDtoH_v2(void *dst, DevPtr src, size_t n)
{
        memcpy(dst, (const void *)(uintptr_t)src, n);
        return OK;
}

API Res cuMemcpyHtoD_v2(DevPtr dst, const void *src, size_t n)
{
        memcpy((void *)(uintptr_t)dst, src, n);
        return OK;
}

API Res cuMemcpyDtoD_v2(DevPtr dst, DevPtr src, size_t n)
{
        memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
        return OK;
}

/* Streams run asynchronously, as a GPU's do: each created stream has a worker thread that runs its
 * queue in order (copies, memsets, value writes, waits on a value, event records), so that code which
 * forgets to order or synchronize its work fails here too. The NULL stream runs at once. */
typedef enum OpKind { OP_COPY, OP_SET32, OP_WRITE, OP_WAIT, OP_EVENT } OpKind;

typedef struct Event {
        uint64_t recorded, reached; /* records queued / run: the event is complete when they agree */
} Event;

typedef struct Op {
        struct Op *next;
        OpKind kind;
        void *dst;
        const void *src;
        size_t n;
        uint64_t value;
        Event *event;
} Op;

typedef struct Stream {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        Op *head, **tail;
        bool busy, stop;
        pthread_t worker;
        struct Stream *next; /* in streams */
} Stream;

static Stream *streams; /* every live stream, under lock */

static void op_run(const Op *o)
{
        switch (o->kind) {
        case OP_COPY:
                memcpy(o->dst, o->src, o->n);
                break;
        case OP_SET32:
                for (size_t i = 0; i < o->n; i++)
                        ((uint32_t *)o->dst)[i] = (uint32_t)o->value;
                break;
        case OP_WRITE:
                __atomic_store_n((uint64_t *)o->dst, o->value, __ATOMIC_SEQ_CST);
                break;
        case OP_WAIT: /* GEQ, as a 64-bit unsigned compare */
                while (__atomic_load_n((uint64_t *)o->dst, __ATOMIC_SEQ_CST) < o->value)
                        usleep(10);
                break;
        case OP_EVENT:
                __atomic_add_fetch(&o->event->reached, 1, __ATOMIC_SEQ_CST);
                break;
        }
}

static void *stream_main(void *arg)
{
        Stream *st = arg;

        pthread_mutex_lock(&st->lock);
        for (;;) {
                Op *o;

                while (!st->head && !st->stop)
                        pthread_cond_wait(&st->cond, &st->lock);
                if (!st->head)
                        break;
                o = st->head;
                st->busy = true;
                pthread_mutex_unlock(&st->lock);
                op_run(o);
                pthread_mutex_lock(&st->lock);
                st->head = o->next;
                if (!st->head)
                        st->tail = &st->head;
                st->busy = false;
                free(o);
                pthread_cond_broadcast(&st->cond);
        }
        pthread_mutex_unlock(&st->lock);
        return NULL;
}

static Res enqueue(void *stream, Op op)
{
        Stream *st = stream;
        Op *o;

        if (!st) {
                op_run(&op);
                return OK;
        }
        o = malloc(sizeof(*o));
        if (!o)
                return E_OUT_OF_MEMORY;
        *o = op;
        o->next = NULL;
        pthread_mutex_lock(&st->lock);
        *st->tail = o;
        st->tail = &o->next;
        pthread_cond_broadcast(&st->cond);
        pthread_mutex_unlock(&st->lock);
        return OK;
}

API Res cuMemcpyDtoHAsync_v2(void *dst, DevPtr src, size_t n, void *stream)
{
        return enqueue(stream, (Op){ .kind = OP_COPY, .dst = dst, .src = (const void *)(uintptr_t)src, .n = n });
}

API Res cuMemcpyHtoDAsync_v2(DevPtr dst, const void *src, size_t n, void *stream)
{
        return enqueue(stream, (Op){ .kind = OP_COPY, .dst = (void *)(uintptr_t)dst, .src = src, .n = n });
}

API Res cuMemcpyDtoDAsync_v2(DevPtr dst, DevPtr src, size_t n, void *stream)
{
        return enqueue(stream, (Op){ .kind = OP_COPY, .dst = (void *)(uintptr_t)dst,
                                     .src = (const void *)(uintptr_t)src, .n = n });
}

static unsigned long batch_calls;

/* How many cuMemcpyBatchAsync calls succeeded: tests check the library batches its copies. */
API unsigned long fakecuda_batch_calls(void)
{
        return __atomic_load_n(&batch_calls, __ATOMIC_RELAXED);
}

/* As the driver: the legacy default stream (NULL) is refused, every copy needs its attributes, and
 * none may be empty. The special handles (legacy 0x1, per-thread 0x2) run at once, as NULL does elsewhere here. */
API Res cuMemcpyBatchAsync_v2(DevPtr *dsts, DevPtr *srcs, size_t *sizes, size_t count, const int *attrs,
                              const size_t *attr_idxs, size_t num_attrs, void *stream)
{
        if (!stream || !count || !dsts || !srcs || !sizes || !attrs || !attr_idxs || num_attrs < 1 ||
            num_attrs > count || attr_idxs[0] != 0 || attrs[0] != 1 /* CU_MEMCPY_SRC_ACCESS_ORDER_STREAM */)
                return E_INVALID_VALUE;
        for (size_t i = 0; i < count; i++)
                if (!sizes[i])
                        return E_INVALID_VALUE;
        if ((uintptr_t)stream <= 2)
                stream = NULL;
        for (size_t i = 0; i < count; i++) {
                Res r = cuMemcpyDtoDAsync_v2(dsts[i], srcs[i], sizes[i], stream);

                if (r != OK)
                        return r;
        }
        __atomic_add_fetch(&batch_calls, 1, __ATOMIC_RELAXED);
        return OK;
}

API Res cuMemsetD32Async(DevPtr dst, unsigned v, size_t n, void *stream)
{
        return enqueue(stream, (Op){ .kind = OP_SET32, .dst = (void *)(uintptr_t)dst, .n = n, .value = v });
}

API Res cuMemsetD8_v2(DevPtr dst, unsigned char v, size_t n)
{
        memset((void *)(uintptr_t)dst, v, n);
        return OK;
}

API Res cuMemsetD32_v2(DevPtr dst, unsigned v, size_t n)
{
        return cuMemsetD32Async(dst, v, n, NULL);
}

API Res cuMemAllocHost_v2(void **p, size_t n)
{
        *p = malloc(n ? n : 1);
        return *p ? OK : E_OUT_OF_MEMORY;
}

API Res cuMemFreeHost(void *p)
{
        free(p);
        return OK;
}

API Res cuStreamCreate(void **s, unsigned flags)
{
        Stream *st = calloc(1, sizeof(*st));

        (void)flags;
        if (!st)
                return E_OUT_OF_MEMORY;
        pthread_mutex_init(&st->lock, NULL);
        pthread_cond_init(&st->cond, NULL);
        st->tail = &st->head;
        if (pthread_create(&st->worker, NULL, stream_main, st) != 0) {
                free(st);
                return E_OUT_OF_MEMORY;
        }
        pthread_mutex_lock(&lock);
        st->next = streams;
        streams = st;
        pthread_mutex_unlock(&lock);
        *s = st;
        return OK;
}

API Res cuStreamSynchronize(void *s)
{
        Stream *st = s;

        if (!st)
                return OK;
        pthread_mutex_lock(&st->lock);
        while (st->head)
                pthread_cond_wait(&st->cond, &st->lock);
        pthread_mutex_unlock(&st->lock);
        return OK;
}

static Res streams_synchronize(void)
{
        pthread_mutex_lock(&lock);
        for (Stream *st = streams; st; st = st->next)
                cuStreamSynchronize(st);
        pthread_mutex_unlock(&lock);
        return OK;
}

/* As CUDA does, a stream destroyed with work queued finishes that work first. */
API Res cuStreamDestroy_v2(void *s)
{
        Stream *st = s;

        if (!st)
                return E_INVALID_HANDLE;
        pthread_mutex_lock(&lock);
        for (Stream **p = &streams; *p; p = &(*p)->next) {
                if (*p == st) {
                        *p = st->next;
                        break;
                }
        }
        pthread_mutex_unlock(&lock);
        pthread_mutex_lock(&st->lock);
        st->stop = true;
        pthread_cond_broadcast(&st->cond);
        pthread_mutex_unlock(&st->lock);
        pthread_join(st->worker, NULL);
        pthread_cond_destroy(&st->cond);
        pthread_mutex_destroy(&st->lock);
        free(st);
        return OK;
}

API Res cuStreamGetCtx(void *s, void **ctx)
{
        (void)s;
        *ctx = ctx_depth ? (void *)ctx_stack[ctx_depth - 1] : (void *)(uintptr_t)CTX_BASE;
        return OK;
}

API Res cuStreamWriteValue64_v2(void *s, DevPtr addr, uint64_t v, unsigned flags)
{
        (void)flags;
        return enqueue(s, (Op){ .kind = OP_WRITE, .dst = (void *)(uintptr_t)addr, .value = v });
}

API Res cuStreamWaitValue64_v2(void *s, DevPtr addr, uint64_t v, unsigned flags)
{
        (void)flags;
        return enqueue(s, (Op){ .kind = OP_WAIT, .dst = (void *)(uintptr_t)addr, .value = v });
}

API Res cuEventCreate(void **e, unsigned flags)
{
        (void)flags;
        *e = calloc(1, sizeof(Event));
        return *e ? OK : E_OUT_OF_MEMORY;
}

API Res cuEventDestroy_v2(void *e)
{
        free(e);
        return OK;
}

API Res cuEventRecord(void *e, void *s)
{
        Event *ev = e;

        if (!ev)
                return E_INVALID_HANDLE;
        __atomic_add_fetch(&ev->recorded, 1, __ATOMIC_SEQ_CST);
        return enqueue(s, (Op){ .kind = OP_EVENT, .event = ev });
}

API Res cuEventQuery(void *e)
{
        Event *ev = e;

        return __atomic_load_n(&ev->reached, __ATOMIC_SEQ_CST) == __atomic_load_n(&ev->recorded, __ATOMIC_SEQ_CST)
                       ? OK
                       : 600; /* CUDA_ERROR_NOT_READY */
}

API Res cuEventSynchronize(void *e)
{
        while (cuEventQuery(e) != OK)
                usleep(10);
        return OK;
}
