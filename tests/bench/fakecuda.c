/* A stand-in for libcuda.so.1 with host memory, so that the plumbing of `gpuipc-bench --gpu`
 * (processes, attach and release order, drains, rows) and of the CUDA kinds' tests can run on a
 * machine without a GPU:
 *
 *   GPUIPC_LIBCUDA=build/tests/bench/libgpuipc-bench-fakecuda.so gpuipc-bench --gpu --quick
 *
 * Its numbers mean nothing. "Device memory" is a memfd mapped at the same address on every fake
 * device; cuMemCreate memory exports that memfd, copies are memcpy; a stream is a worker thread
 * that runs its queue in order, so that work is as asynchronous as on a GPU. $FAKECUDA_DEVICES
 * sets the device count (default 2); $FAKECUDA_NO_VMM makes the devices say they lack virtual
 * memory management; $FAKECUDA_MEM_FREE is what cuMemGetInfo says is free. fakecuda_teardown()
 * makes it a driver whose state is gone (as at a process's exit).
 *
 * Legacy IPC behaves as the real driver's did between containers (each process in PID and mount
 * namespaces of its own), measured on an H100 with driver 580.159.04 and CUDA 13.0:
 * - A memory handle names its exporter's PID (as the exporter sees it) and the exporter's fd
 *   server: a thread, started by the process's first cuIpcGetMemHandle (and again in a forked
 *   child), that listens on an abstract Unix socket and hands an allocation's memfd to whoever
 *   asks (SCM_RIGHTS). Abstract sockets belong to the network namespace, so sibling PID and mount
 *   namespaces reach it, no /dev/shm is shared and no file is left anywhere. Opening a handle in
 *   the process that exported it is CUDA_ERROR_MAP_FAILED (205); in another process whose own PID
 *   equals the exporter's (both PID 1 of their containers) CUDA_ERROR_INVALID_CONTEXT (201), as
 *   the driver takes the handle for that process's own; once the exporter exited or freed the
 *   memory, CUDA_ERROR_INVALID_HANDLE (400). Different PIDs open it from any PID namespace (but,
 *   unlike the driver's, only within the exporter's network namespace: 400 from another one).
 * - An IPC event (CU_EVENT_INTERPROCESS) keeps its counters in a file of /dev/shm, made by
 *   cuEventCreate and removed by its creator's cuEventDestroy (or exit); its handle names the
 *   creator's PID and its /dev/shm (device and inode). Opening it needs the same /dev/shm: with
 *   another one (a private tmpfs per container) it is CUDA_ERROR_MAP_FAILED (205); equal PIDs are
 *   201 as for memory. Records, queries, synchronizes and stream waits then work across processes.
 * Only what libgpuipc and gpuipc-bench call is here; everything else is absent. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#pragma GCC diagnostic ignored "-Wmissing-prototypes"

#define API               __attribute__((visibility("default")))
#define OK                0
#define E_INVALID_VALUE   1
#define E_OUT_OF_MEMORY   2
#define E_NOT_SUPPORTED   801
#define E_INVALID_HANDLE  400
#define E_INVALID_CONTEXT 201
#define E_MAP_FAILED      205
#define E_NOT_READY       600
#define E_UNKNOWN         999
#define EVENT_DISABLE_TIMING 0x2
#define EVENT_INTERPROCESS   0x4
#define CTX_BASE          0x1000

typedef unsigned int Res;
typedef unsigned long long DevPtr;

typedef struct Alloc {
        bool used;
        DevPtr base;
        size_t size;
        int fd;          /* cuMemAlloc: the memfd (for legacy handles); -1 for opened handles */
        bool opened;     /* cuIpcOpenMemHandle */
        uint64_t serial; /* tells this allocation from a later one in the same slot */
} Alloc;

typedef struct Handle {
        bool used;
        int fd;
        size_t size;
} Handle;

/* CUipcMemHandle and CUipcEventHandle as passed: 64 opaque bytes, laid out below. */
typedef struct Raw64 {
        char bytes[64];
} Raw64;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Alloc allocs[1024];
static uint64_t alloc_serial; /* under lock */
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
                        allocs[i] = (Alloc){true, base, size, fd, opened, ++alloc_serial};
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
        return n_devices() > 0 ? OK : 100; /* CUDA_ERROR_NO_DEVICE */
}

API Res cuDriverGetVersion(int *v)
{
        *v = 12080;
        return OK;
}

/* The codes this stand-in returns, named and described as the driver does, so that a test's log
 * reads as it would on a GPU. */
static const struct {
        Res code;
        const char *name, *text;
} errors[] = {
        { OK, "CUDA_SUCCESS", "no error" },
        { E_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
        { E_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
        { 100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
        { 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
        { E_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
        { E_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed" },
        { E_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
        { E_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
        { E_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
        { E_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

API Res cuGetErrorName(Res r, const char **s)
{
        for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++) {
                if (errors[i].code == r) {
                        *s = errors[i].name;
                        return OK;
                }
        }
        *s = NULL;
        return E_INVALID_VALUE; /* as the driver, for a code it does not know */
}

API Res cuGetErrorString(Res r, const char **s)
{
        for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++) {
                if (errors[i].code == r) {
                        *s = errors[i].text;
                        return OK;
                }
        }
        *s = NULL;
        return E_INVALID_VALUE;
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
        if (r != OK) {
                munmap(m, size);
                close(fd);
                return r;
        }
        *p = (DevPtr)(uintptr_t)m;
        return OK;
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

/* A legacy memory handle: 64 bytes. */
#define MEM_MAGIC "fcudamem"
typedef struct MemIpcHandle {
        char magic[8];   /* MEM_MAGIC, without a NUL */
        int32_t pid;     /* the exporter's getpid(), in its own PID namespace */
        uint32_t slot;   /* the allocation's index in the exporter's allocs[] */
        uint64_t server; /* the exporter's fd server: abstract socket "fakecuda-<server, 16 hex digits>" */
        uint64_t serial; /* the allocation's serial: its slot reused by another one does not match */
        uint64_t size;   /* bytes */
        char pad[24];    /* zero */
} MemIpcHandle;
_Static_assert(sizeof(MemIpcHandle) == sizeof(Raw64), "a CUipcMemHandle is 64 bytes");

/* What an opener asks the exporter's server for; the answer is one status byte (0: here it is)
 * with the memfd attached. */
typedef struct FdRequest {
        uint64_t serial;
        uint32_t slot, pad;
} FdRequest;

/* The process's fd server, under server_lock. A forked child inherits the parent's socket but not
 * its thread: the atfork handlers close the socket there, so that the name dies with the parent
 * and the child starts a server of its own. */
static pthread_mutex_t server_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t server_pid; /* getpid() of the process whose server runs; 0: none */
static uint64_t server_token;
static int server_fd = -1;

static socklen_t server_addr(struct sockaddr_un *a, uint64_t token)
{
        int n;

        memset(a, 0, sizeof(*a));
        a->sun_family = AF_UNIX; /* sun_path[0] stays 0: an abstract name */
        n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "fakecuda-%016llx", (unsigned long long)token);
        return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Neither side waits for ever on a peer that stopped (a frozen exporter, a client that never asks). */
static void socket_timeouts(int fd)
{
        struct timeval tv = { 10, 0 };

        (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* The fd of allocation slot/serial, duplicated (the owner may free it meanwhile), or -1. */
static int alloc_fd(uint32_t slot, uint64_t serial)
{
        int fd = -1;

        if (slot >= sizeof(allocs) / sizeof(allocs[0]))
                return -1;
        pthread_mutex_lock(&lock);
        if (allocs[slot].used && !allocs[slot].opened && allocs[slot].fd >= 0 && allocs[slot].serial == serial)
                fd = fcntl(allocs[slot].fd, F_DUPFD_CLOEXEC, 3);
        pthread_mutex_unlock(&lock);
        return fd;
}

static void serve_one(int conn)
{
        union {
                struct cmsghdr h;
                char bytes[CMSG_SPACE(sizeof(int))];
        } cm;
        char status = 1;
        struct iovec iov = { &status, 1 };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        FdRequest q;
        int fd = -1;

        socket_timeouts(conn);
        if (recv(conn, &q, sizeof(q), MSG_WAITALL) == (ssize_t)sizeof(q))
                fd = alloc_fd(q.slot, q.serial);
        if (fd >= 0) {
                struct cmsghdr *c;

                status = 0;
                memset(&cm, 0, sizeof(cm));
                msg.msg_control = cm.bytes;
                msg.msg_controllen = sizeof(cm.bytes);
                c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(c), &fd, sizeof(int));
        }
        (void)sendmsg(conn, &msg, MSG_NOSIGNAL);
        if (fd >= 0)
                close(fd);
}

/* Set by the server thread once it runs its own code (see server_start). */
static int server_running;

/* Detached, with every signal blocked: it neither keeps the process alive nor takes its signals. */
static void *server_main(void *arg)
{
        int lfd = (int)(intptr_t)arg;

        __atomic_store_n(&server_running, 1, __ATOMIC_SEQ_CST);
        for (;;) {
                int conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

                if (conn >= 0) {
                        serve_one(conn);
                        close(conn);
                } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                        usleep(1000);
                } else if (errno != EINTR && errno != ECONNABORTED) {
                        break;
                }
        }
        return NULL;
}

static void fork_prepare(void)
{
        pthread_mutex_lock(&server_lock);
}

static void fork_parent(void)
{
        pthread_mutex_unlock(&server_lock);
}

static void events_disown(void);

static void fork_child(void)
{
        if (server_fd >= 0)
                close(server_fd);
        server_fd = -1;
        server_pid = 0;
        server_running = 0; /* the thread stayed in the parent */
        pthread_mutex_unlock(&server_lock);
        events_disown();
}

static void events_remove_own(void);

__attribute__((constructor)) static void fakecuda_init(void)
{
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        atexit(events_remove_own);
}

static Res server_start(void)
{
        struct sockaddr_un a;
        pthread_attr_t attr;
        sigset_t all, old;
        uint64_t token;
        pthread_t t;
        int fd, e;

        if (getrandom(&token, sizeof(token), 0) != (ssize_t)sizeof(token))
                return E_UNKNOWN;
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return E_UNKNOWN;
        if (bind(fd, (struct sockaddr *)&a, server_addr(&a, token)) < 0 || listen(fd, 64) < 0) {
                close(fd);
                return E_UNKNOWN;
        }
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        e = pthread_create(&t, &attr, server_main, (void *)(intptr_t)fd);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        if (e != 0) {
                close(fd);
                return E_UNKNOWN;
        }
        /* Back only once the thread runs: a new thread's start-up under AddressSanitizer takes the
         * allocator's locks, and a process that forks meanwhile (the tests make containers right
         * after their first handle) hands its child a lock that no thread of the child will ever
         * release: the child's next malloc hung (seen in 1 of 10-20 runs of fakecuda-ipc). */
        while (!__atomic_load_n(&server_running, __ATOMIC_SEQ_CST))
                usleep(50);
        server_fd = fd;
        server_token = token;
        server_pid = getpid();
        return OK;
}

/* This process's server token, starting the server where none runs yet. */
static Res server_ensure(uint64_t *token)
{
        Res r = OK;

        pthread_mutex_lock(&server_lock);
        if (server_pid != getpid())
                r = server_start();
        *token = server_token;
        pthread_mutex_unlock(&server_lock);
        return r;
}

static bool server_is_ours(uint64_t token)
{
        bool ours;

        pthread_mutex_lock(&server_lock);
        ours = server_pid == getpid() && server_token == token;
        pthread_mutex_unlock(&server_lock);
        return ours;
}

/* Asks the exporter's server for the handle's memfd: the fd, or -1 when the exporter is gone (no
 * such socket) or no longer has the allocation. */
static int fetch_fd(const MemIpcHandle *h)
{
        union {
                struct cmsghdr h;
                char bytes[CMSG_SPACE(sizeof(int))];
        } cm;
        char status = 1;
        struct iovec iov = { &status, 1 };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.bytes,
                              .msg_controllen = sizeof(cm.bytes) };
        FdRequest q = { h->serial, h->slot, 0 };
        struct sockaddr_un a;
        int s, fd = -1;

        s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0)
                return -1;
        socket_timeouts(s);
        if (connect(s, (struct sockaddr *)&a, server_addr(&a, h->server)) == 0 &&
            send(s, &q, sizeof(q), MSG_NOSIGNAL) == (ssize_t)sizeof(q) && recvmsg(s, &msg, MSG_CMSG_CLOEXEC) == 1) {
                struct cmsghdr *c = CMSG_FIRSTHDR(&msg);

                if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
                    c->cmsg_len == CMSG_LEN(sizeof(int)))
                        memcpy(&fd, CMSG_DATA(c), sizeof(int));
                if (status != 0 && fd >= 0) {
                        close(fd);
                        fd = -1;
                }
        }
        close(s);
        return fd;
}

API Res cuIpcGetMemHandle(Raw64 *out, DevPtr p)
{
        MemIpcHandle h = { .pid = (int32_t)getpid() };
        bool found;
        Alloc *a;
        Res r;

        pthread_mutex_lock(&lock);
        a = alloc_find(p);
        found = a && !a->opened;
        if (found) {
                h.slot = (uint32_t)(a - allocs);
                h.serial = a->serial;
                h.size = a->size;
        }
        pthread_mutex_unlock(&lock);
        if (!found)
                return E_INVALID_VALUE;
        r = server_ensure(&h.server);
        if (r != OK)
                return r;
        memcpy(h.magic, MEM_MAGIC, sizeof(h.magic));
        memcpy(out, &h, sizeof(h));
        return OK;
}

API Res cuIpcOpenMemHandle_v2(DevPtr *p, Raw64 raw, unsigned flags)
{
        MemIpcHandle h;
        struct stat st;
        void *m;
        int fd;
        Res r;

        (void)flags;
        memcpy(&h, &raw, sizeof(h));
        if (memcmp(h.magic, MEM_MAGIC, sizeof(h.magic)) != 0 || !h.size)
                return E_INVALID_VALUE;
        if (server_is_ours(h.server))
                return E_MAP_FAILED; /* as the driver: not in the exporting process */
        if (h.pid == (int32_t)getpid())
                return E_INVALID_CONTEXT; /* as the driver: another container's process of our PID */
        fd = fetch_fd(&h);
        if (fd < 0)
                return E_INVALID_HANDLE;
        if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < h.size) {
                close(fd);
                return E_INVALID_HANDLE;
        }
        m = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
                return E_OUT_OF_MEMORY;
        pthread_mutex_lock(&lock);
        r = alloc_add((DevPtr)(uintptr_t)m, h.size, -1, true);
        pthread_mutex_unlock(&lock);
        if (r != OK) {
                munmap(m, h.size);
                return r;
        }
        *p = (DevPtr)(uintptr_t)m;
        return OK;
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

typedef struct EventCounters {
        uint64_t recorded, reached; /* records queued / run: the event is complete when they agree */
} EventCounters;

/* An IPC event's handle: 64 bytes. */
#define EVENT_MAGIC "fcudaevt"
typedef struct EventIpcHandle {
        char magic[8];    /* EVENT_MAGIC, without a NUL */
        int32_t pid;      /* the creator's getpid(), in its own PID namespace */
        uint32_t zero;
        uint64_t token;   /* the counters' file: /dev/shm/fakecuda-ev-<token, 16 hex digits> */
        uint64_t shm_dev; /* stat("/dev/shm") in the creator: st_dev, */
        uint64_t shm_ino; /* and st_ino */
        char pad[24];     /* zero */
} EventIpcHandle;
_Static_assert(sizeof(EventIpcHandle) == sizeof(Raw64), "a CUipcEventHandle is 64 bytes");

typedef struct Event {
        EventCounters *c;      /* &own, or the mapping of an IPC event's file */
        EventCounters own;
        bool ipc, creator;     /* an IPC event, created here (not opened) */
        EventIpcHandle handle; /* an IPC event's */
        struct Event *next;    /* in own_events: IPC events created by this process */
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
                __atomic_add_fetch(&o->event->c->reached, 1, __ATOMIC_SEQ_CST);
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

/* $FAKECUDA_MEM_FREE bytes free (default 64 GiB) of twice as many: what a test of a load too large
 * for the device sets. */
API Res cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
        const char *e = getenv("FAKECUDA_MEM_FREE");
        size_t v = e && *e ? (size_t)strtoull(e, NULL, 0) : (size_t)64 << 30;

        *free_bytes = v;
        *total = 2 * v;
        return OK;
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

static Event *own_events; /* under lock */

static void event_path(char *buf, size_t n, uint64_t token)
{
        snprintf(buf, n, "/dev/shm/fakecuda-ev-%016llx", (unsigned long long)token);
}

/* An IPC event's counters move to a new file of /dev/shm, which its handle names. */
static Res event_share(Event *ev)
{
        struct stat st;
        char path[64];
        uint64_t token;
        void *m;
        int fd;

        if (stat("/dev/shm", &st) < 0 || getrandom(&token, sizeof(token), 0) != (ssize_t)sizeof(token))
                return E_UNKNOWN;
        event_path(path, sizeof(path), token);
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
                return E_OUT_OF_MEMORY;
        m = ftruncate(fd, sizeof(EventCounters)) == 0
                    ? mmap(NULL, sizeof(EventCounters), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
        close(fd);
        if (m == MAP_FAILED) {
                unlink(path);
                return E_OUT_OF_MEMORY;
        }
        ev->c = m;
        ev->ipc = ev->creator = true;
        ev->handle = (EventIpcHandle){ .pid = (int32_t)getpid(), .token = token, .shm_dev = (uint64_t)st.st_dev,
                                       .shm_ino = (uint64_t)st.st_ino };
        memcpy(ev->handle.magic, EVENT_MAGIC, sizeof(ev->handle.magic));
        pthread_mutex_lock(&lock);
        ev->next = own_events;
        own_events = ev;
        pthread_mutex_unlock(&lock);
        return OK;
}

/* At exit: the files of the IPC events this process created and never destroyed. */
static void events_remove_own(void)
{
        char path[64];

        for (Event *ev = own_events; ev; ev = ev->next) {
                event_path(path, sizeof(path), ev->handle.token);
                unlink(path);
        }
}

/* In a forked child (one thread, no locking): the parent's events stay the parent's to remove. */
static void events_disown(void)
{
        for (Event *ev = own_events; ev; ev = ev->next)
                ev->creator = false;
        own_events = NULL;
}

static bool event_is_own(uint64_t token)
{
        bool own = false;

        pthread_mutex_lock(&lock);
        for (Event *ev = own_events; ev && !own; ev = ev->next)
                own = ev->handle.token == token;
        pthread_mutex_unlock(&lock);
        return own;
}

API Res cuEventCreate(void **e, unsigned flags)
{
        Event *ev;
        Res r;

        if ((flags & EVENT_INTERPROCESS) && !(flags & EVENT_DISABLE_TIMING))
                return E_INVALID_VALUE; /* as the driver: IPC events take no timings */
        ev = calloc(1, sizeof(*ev));
        if (!ev)
                return E_OUT_OF_MEMORY;
        ev->c = &ev->own;
        if (flags & EVENT_INTERPROCESS) {
                r = event_share(ev);
                if (r != OK) {
                        free(ev);
                        return r;
                }
        }
        *e = ev;
        return OK;
}

/* An IPC event's creator removes its file; an opener only unmaps it. */
API Res cuEventDestroy_v2(void *e)
{
        Event *ev = e;
        char path[64];

        if (!ev)
                return E_INVALID_HANDLE;
        if (ev->ipc && ev->creator) {
                pthread_mutex_lock(&lock);
                for (Event **p = &own_events; *p; p = &(*p)->next) {
                        if (*p == ev) {
                                *p = ev->next;
                                break;
                        }
                }
                pthread_mutex_unlock(&lock);
                event_path(path, sizeof(path), ev->handle.token);
                unlink(path);
        }
        if (ev->ipc)
                munmap(ev->c, sizeof(*ev->c));
        free(ev);
        return OK;
}

API Res cuIpcGetEventHandle(Raw64 *out, void *e)
{
        Event *ev = e;

        if (!ev)
                return E_INVALID_HANDLE;
        if (!ev->ipc)
                return E_INVALID_VALUE; /* as the driver: created without CU_EVENT_INTERPROCESS */
        memcpy(out, &ev->handle, sizeof(ev->handle));
        return OK;
}

API Res cuIpcOpenEventHandle(void **e, Raw64 raw)
{
        EventIpcHandle h;
        char path[64];
        struct stat st;
        Event *ev;
        void *m;
        int fd;

        memcpy(&h, &raw, sizeof(h));
        if (memcmp(h.magic, EVENT_MAGIC, sizeof(h.magic)) != 0)
                return E_INVALID_VALUE;
        if (h.pid == (int32_t)getpid() && !event_is_own(h.token))
                return E_INVALID_CONTEXT; /* as the driver: another container's process of our PID */
        if (stat("/dev/shm", &st) < 0 || (uint64_t)st.st_dev != h.shm_dev || (uint64_t)st.st_ino != h.shm_ino)
                return E_MAP_FAILED; /* as the driver: "mapping of buffer object failed" */
        event_path(path, sizeof(path), h.token);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return E_INVALID_HANDLE; /* destroyed by its creator */
        m = fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(EventCounters)
                    ? mmap(NULL, sizeof(EventCounters), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
        close(fd);
        if (m == MAP_FAILED)
                return E_INVALID_HANDLE;
        ev = calloc(1, sizeof(*ev));
        if (!ev) {
                munmap(m, sizeof(EventCounters));
                return E_OUT_OF_MEMORY;
        }
        ev->c = m;
        ev->ipc = true;
        ev->handle = h;
        *e = ev;
        return OK;
}

API Res cuEventRecord(void *e, void *s)
{
        Event *ev = e;

        if (!ev)
                return E_INVALID_HANDLE;
        __atomic_add_fetch(&ev->c->recorded, 1, __ATOMIC_SEQ_CST);
        return enqueue(s, (Op){ .kind = OP_EVENT, .event = ev });
}

/* The stream waits for the event's records queued so far (in any process, for an IPC event). */
API Res cuStreamWaitEvent(void *s, void *e, unsigned flags)
{
        Event *ev = e;

        (void)flags;
        if (!ev)
                return E_INVALID_HANDLE;
        return enqueue(s, (Op){ .kind = OP_WAIT, .dst = &ev->c->reached,
                                .value = __atomic_load_n(&ev->c->recorded, __ATOMIC_SEQ_CST) });
}

API Res cuEventQuery(void *e)
{
        Event *ev = e;

        if (!ev)
                return E_INVALID_HANDLE;
        return __atomic_load_n(&ev->c->reached, __ATOMIC_SEQ_CST) ==
                               __atomic_load_n(&ev->c->recorded, __ATOMIC_SEQ_CST)
                       ? OK
                       : E_NOT_READY;
}

API Res cuEventSynchronize(void *e)
{
        Res r;

        while ((r = cuEventQuery(e)) == E_NOT_READY)
                usleep(10);
        return r;
}
