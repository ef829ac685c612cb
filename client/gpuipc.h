/* libgpuipc: share GPU and host buffers zero-copy between processes (and containers) through a
 * gpuipc-broker.
 *
 *   producer                                   consumer
 *   gpuipc_connect(&c, NULL);                  gpuipc_connect(&c, NULL);
 *   gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD,  gpuipc_attach(c, "cam0", 5000, &b);
 *                       size, 0, &b);           ... read gpuipc_buffer_ptr(b) ...
 *   ... fill gpuipc_buffer_ptr(b) ...          gpuipc_release(c, b);
 *   gpuipc_publish(c, b, "cam0", NULL);
 *   gpuipc_retire(c, b);
 *   gpuipc_wait_drained(c, b, -1);  -> now the memory may be reused or freed
 *
 * Errors: every function that can fail returns 0 or a negative code: -errno for system errors,
 * GPUIPC_E_* for the rest. gpuipc_strerror() names the cause and the usual fix; gpuipc_errmsg()
 * adds what the broker said about this particular failure.
 *
 * Threads: a gpuipc_t and the buffers obtained through it must be used by one thread at a time
 * (serialize with your own lock, or open one connection per thread). Distinct connections are
 * independent. A connection with rings has threads of the library's (named gpuipc-ring and
 * gpuipc-ringfd); fork(2) waits until none of them is doing more than sleep, so a child forked
 * without exec inherits no lock of theirs. The child uses connections of its own, never the
 * parent's (not even to close them).
 *
 * Timeouts are in milliseconds: 0 means "do not wait", a negative value "wait as long as it takes".
 *
 * Names: gpuipc_<verb>(c, ...) asks the broker for something on connection c (connect, publish,
 * attach, release, retire, subscribe, ...); gpuipc_<object>_<verb>() makes, reads or frees an object
 * (gpuipc_buffer_alloc, gpuipc_buffer_read, gpuipc_buffer_free, gpuipc_fence_signal, ...). A
 * producer drops its buffer with gpuipc_buffer_free, a consumer with gpuipc_release. A function that
 * returns an object does so through its last argument, ret (gpuipc_connect, which has nothing to
 * act on yet, takes it first). Options structs start with struct_size = sizeof(the struct), so a
 * later release can add fields without breaking callers built against this one; a NULL options
 * pointer means every default.
 */
#ifndef GPUIPC_H
#define GPUIPC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPUIPC_VERSION_MAJOR 0
#define GPUIPC_VERSION_MINOR 1

typedef struct gpuipc gpuipc_t;
typedef struct gpuipc_buffer gpuipc_buffer_t;

typedef enum gpuipc_kind {
        GPUIPC_KIND_MEMFD = 1,       /* host memory (memfd), mapped by every consumer */
        GPUIPC_KIND_CUDA_VMM = 2,    /* cuMemCreate memory exported as a POSIX fd; crosses anything */
        GPUIPC_KIND_CUDA_LEGACY = 3, /* cuIpcGetMemHandle; producer and consumer need different PIDs */
} gpuipc_kind_t;

/* Error codes, their values and their stable names, from one table (libuv's UV_ERRNO_MAP): XX(NAME,
 * value, "name") for each GPUIPC_E_NAME. -1001 to -1099 are the broker's reply statuses (status N is
 * -(1000 + N); the names are docs/protocol.md's), -1100 and below the library's own. */
#define GPUIPC_ERRNO_MAP(XX)                                                                              \
        XX(BAD_REQUEST, -1001, "bad-request")                                                             \
        XX(PROTOCOL, -1002, "protocol")                                                                   \
        XX(VERSION, -1003, "version")                                                                     \
        XX(UNKNOWN_OP, -1004, "unknown-op")                                                               \
        XX(NOT_FOUND, -1005, "not-found")                                                                 \
        XX(TIMEOUT, -1006, "timeout")                                                                     \
        XX(NAME_TAKEN, -1007, "name-taken")                                                               \
        XX(QUOTA, -1008, "quota")                                                                         \
        XX(DENIED, -1009, "denied")                                                                       \
        XX(NOT_OWNER, -1010, "not-owner")                                                                 \
        XX(NOT_ATTACHED, -1011, "not-attached")                                                           \
        XX(STATE, -1012, "state")                                                                         \
        XX(BAD_FD, -1013, "bad-fd")                                                                       \
        XX(PIDNS, -1014, "pidns")               /* retired: brokers send same-pid instead */              \
        XX(DEVICE, -1015, "device")                                                                       \
        XX(GROUP_MISMATCH, -1016, "group-mismatch")                                                       \
        XX(REVOKED, -1017, "revoked")                                                                     \
        XX(HELLO_FIRST, -1018, "hello-first")                                                             \
        XX(SHUTDOWN, -1019, "shutdown")                                                                   \
        XX(KIND, -1020, "kind")                                                                           \
        XX(INVALID, -1021, "invalid")                                                                     \
        XX(KEY_TAKEN, -1022, "key-taken")                                                                 \
        XX(SAME_PID, -1023, "same-pid")                                                                   \
        XX(SHM, -1024, "shm")                                                                             \
        XX(NO_BROKER, -1100, "no-broker")       /* nothing listens on the socket */                       \
        XX(DISCONNECTED, -1101, "disconnected") /* the broker went away */                                \
        XX(NO_CUDA, -1102, "no-cuda")           /* a CUDA kind, but no usable libcuda.so.1 or device */   \
        XX(CUDA, -1103, "cuda")                 /* a CUDA call failed; gpuipc_errmsg() names it */        \
        XX(BUSY, -1104, "busy")                 /* the buffer is still in use (attached or published) */  \
        XX(BAD_REPLY, -1105, "bad-reply")       /* the broker's reply made no sense (version skew?) */

enum {
#define GPUIPC_XX(code, value, name) GPUIPC_E_##code = value,
        GPUIPC_ERRNO_MAP(GPUIPC_XX)
#undef GPUIPC_XX
};

/* A sentence naming the cause of err and the usual fix. Never NULL. */
const char *gpuipc_strerror(int err);

/* The error's stable short name, for scripts and logs: the broker's status names ("not-found",
 * "quota", ...: docs/protocol.md section 8), the library's own ("no-broker", "disconnected",
 * "no-cuda", "cuda", "busy", "bad-reply"), the errno name for system errors ("ENOENT"), "ok" for
 * 0, "unknown" for anything else. Never NULL. */
const char *gpuipc_err_name(int err);

/* The library's version, as "MAJOR.MINOR.PATCH" (the release it was built from). */
const char *gpuipc_version(void);

/* ---- connections ---- */

typedef struct gpuipc_options {
        size_t struct_size;      /* sizeof(gpuipc_options_t): lets this struct grow (0 is refused) */
        const char *socket_path; /* NULL: $GPUIPC_SOCKET, else /run/gpuipc/gpuipc.sock */
        const char *label;       /* shown by `gpuipcctl peers`; NULL: the program's name */
        int connect_timeout_ms;  /* keep trying while the socket is missing or refuses, and wait this long
                                  * for the broker's greeting; 0: try once, greeting within 10 s */
        int no_reconnect;        /* non-zero: a lost broker fails every later call with
                                  * GPUIPC_E_DISCONNECTED (connect again to go on). By default (0) a
                                  * connection survives a broker restart or a lost connection: the
                                  * call that notices reconnects (trying for connect_timeout_ms, once
                                  * with 0: then GPUIPC_E_NO_BROKER, and the next call tries again),
                                  * registers this connection's buffers again under the same ids,
                                  * reclaims the references it holds, subscribes again, and carries on
                                  * (a RECONNECTED event says it happened); waits (gpuipc_wait_drained,
                                  * gpuipc_next_event) go on through the outage. Attached handles stay
                                  * valid; drained still means no holder can touch the memory
                                  * (docs/design.md "Broker restarts"). Event-loop users reconnect from
                                  * gpuipc_process() as soon as the broker is back. A call interrupted
                                  * by the loss may take up to twice its timeout. */
        int no_gpus;             /* non-zero: do not probe CUDA for visible GPUs at connect */
} gpuipc_options_t;

/* Connects and says hello. opts may be NULL. A socket path that is given (in opts or $GPUIPC_SOCKET)
 * but empty, or longer than a Unix socket path can be, is GPUIPC_E_INVALID; so is a
 * $GPUIPC_CACHE_MAX that is not a number. */
int gpuipc_connect(gpuipc_t **ret, const gpuipc_options_t *opts);

/* Releases attachments, frees this connection's own buffers (unmapping them), closes the
 * socket. NULL is fine. Buffers obtained from c must not be used afterwards. */
void gpuipc_close(gpuipc_t *c);

/* Closes the connection for a process on its way out, or when memory of c may still be in use
 * (an array over an attached buffer, a framework's tensors in a pool): stops the library's threads,
 * closes the socket and the buffers' fds and frees the library's records of c, but unmaps and frees
 * no memory and makes no CUDA call, so it is safe after the CUDA context is gone and never pulls
 * memory from under a view. The memory, its mappings and CUDA allocations stay until the process
 * exits. The broker sees the connection drop, as after gpuipc_close: it releases c's references
 * and revokes (or, broker-held, keeps) its published buffers; members of c's rings see them
 * closed (or their producer gone, whichever they hear first). Pools of c are forgotten:
 * gpuipc_torch_alloc no longer uses them and gpuipc_torch_free ignores their memory. Handles
 * obtained from c (buffers, rings, pools) must not be used afterwards; fences of c are left open
 * (call nothing on them). Not in a child forked from the process that connected: call nothing on
 * c there (the child's exit releases its copies). NULL is fine. */
void gpuipc_abandon(gpuipc_t *c);

/* Round trip to the broker. */
int gpuipc_ping(gpuipc_t *c, int timeout_ms);

/* Why the last call on c failed, in words: what the broker said, or what the library found wrong.
 * Every call that fails on c says it, and a call on the connection forgets what the call before it
 * said, so it never describes an older failure ("" when there is nothing to say). Valid until the
 * next call. With c NULL: why this thread's last gpuipc_connect() failed. */
const char *gpuipc_errmsg(const gpuipc_t *c);

/* ---- buffers: producer side ---- */

/* Allocates shareable memory. device is the CUDA device ordinal (ignored for memfd). size: 1 to
 * GPUIPC_MAX_BUFFER_SIZE bytes (else GPUIPC_E_INVALID), and for memfd no more than the memory this
 * process may still use: MemAvailable, or what its cgroup's memory.max leaves if less (else -ENOMEM).
 * Pools and ring slots are held to the same limit. */
int gpuipc_buffer_alloc(gpuipc_t *c, gpuipc_kind_t kind, size_t size, int device, gpuipc_buffer_t **ret);

/* Shares existing CUDA device memory (cuMemAlloc/cudaMalloc) as cuda-legacy: the allocation's
 * base is exported and (offset, size) travel with it. The memory stays the caller's. */
int gpuipc_buffer_wrap_cuda(gpuipc_t *c, uint64_t device_ptr, size_t size, gpuipc_buffer_t **ret);

typedef struct gpuipc_publish_options {
        size_t struct_size;    /* sizeof(gpuipc_publish_options_t): lets this struct grow (0 is refused) */
        int writable;          /* consumers may write; fixed at the buffer's first publish */
        int broker_held;       /* memfd, cuda-vmm: the memory outlives this process until retired and drained */
        unsigned retire_after; /* retire automatically after this many attaches (0: never) */
        const void *meta;      /* an encoded msgpack map (dtype, shape, ...), at most 4096 bytes */
        size_t meta_len;
        int no_sync;           /* CUDA kinds: skip the device synchronization that makes prior writes visible */
} gpuipc_publish_options_t;

/* Publishes b under name. The first publish registers the memory (its fd travels once); after
 * gpuipc_wait_drained, publishing again (under any name) costs one round trip. opts may be NULL. */
int gpuipc_publish(gpuipc_t *c, gpuipc_buffer_t *b, const char *name, const gpuipc_publish_options_t *opts);

/* Stops new attaches; existing ones stay valid. The drained event follows the last release. */
int gpuipc_retire(gpuipc_t *c, gpuipc_buffer_t *b);

/* Waits until b (retired) has no references left: then its memory may be reused or freed. */
int gpuipc_wait_drained(gpuipc_t *c, gpuipc_buffer_t *b, int timeout_ms);

/* ---- buffers: consumer side ---- */

/* Attaches the buffer published under name, waiting up to timeout_ms for it to appear. The
 * mapping is cached: attaching the same buffer again costs one round trip and no import. */
int gpuipc_attach(gpuipc_t *c, const char *name, int timeout_ms, gpuipc_buffer_t **ret);

/* Attaches a live buffer by its broker id (as passed along a pipeline). */
int gpuipc_attach_id(gpuipc_t *c, uint64_t buffer_id, gpuipc_buffer_t **ret);

/* Drops the reference taken by attach and frees b (the handle, not the cached mapping). Releasing a
 * buffer the broker revoked is no error (0), whether or not the revoked event was read yet. */
int gpuipc_release(gpuipc_t *c, gpuipc_buffer_t *b);

/* Unmaps cached mappings nobody uses. */
void gpuipc_cache_trim(gpuipc_t *c);

/* CUDA kinds: the device that new imports map onto. -1 (the default): the buffer's own device.
 * Mapping onto another GPU uses peer access (NVLink/PCIe). A buffer this connection has mapped
 * already keeps its device; gpuipc_cache_trim() drops idle mappings. */
int gpuipc_set_device(gpuipc_t *c, int ordinal);

/* ---- either side ---- */

/* Copies between the buffer and host memory whatever the kind (memcpy for memfd, a CUDA copy
 * for the CUDA kinds). offset + len must lie within the buffer. */
int gpuipc_buffer_read(const gpuipc_buffer_t *b, size_t offset, void *dst, size_t len);
int gpuipc_buffer_write(gpuipc_buffer_t *b, size_t offset, const void *src, size_t len);

/* Producer: unregisters (retiring first if needed; the broker forgets it once drained) and frees
 * the memory once nobody can use it any more; b is freed. An attached buffer is GPUIPC_E_INVALID
 * (a consumer drops its buffers with gpuipc_release, the one way to). */
int gpuipc_buffer_free(gpuipc_t *c, gpuipc_buffer_t *b);

/* Host pointer (memfd) or device pointer (CUDA kinds) of the data. */
void *gpuipc_buffer_ptr(const gpuipc_buffer_t *b);
size_t gpuipc_buffer_size(const gpuipc_buffer_t *b);
gpuipc_kind_t gpuipc_buffer_kind(const gpuipc_buffer_t *b);
/* The buffer's id and its current generation. The id is drawn at random (non-zero, below 2^53) when
 * the producer allocates the memory and never changes: it names the same memory across broker
 * restarts, so it is safe to pass along a pipeline (gpuipc_attach_id). The generation tells one
 * publication of it from the next (0 before the first publish). */
uint64_t gpuipc_buffer_id(const gpuipc_buffer_t *b);
uint64_t gpuipc_buffer_generation(const gpuipc_buffer_t *b);
const char *gpuipc_buffer_name(const gpuipc_buffer_t *b);
/* The device's UUID ("GPU-..."/"MIG-...") for CUDA kinds, "" for memfd. */
const char *gpuipc_buffer_device(const gpuipc_buffer_t *b);
/* The CUDA device ordinal the mapping lives on (consumer: where it was imported), -1 for memfd. */
int gpuipc_buffer_device_ordinal(const gpuipc_buffer_t *b);
int gpuipc_buffer_writable(const gpuipc_buffer_t *b);
/* The metadata map as published (NULL and 0 when there is none). */
const void *gpuipc_buffer_meta(const gpuipc_buffer_t *b, size_t *ret_len);
/* Non-zero once the broker revoked b (its producer died): stop using the memory. */
int gpuipc_buffer_revoked(const gpuipc_buffer_t *b);

/* ---- views: ranges of a buffer, published without a copy ---- */

/* A view: the bytes [offset, offset + size) of segment, one of this connection's own memfd or
 * cuda-vmm buffers, as a buffer of its own (its own id, name, generation, drained event; publish,
 * retire, wait_drained and free it like any buffer) that has no memory of its own. Publishing it
 * copies nothing and exports nothing: the segment's fd travels with the first view published of it
 * (once per broker), and a consumer maps the whole segment once; every later view of it that the
 * consumer attaches is a pointer into that mapping (no import). The first view published of a
 * segment fixes writable and broker_held for all of them. A consumer of a view can read the whole
 * segment: put into one segment only what every consumer of its views may see.
 * The segment cannot be freed while views of it exist (GPUIPC_E_BUSY): free them first. */
int gpuipc_buffer_view(gpuipc_t *c, gpuipc_buffer_t *segment, size_t offset, size_t size, gpuipc_buffer_t **ret);

/* The id of the buffer whose memory b is a view of (producer: its segment's; consumer: the
 * mapping's), 0 for a buffer that is no view. Views of one segment share one mapping. */
uint64_t gpuipc_buffer_segment(const gpuipc_buffer_t *b);

/* One range of a batch copy into a buffer: len bytes from src (a device pointer for the CUDA kinds,
 * a host pointer for memfd) to the buffer's byte offset. */
typedef struct gpuipc_copy {
        uint64_t src;
        size_t offset;
        size_t len;
} gpuipc_copy_t;

/* Queues n copies into b (own or writable attached) in cu_stream (a CUstream of b's device; NULL:
 * its legacy default stream): one call for many ranges, no kernel (a state dict's tensors into its
 * buffer; with cuMemcpyBatchAsync where the driver has it, up to 256 per driver call, which on the
 * legacy default stream go into the calling thread's default stream, ordered with it). Every range
 * must lie within b; none is queued otherwise. memfd: plain copies, done on return. Publishing with
 * the default synchronization makes them visible; otherwise order consumers after cu_stream (a fence). */
int gpuipc_buffer_copy_in(gpuipc_buffer_t *b, const gpuipc_copy_t *items, size_t n, void *cu_stream);

/* ---- loading files: a checkpoint's bytes straight into a buffer ---- */

/* One range of a load: len bytes of file fd from file_offset to the buffer's byte offset. */
typedef struct gpuipc_file_range {
        int fd;
        uint64_t file_offset;
        size_t offset;
        size_t len;
} gpuipc_file_range_t;

typedef struct gpuipc_load_options {
        size_t struct_size;  /* sizeof(gpuipc_load_options_t): lets this struct grow (0 is refused) */
        size_t chunk_size;   /* bytes read at once (0: 64 MiB); the CUDA kinds stage two chunks in page-locked
                              * host memory, one read while the other is copied to the device */
        /* Called after each chunk with the bytes loaded so far, on the calling thread (NULL: none). */
        void (*progress)(uint64_t done, void *ud);
        void *progress_ud;
} gpuipc_load_options_t;

typedef struct gpuipc_load_stats {
        uint64_t bytes;        /* bytes loaded */
        uint64_t read_ns;      /* time spent reading the files */
        uint64_t copy_wait_ns; /* time spent waiting for the device's copies (both staging chunks busy) */
        uint64_t total_ns;
} gpuipc_load_stats_t;

/* Reads the n ranges into b (own, or attached writable): for memfd straight into its memory; for
 * the CUDA kinds through two page-locked chunks, each chunk's copies queued to the device (in a
 * stream of the library's) while the next chunk is read, so the load runs at the speed of the
 * slower of the disk and the bus. Reads of ranges that follow each other in one file are merged.
 * Ranges of one fd should come in file order (any order works, more slowly). An fd that cannot seek
 * (a pipe) is read in order from where it stands, which must be its first range's file_offset: its
 * ranges must come in file order, and the bytes between them are read and dropped. Every range must lie
 * within b (GPUIPC_E_INVALID, nothing read otherwise); a file that ends before a range does is
 * -EIO, a failed read its -errno, gpuipc_errmsg() naming the file offset. The copies are complete
 * on return, also on failure. opts and ret_stats may be NULL. */
int gpuipc_buffer_load(gpuipc_buffer_t *b, const gpuipc_file_range_t *ranges, size_t n,
                       const gpuipc_load_options_t *opts, gpuipc_load_stats_t *ret_stats);

/* The free and total memory of CUDA device `device` (cuMemGetInfo in its primary context). */
int gpuipc_device_memory(gpuipc_t *c, int device, size_t *ret_free, size_t *ret_total);

/* ---- pools: memory born shareable ---- */

/* A pool hands out memory from a few large segments (cuda-vmm allocations on one device, or
 * memfds), each exported once when it is made. Any range of it is published as a view
 * (gpuipc_pool_view): no copy and no export, the segment's fd travels once per broker and once per
 * consumer, and a consumer that mapped a segment attaches every later view of it without an import.
 * A range freed (gpuipc_pool_free) while a view of it exists is not handed out again until every
 * such view is freed (free a view once it drained): holders keep valid memory. Segments that hold
 * nothing stay, exported, for later allocations until gpuipc_pool_trim(). PyTorch allocates through
 * a pool with gpuipc_torch_alloc/gpuipc_torch_free (torch.cuda.memory.CUDAPluggableAllocator). */
typedef struct gpuipc_pool gpuipc_pool_t;

typedef struct gpuipc_pool_options {
        size_t struct_size;      /* sizeof(gpuipc_pool_options_t): lets this struct grow (0 is refused) */
        gpuipc_kind_t kind;      /* GPUIPC_KIND_CUDA_VMM (also 0) or GPUIPC_KIND_MEMFD */
        int device;              /* cuda-vmm: the CUDA device ordinal */
        size_t segment_size;     /* the first new segment's size (0: 64 MiB); each later one as large as the
                                  * pool so far, up to max_segment_size; an allocation larger gets its own */
        size_t max_segment_size; /* 0: 1 GiB */
        size_t reserve;          /* bytes made (and exported) at once as one segment, e.g. a model's size (0: none) */
        int writable;            /* consumers may write the views of this pool's memory */
        int broker_held;         /* the memory outlives this process until its views are retired and drained */
} gpuipc_pool_options_t;

/* Makes a pool on connection c (opts may be NULL: cuda-vmm on device 0). A device without virtual
 * memory management or fd export is GPUIPC_E_KIND, saying which; no CUDA is GPUIPC_E_NO_CUDA. */
int gpuipc_pool_new(gpuipc_t *c, const gpuipc_pool_options_t *opts, gpuipc_pool_t **ret);

/* size bytes (aligned to 512) into *ret: a device pointer (cuda-vmm) or host pointer (memfd). Any
 * thread may call these two: they never talk to the broker. */
int gpuipc_pool_alloc(gpuipc_pool_t *p, size_t size, void **ret);
/* Gives back what gpuipc_pool_alloc returned; handed out again only once no view covers it. */
int gpuipc_pool_free(gpuipc_pool_t *p, void *ptr);

/* A view (gpuipc_buffer_view) of [ptr, ptr + size), which must lie in one segment and start in an
 * allocation (it may cover several: a state dict's arrays): GPUIPC_E_NOT_FOUND outside the pool,
 * GPUIPC_E_INVALID when it spans two segments or starts in memory that is not allocated (gpuipc_errmsg
 * says which). While it is active (until it drained) no allocation it covers is handed out again. */
int gpuipc_pool_view(gpuipc_pool_t *p, const void *ptr, size_t size, gpuipc_buffer_t **ret);

/* The segment holding ptr: its base and size. 0, or GPUIPC_E_NOT_FOUND. */
int gpuipc_pool_segment(gpuipc_pool_t *p, const void *ptr, void **ret_base, size_t *ret_size);

/* Every segment's base and size (up to cap of them, oldest first); returns how many there are. */
int gpuipc_pool_segments(gpuipc_pool_t *p, void **bases, size_t *sizes, size_t cap);

/* Frees the segments that hold nothing (the broker forgets those it knew; consumers' mappings kept
 * their memory valid for them). */
int gpuipc_pool_trim(gpuipc_pool_t *p);

typedef struct gpuipc_pool_stats {
        size_t segments;  /* segments now */
        size_t reserved;  /* their bytes */
        size_t allocated; /* bytes handed out and not freed */
        size_t deferred;  /* bytes freed while a view covered them: free once those views are */
        size_t views;     /* views of the pool's memory not freed yet */
        size_t exports;   /* exports made since the pool was (one per segment, ever) */
} gpuipc_pool_stats_t;

int gpuipc_pool_stats(gpuipc_pool_t *p, gpuipc_pool_stats_t *ret);

/* Frees the pool and all its memory; GPUIPC_E_BUSY while views of it exist. What was allocated from
 * it must not be used afterwards. gpuipc_close() closes a connection's pools. NULL is fine. */
int gpuipc_pool_close(gpuipc_pool_t *p);

/* Makes p the calling thread's pool for gpuipc_torch_alloc (NULL: none) and returns the one before. */
gpuipc_pool_t *gpuipc_pool_use(gpuipc_pool_t *p);

/* PyTorch's pluggable-allocator entry points (CUDAPluggableAllocator(path of this library,
 * "gpuipc_torch_alloc", "gpuipc_torch_free")): allocate from the calling thread's pool (else the
 * newest cuda-vmm pool of that device; NULL without one) and give back to whichever pool holds ptr. */
void *gpuipc_torch_alloc(ssize_t size, int device, void *stream);
void gpuipc_torch_free(void *ptr, size_t size, int device, void *stream);

/* ---- events ---- */

typedef enum gpuipc_event_type {
        GPUIPC_EVENT_PUBLISHED = 1, /* a subscription matched a publish */
        GPUIPC_EVENT_RETIRED = 2,   /* ... a retire */
        GPUIPC_EVENT_REVOKED = 3,   /* a buffer you hold (or watch) is gone: its producer died, or did
                                     * not come back within the broker's restart grace; for one of your
                                     * own buffers: it could not be registered again after a restart */
        GPUIPC_EVENT_DRAINED = 4,   /* a buffer you retired (or watch) has no references left; reason
                                     * says when holders lost in a broker restart were given up on */
        GPUIPC_EVENT_RECONNECTED = 5, /* the broker restarted (or dropped us): everything was registered
                                       * again; subscription events meanwhile were missed */
} gpuipc_event_type_t;

typedef struct gpuipc_event {
        gpuipc_event_type_t type;
        uint64_t subscription; /* the subscription that matched, 0 for events about your own buffers */
        uint64_t buffer, generation;
        gpuipc_kind_t kind;
        char name[256];
        char reason[256];
} gpuipc_event_t;

/* Subscribes to events about names starting with prefix ("" for all). */
int gpuipc_subscribe(gpuipc_t *c, const char *prefix, uint64_t *ret_subscription);
int gpuipc_unsubscribe(gpuipc_t *c, uint64_t subscription);

/* Takes the oldest queued event, waiting up to timeout_ms for one. GPUIPC_E_TIMEOUT if none. */
int gpuipc_next_event(gpuipc_t *c, int timeout_ms, gpuipc_event_t *ret);

/* For callers with their own event loop: poll gpuipc_fd() for reading, then call
 * gpuipc_process(), which reads what arrived without blocking and returns the number of queued
 * events (take them with gpuipc_next_event(c, 0, &ev)) or an error. gpuipc_fd() is an epoll fd that
 * stays the same for the life of the connection (register it once); while the broker is away and
 * the connection reconnects (no no_reconnect), it wakes every 50 ms so that gpuipc_process() can try
 * again. */
int gpuipc_fd(const gpuipc_t *c);
int gpuipc_process(gpuipc_t *c);

/* ---- GPU fences: stream-ordered signalling between processes (and containers) ----
 * A 64-bit counter in a small cuda-vmm buffer, advanced with cuStreamWriteValue64 and awaited with
 * cuStreamWaitValue64 (CUDA's IPC events need distinct PIDs and one /dev/shm). Close a fence before its
 * connection, and only once no queued stream work still refers to it. */
typedef struct gpuipc_fence gpuipc_fence_t;

/* Creates a fence (counter 0) on CUDA device `device` and publishes it under name (writable: either
 * end may signal; not broker-held). */
int gpuipc_fence_create(gpuipc_t *c, const char *name, int device, gpuipc_fence_t **ret);

/* Attaches the fence published under name, waiting up to timeout_ms; mapped like any cuda-vmm
 * buffer (gpuipc_set_device() picks the device). */
int gpuipc_fence_open(gpuipc_t *c, const char *name, int timeout_ms, gpuipc_fence_t **ret);

/* Enqueues, in cu_stream (a CUstream of the fence's device; NULL: the legacy default stream), a
 * write of value after all prior work in that stream. */
int gpuipc_fence_signal(gpuipc_fence_t *f, void *cu_stream, uint64_t value);

/* Enqueues, in cu_stream, a wait until the counter >= value (cyclic: (int64_t)(counter - value) >= 0). */
int gpuipc_fence_wait(gpuipc_fence_t *f, void *cu_stream, uint64_t value);

/* Reads the counter from the host (tests, diagnostics); never waits behind queued fence waits. */
int gpuipc_fence_value(gpuipc_fence_t *f, uint64_t *ret);

/* Closes the fence: the creator unpublishes and frees it, an opener releases it. NULL is fine. */
void gpuipc_fence_close(gpuipc_fence_t *f);

/* A fence made of a CUDA IPC event instead of a counter: cheaper to wait on, but CUDA opens an IPC
 * event only in a process whose PID (each as seen in its own PID namespace) differs from the
 * creator's and that sees the same /dev/shm (docs/legacy-ipc.md); gpuipc_fence_open() refuses
 * otherwise, before CUDA runs, with GPUIPC_E_SAME_PID or GPUIPC_E_SHM and a message naming the fix.
 * gpuipc_fence_open() opens either kind.
 * Only the creator signals it; the value of signal and wait is ignored: a wait waits for the signal
 * recorded last before it was enqueued (so signal, then tell the consumer, e.g. by publishing), and
 * gpuipc_fence_value() gives 1 once that signal completed, else 0. */
int gpuipc_fence_create_ipc_event(gpuipc_t *c, const char *name, int device, gpuipc_fence_t **ret);

/* ---- rings: frames handed over in shared memory, without the broker ----
 * A producer creates a ring of `slots` buffers of one kind and size under a name; each consumer
 * joins it once (it maps every slot then) and takes and releases frames from then on through the
 * ring's shared memory alone. Frames are numbered 1, 2, 3, ... The broker sets the ring up, tells
 * the producer who joined and left, and cleans up after dead members; it sees no frame.
 *
 * Backpressure mode: every member gets every frame, in order; the producer reuses a slot only when
 * every member released the frame in it, and evicts a member that holds it up longer than the
 * lease. Latest mode (video): the producer never waits; a member takes the newest frame, and frames
 * a slow member did not take are dropped for it (needs slots >= members + 2).
 * A ring is used by one thread at a time on each side. Its frame calls (acquire, publish, take,
 * release) go through shared memory alone: they never wait for the broker or for the connection,
 * which another thread may use meanwhile. What the broker says about a ring (members joining and
 * leaving, a dead producer, a restart) is read by a thread of the library's as it arrives.
 * docs/design.md "Rings" explains the memory layout and why the hand-over is race-free. */
typedef struct gpuipc_ring gpuipc_ring_t;

#define GPUIPC_RING_MAX_SLOTS 64   /* slots of a ring */
#define GPUIPC_RING_MAX_MEMBERS 64 /* member seats of a ring */

typedef enum gpuipc_ring_mode {
        GPUIPC_RING_BACKPRESSURE = 0,
        GPUIPC_RING_LATEST = 1,
        GPUIPC_RING_STREAM = 2, /* cuda-vmm slots, GPU doorbells: see the stream calls below */
} gpuipc_ring_mode_t;

typedef struct gpuipc_ring_options {
        size_t struct_size;       /* sizeof(gpuipc_ring_options_t): lets this struct grow (0 is refused) */
        gpuipc_kind_t kind;       /* of the slots: GPUIPC_KIND_MEMFD (0: the default) or GPUIPC_KIND_CUDA_VMM */
        size_t slot_size;         /* bytes per slot (required) */
        unsigned slots;           /* 0: 4 */
        unsigned max_members;     /* member seats; 0: 4 */
        int device;               /* CUDA slots: the device ordinal */
        gpuipc_ring_mode_t mode;
        unsigned lease_ms;        /* backpressure: evict a member that holds the producer up this long;
                                   * 0: 2000 */
} gpuipc_ring_options_t;

/* Producer: allocates the slots and the ring's shared memory and registers it under name. */
int gpuipc_ring_create(gpuipc_t *c, const char *name, const gpuipc_ring_options_t *opts, gpuipc_ring_t **ret);

/* Member: joins the ring published under name, waiting up to timeout_ms for it to exist. Its
 * producer lets the member in as soon as the broker tells it; the first take waits for that. Its
 * first frame: backpressure, the ring's first frame while the ring is young (seated before the
 * producer made a frame in every slot: every frame is still there), so that a member waiting for
 * the ring when it appears misses none; later, and in the other modes, the next frame published. */
int gpuipc_ring_join(gpuipc_t *c, const char *name, int timeout_ms, gpuipc_ring_t **ret);

/* Producer: the slot the next frame goes into, once nothing may still read it (backpressure: every
 * member released the frame it held; waits up to timeout_ms). Write into it, then publish. */
int gpuipc_ring_acquire(gpuipc_ring_t *r, int timeout_ms, gpuipc_buffer_t **ret_slot);

/* Producer: makes the acquired slot the next frame (CUDA slots: after a device synchronization) and
 * wakes members that wait. *ret_frame (may be NULL) is its number. */
int gpuipc_ring_publish(gpuipc_ring_t *r, uint64_t *ret_frame);

/* Member: takes the next frame (backpressure) or the newest one not taken yet (latest), waiting up
 * to timeout_ms, whatever the producer's control page says. The slot stays the member's until
 * gpuipc_ring_release. GPUIPC_E_REVOKED once the member was evicted or the ring closed or lost its
 * producer, or the control page showed a frame number no ring reaches (a hostile producer;
 * gpuipc_errmsg says which). */
int gpuipc_ring_take(gpuipc_ring_t *r, int timeout_ms, gpuipc_buffer_t **ret_slot, uint64_t *ret_frame);

/* Member: 1 once the ring's producer closed it (its takes then return GPUIPC_E_REVOKED: no frame
 * comes any more), 0 while it is open or when it ended otherwise (the producer died, this member was
 * evicted) and for a producer's ring. What tells the two GPUIPC_E_REVOKED apart without reading
 * gpuipc_errmsg. */
int gpuipc_ring_closed(gpuipc_ring_t *r);

/* Member: gives the frame back. 0 means it did not change while held; GPUIPC_E_REVOKED means the
 * producer overwrote it (it evicted this member, which held the ring up past its lease). */
int gpuipc_ring_release(gpuipc_ring_t *r);

/* Member: an fd for event loops, readable when a frame may be ready (take with timeout 0 until it
 * says GPUIPC_E_TIMEOUT; that also resets the fd), and as soon as news from the broker ends the ring
 * for the member (the producer died, the member was evicted: take then says GPUIPC_E_REVOKED). A
 * helper thread of the library sleeps on the ring's doorbell for it. */
int gpuipc_ring_fd(gpuipc_ring_t *r);

/* Before sleeping, busy-wait up to spin_us: a member for a frame, a producer for a free slot (lower
 * latency, a core spent). */
void gpuipc_ring_set_spin(gpuipc_ring_t *r, unsigned spin_us);

/* Leaves (member) or closes (producer) the ring and frees what it holds. NULL is fine. */
void gpuipc_ring_close(gpuipc_ring_t *r);

/* Stream-ordered rings (mode GPUIPC_RING_STREAM, cuda-vmm slots): the CPU never waits for a frame;
 * streams do, on counters in small cuda-vmm buffers (they cross containers with no condition, unlike
 * CUDA IPC events). Each call enqueues into cu_stream (a CUstream of the ring's device; NULL: the legacy
 * default stream) and returns at once:
 *   producer: acquire enqueues a wait until every member released the frame the slot held; write
 *             the slot with work in the same stream; publish enqueues "frame n is ready" for every
 *             member (after that work);
 *   member:   take enqueues a wait until frame n is ready and hands out its slot; run work on it in
 *             the same stream; release enqueues "frame n is done".
 * timeout_ms bounds only what the host may wait for: a member's seat (after join), and how far
 * either side may run ahead of the other (at most `slots` frames). A member that stops releasing is
 * evicted after the lease, and a producer's stream never stays blocked on a member that left. */
int gpuipc_ring_stream_acquire(gpuipc_ring_t *r, void *cu_stream, int timeout_ms, gpuipc_buffer_t **ret_slot);
int gpuipc_ring_stream_publish(gpuipc_ring_t *r, void *cu_stream, uint64_t *ret_frame);
int gpuipc_ring_stream_take(gpuipc_ring_t *r, void *cu_stream, int timeout_ms, gpuipc_buffer_t **ret_slot,
                            uint64_t *ret_frame);
int gpuipc_ring_stream_release(gpuipc_ring_t *r, void *cu_stream);

/* ---- rendezvous groups ---- */

/* Waits until `members` connections joined group (all return 0 together) or the earliest
 * member's deadline passes (all fail with GPUIPC_E_TIMEOUT). */
int gpuipc_group_join(gpuipc_t *c, const char *group, unsigned members, int timeout_ms);

/* ---- inspecting the broker: what gpuipcctl shows ----
 * Plain structs with fixed-size fields, so that other languages (ctypes, cffi) can use them as they
 * are. Strings are NUL-terminated and were checked by the broker to be within the protocol's
 * limits. Listings page with a cursor: start with 0; each call stores up to cap records and sets the
 * cursor for the next call, or to 0 once the listing is complete:
 *
 *   uint64_t cursor = 0;
 *   gpuipc_buffer_info_t page[64];
 *   do {
 *           int n = gpuipc_list_buffers(c, "cam/", &cursor, page, 64);
 *           if (n < 0)
 *                   return n;
 *           ... page[0 .. n-1] ...
 *   } while (cursor);
 *
 * Listings are not snapshots: records added or removed between two calls may be missed or not. */

#define GPUIPC_MAX_NAME 255  /* buffer and group names, in bytes */
#define GPUIPC_MAX_LABEL 64  /* a connection's label */
#define GPUIPC_MAX_UUID 64   /* "GPU-..." or "MIG-..." */
#define GPUIPC_MAX_GPUS 64   /* GPUs a connection declares, and devices gpuipc_cuda_describe() reports */
#define GPUIPC_MAX_PAGE 1024 /* records the broker sends at most in one page */
/* The most bytes any buffer may have (2^62), whatever its kind; a memfd buffer may have no more than
 * the memory its process may still use either (gpuipc_buffer_alloc). */
#define GPUIPC_MAX_BUFFER_SIZE (UINT64_C(1) << 62)

typedef enum gpuipc_buffer_state {
        GPUIPC_STATE_LIVE = 1,    /* attachable */
        GPUIPC_STATE_RETIRED = 2, /* no new attaches; waiting for the last release */
        GPUIPC_STATE_IDLE = 3,    /* retired and drained: its producer may publish it again or free it */
} gpuipc_buffer_state_t;

/* "memfd", "cuda-vmm", "cuda-legacy" / "live", "retired", "idle" / "published", ...; "unknown" for
 * values out of range. Never NULL. */
const char *gpuipc_kind_name(gpuipc_kind_t kind);
const char *gpuipc_state_name(gpuipc_buffer_state_t state);
const char *gpuipc_event_name(gpuipc_event_type_t type);

/* The kind named name ("memfd", ...) into *ret. 0, or GPUIPC_E_INVALID for any other string. */
int gpuipc_kind_from_name(const char *name, gpuipc_kind_t *ret);

/* One registered buffer, as the broker describes it. */
typedef struct gpuipc_buffer_info {
        uint64_t buffer;                   /* the broker's id */
        uint64_t generation;               /* of its latest publish */
        char name[GPUIPC_MAX_NAME + 1];    /* the name of its latest publish */
        gpuipc_kind_t kind;
        gpuipc_buffer_state_t state;
        uint64_t size;                     /* bytes */
        uint64_t refs;                     /* references held by all peers */
        uint64_t holders;                  /* peers holding at least one reference */
        uint64_t owner;                    /* the producer's peer id; 0: it is gone (orphaned, broker-held) */
        uint64_t uid;                      /* the producer's uid, from the kernel */
        uint64_t pid;                      /* the producer's pid in the broker's PID namespace; 0: outside it */
        char device[GPUIPC_MAX_UUID + 1];  /* the GPU's UUID (CUDA kinds), "" for memfd */
        int writable;                      /* consumers may map it writable */
        int broker_held;                   /* the memory outlives its producer */
        uint64_t self_pid;                 /* cuda-legacy: the producer's PID in its own PID namespace (what a
                                            * consumer's PID must differ from), 0 if unknown or another kind */
} gpuipc_buffer_info_t;

/* A peer holding references to a buffer. */
typedef struct gpuipc_holder_info {
        uint64_t peer, pid, uid; /* pid: in the broker's PID namespace, 0 outside it */
        uint64_t refs;           /* references this peer holds */
} gpuipc_holder_info_t;

/* One connection to the broker. */
typedef struct gpuipc_peer_info {
        uint64_t peer;                     /* the broker's id for the connection */
        uint64_t pid, uid, gid;            /* from the kernel at accept; pid 0: outside the broker's PID namespace */
        uint64_t pidns;                    /* its PID namespace's inode */
        int pidns_declared;                /* non-zero: pidns is only what the peer said (unverified) */
        char label[GPUIPC_MAX_LABEL + 1];  /* what the peer calls itself */
        uint64_t buffers, refs, subs, waits; /* buffers it owns, references, subscriptions, waiting requests */
        uint64_t started_ms;               /* when it connected, on the broker's monotonic clock */
        unsigned n_gpus;                   /* GPU UUIDs it declared */
        char gpus[GPUIPC_MAX_GPUS][GPUIPC_MAX_UUID + 1];
        uint64_t self_pid;                 /* its PID in its own PID namespace: the kernel's where the broker
                                            * sees it (pid non-zero), else what it declared; 0 if unknown */
        uint64_t shm_dev, shm_ino;         /* its /dev/shm (device and inode), as declared; 0: not said */
} gpuipc_peer_info_t;

/* Lists buffers whose name starts with prefix (NULL or "": all), in the order they were
 * registered, in every state. Returns how many records were stored in items (at most cap; 0 only when none are left),
 * or an error; *cursor as described above. */
int gpuipc_list_buffers(gpuipc_t *c, const char *prefix, uint64_t *cursor, gpuipc_buffer_info_t *items, size_t cap);

/* Lists connected peers (this connection included), in increasing id order, paged like
 * gpuipc_list_buffers. */
int gpuipc_list_peers(gpuipc_t *c, uint64_t *cursor, gpuipc_peer_info_t *items, size_t cap);

/* Describes one buffer: the live buffer published under name, or, with name NULL, the buffer with
 * that broker id (in any state). Stores it in *ret and up to cap of the peers holding it in
 * holders (may be NULL with cap 0), and returns how many holders were stored; ret->holders says
 * how many there are (the broker sends at most GPUIPC_MAX_PAGE). GPUIPC_E_NOT_FOUND when there is
 * no such buffer. */
int gpuipc_stat_buffer(gpuipc_t *c, const char *name, uint64_t buffer, gpuipc_holder_info_t *holders, size_t cap,
                       gpuipc_buffer_info_t *ret);

/* Retires a buffer by its broker id, whoever published it: allowed to its producer, to peers of
 * the producer's uid once it is gone, and to a policy admin (docs/security.md). For a buffer of
 * this connection's own, use gpuipc_retire(), which also keeps the handle's state. */
int gpuipc_retire_id(gpuipc_t *c, uint64_t buffer);

/* ---- rings, as operators see them (docs/operations.md "Rings") ---- */

typedef enum gpuipc_seat_state {
        GPUIPC_SEAT_WAITING = 1,     /* kept through a broker restart: its member has not come back yet */
        GPUIPC_SEAT_JOINED = 2,      /* a member joined; the producer has not seated it yet (it does as
                                      * soon as its library reads the news), or the control page cannot
                                      * be read */
        GPUIPC_SEAT_UNCONFIRMED = 3, /* the producer seated it, but the member's page does not speak for
                                      * the membership: it has not taken its seat yet, or wrote over
                                      * its page; the producer counts it as having released nothing
                                      * since it joined */
        GPUIPC_SEAT_SEATED = 4,      /* seated, and its page speaks for it */
} gpuipc_seat_state_t;

/* "backpressure", "latest", "stream" / "waiting", "joined", "unconfirmed", "seated"; "unknown" for
 * values out of range. Never NULL. */
const char *gpuipc_ring_mode_name(gpuipc_ring_mode_t mode);
const char *gpuipc_seat_state_name(gpuipc_seat_state_t state);

/* One ring. head and lag are read from the ring's shared memory when the broker answers: what its
 * producer and members wrote there, checked and clamped, never trusted. */
typedef struct gpuipc_ring_info {
        char name[GPUIPC_MAX_NAME + 1];
        gpuipc_ring_mode_t mode;
        gpuipc_kind_t kind;               /* of the slots */
        uint64_t slot_size;               /* bytes per slot */
        unsigned slots, members;          /* slots; member seats */
        unsigned taken;                   /* seats taken: by a member, or kept for one (waiting) */
        uint64_t lease_ms;                /* how long a member may hold the producer up */
        char device[GPUIPC_MAX_UUID + 1]; /* the slots' GPU (cuda-vmm), "" for memfd */
        uint64_t owner, uid, pid;         /* the producer: its peer id, uid, and pid (0: outside the
                                           * broker's PID namespace) */
        int ready;                        /* every part is registered: members may join */
        int head_known;                   /* 0: the broker could not read the control page (why says
                                           * why); head and lag are then unknown */
        uint64_t head;                    /* the newest frame published (0: none yet) */
        int lag_known;                    /* some member is seated (and head known) */
        uint64_t lag;                     /* frames the slowest seated member is behind head */
        char why[256];                    /* why head is unknown, else "" */
} gpuipc_ring_info_t;

/* One taken seat of a ring. */
typedef struct gpuipc_ring_member_info {
        unsigned seat;                    /* its index, from 0 */
        uint64_t epoch;                   /* its membership: a new one at every join */
        gpuipc_seat_state_t state;
        uint64_t peer, pid, uid;          /* the member's connection (pid 0: outside the broker's PID
                                           * namespace); all 0 while waiting, or for a connection the
                                           * policy does not show this one (as in gpuipc_list_peers) */
        char label[GPUIPC_MAX_LABEL + 1];
        int position_known;               /* the control page seats it (and could be read) */
        /* Backpressure: the last frame it released. Stream: the last frame whose release it queued
         * (its GPU stream may still be working on it: the broker cannot read GPU memory). Latest:
         * the frame it holds, 0 for none. Never above the ring's head. */
        uint64_t position;
        uint64_t lag;                     /* head - position; latest: 0 while it holds nothing */
} gpuipc_ring_member_info_t;

/* Lists rings whose name starts with prefix (NULL or "": all), oldest first, paged like
 * gpuipc_list_buffers (a page may hold fewer records than asked: reading the rings' memory is
 * bounded per request). Only rings the policy lets this connection see (docs/security.md). */
int gpuipc_list_rings(gpuipc_t *c, const char *prefix, uint64_t *cursor, gpuipc_ring_info_t *items, size_t cap);

/* Describes the ring named name in *ret and up to cap of its taken seats, in seat order, in members
 * (may be NULL with cap 0); returns how many were stored (ret->taken says how many there are).
 * GPUIPC_E_NOT_FOUND when there is no such ring (or none this connection may see). */
int gpuipc_stat_ring(gpuipc_t *c, const char *name, gpuipc_ring_member_info_t *members, size_t cap,
                     gpuipc_ring_info_t *ret);

/* One of the broker's counters, gauges or histogram series (docs/protocol.md, `stats`). */
typedef struct gpuipc_stat {
        char name[GPUIPC_MAX_NAME + 1]; /* "attaches_total", "request_duration_us_bucket", ... */
        char status[32];  /* a series' qualifier: "request_errors_total": the reply status counted
                           * ("quota", ...); "shared_bytes", "held_bytes": the buffer kind ("memfd",
                           * ...); "uid_shared_bytes", "uid_held_bytes": the uid, in decimal; else "" */
        uint64_t le_us;   /* a histogram bucket (name ends in _bucket): its upper bound in microseconds
                           * (the count is cumulative; the total is in the _count record); else 0 */
        uint64_t value;
} gpuipc_stat_t;

/* Asks the broker for its statistics: stores up to cap records in items and returns how many the
 * broker sent (when that is more than cap, the rest were left out: call again with more room). */
int gpuipc_stats(gpuipc_t *c, gpuipc_stat_t *items, size_t cap);

/* What this connection knows about itself and its broker. */
typedef struct gpuipc_connection_info {
        uint64_t peer;         /* the broker's id for this connection (`gpuipcctl peers`) */
        uint64_t epoch;        /* the broker instance: a new value after the broker restarted */
        uint64_t pidns;        /* this process's PID namespace (the inode of /proc/self/ns/pid), as declared */
        int pidns_same;        /* the broker runs in that PID namespace too (it then sees this process's
                                * PID itself, rather than taking the declared one) */
        int connected;         /* 0 once the broker went away (until a reconnect) */
        char socket_path[108]; /* the socket this connection uses */
        unsigned n_gpus;       /* the GPU UUIDs declared to the broker */
        char gpus[GPUIPC_MAX_GPUS][GPUIPC_MAX_UUID + 1];
        uint64_t self_pid;     /* this process's PID, as it sees it (cuda-legacy peers' PIDs must differ) */
        uint64_t shm_dev, shm_ino; /* this process's /dev/shm (CUDA IPC events need the same on both sides);
                                    * 0, 0: none */
} gpuipc_connection_info_t;

int gpuipc_connection_info(const gpuipc_t *c, gpuipc_connection_info_t *ret);

/* ---- CUDA as this process sees it (gpuipcctl doctor); needs no broker ---- */

/* One answer about a device: ok says whether the query worked; then value (yes/no facts, numbers) or
 * text holds the answer, else why says what failed. */
typedef struct gpuipc_cuda_fact {
        int ok;
        int value;
        char text[96];
        char why[192];
} gpuipc_cuda_fact_t;

typedef struct gpuipc_cuda_device {
        int ordinal;
        gpuipc_cuda_fact_t name;
        gpuipc_cuda_fact_t uuid;       /* what a connection declares: MIG-... for a MIG instance */
        gpuipc_cuda_fact_t gpu_uuid;   /* the physical GPU's GPU-... */
        gpuipc_cuda_fact_t mig;        /* value 1: a MIG instance (the two UUIDs differ) */
        gpuipc_cuda_fact_t vmm;        /* virtual memory management: cuda-vmm possible ... */
        gpuipc_cuda_fact_t posix_fd;   /* ... and its export as a POSIX fd */
        gpuipc_cuda_fact_t mem_ops_64; /* 64-bit stream memory operations: gpuipc fences work */
        gpuipc_cuda_fact_t pci_bus_id;
} gpuipc_cuda_device_t;

typedef struct gpuipc_cuda_info {
        int loaded;           /* 0: CUDA is not usable here, reason says why */
        char reason[512];
        int driver_version;   /* 1000 * major + 10 * minor */
        int n_devices;        /* devices described: the visible ones, at most GPUIPC_MAX_GPUS */
        gpuipc_cuda_device_t devices[GPUIPC_MAX_GPUS];
} gpuipc_cuda_info_t;

/* Loads the CUDA driver (if not yet) and describes every visible device into *ret (large: allocate
 * it). 0, or GPUIPC_E_NO_CUDA with ret->reason saying why. */
int gpuipc_cuda_describe(gpuipc_cuda_info_t *ret);

#ifdef __cplusplus
}
#endif

#endif
