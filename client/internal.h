/* libgpuipc internals shared by its files: the connection, buffers, the consumer's mapping cache
 * and the buffer-kind interface. Nothing here is exported. */
#pragma once

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "clock.h"
#include "gpuipc.h"
#include "hmap.h"
#include "list.h"
#include "macro.h"
#include "proto.h"

#define CLIENT_EVENT_QUEUE_MAX 4096
#define CLIENT_CACHE_MAX_IDLE 256 /* unreferenced mappings kept for re-attach ($GPUIPC_CACHE_MAX) */
#define CLIENT_REPLY_GRACE_MS 1000 /* how much longer we wait than we asked the broker to */

/* How long a request that makes the broker wait for nothing may take: generous, since the broker
 * answers these at once and only a stopped or overloaded one takes longer. */
#define CLIENT_REQUEST_TIMEOUT_MS 10000
#define CLIENT_RETRY_MS 50         /* between connect attempts while the broker is away */

/* How long to wait for the reply to a request that asks the broker to wait up to timeout_ms (-1:
 * for ever): that and a grace, but never less than any request gets, so that a request answered at
 * once (timeout 0: an attach by id, a ring join's parts) is not cut short by a busy machine. */
static inline int client_reply_deadline_ms(int timeout_ms)
{
        if (timeout_ms < 0)
                return -1;
        if (timeout_ms > INT_MAX - CLIENT_REPLY_GRACE_MS)
                return INT_MAX;
        return timeout_ms + CLIENT_REPLY_GRACE_MS > CLIENT_REQUEST_TIMEOUT_MS ? timeout_ms + CLIENT_REPLY_GRACE_MS
                                                                               : CLIENT_REQUEST_TIMEOUT_MS;
}

/* Kind-specific state of memory this process allocated. */
typedef struct KindAlloc {
        int fd;             /* memfd: the memory; cuda-vmm: the exported fd (once exported) */
        bool sealed;
        uint64_t handle;    /* cuda-vmm: CUmemGenericAllocationHandle */
        uint64_t dptr;      /* CUDA device pointer of the data */
        uint64_t reserved;  /* cuda-vmm: size of the reserved VA range */
        uint64_t base;      /* cuda-legacy: allocation base (what the handle exports) */
        uint8_t ipc_handle[PROTO_LEGACY_HANDLE_SIZE];
        bool wrapped;       /* cuda-legacy: the memory belongs to the caller */
} KindAlloc;

/* A consumer's imported memory, shared by every attach of the same buffer and kept (idle) after
 * the last release so that the next attach costs no import. Keyed by buffer id (the producer's key,
 * the same for every broker instance). */
typedef struct Mapping {
        HNode by_id;
        uint64_t id;
        gpuipc_kind_t kind;
        size_t size;
        void *ptr;
        int ordinal;
        bool writable, in_cache, revoked;
        bool broker_mapped; /* the broker knows we hold its fd's mapping (tell it when we drop it) */
        unsigned refs;
        List idle_link;     /* in gpuipc.idle while refs == 0 */
        uint64_t handle, reserved, dptr; /* CUDA: imported handle / VA range / opened pointer */
} Mapping;

struct gpuipc_buffer {
        gpuipc_t *conn;
        bool own;           /* allocated here (producer) or attached (consumer) */
        gpuipc_kind_t kind;
        size_t size;
        void *ptr;
        int ordinal;
        uint64_t id, generation;   /* id: the key the producer drew at allocation, never reused */
        char name[PROTO_MAX_NAME + 1];
        char device[PROTO_MAX_UUID + 1];
        uint8_t *meta;
        size_t meta_len;
        bool writable, revoked;
        /* A view (gpuipc_buffer_view): the bytes [view_offset, view_offset + size) of the memory of
         * segment (producer: this connection's own buffer; consumer: segment_id names the buffer
         * the mapping is of). A view has no memory of its own. */
        gpuipc_buffer_t *segment;
        uint64_t segment_id;
        size_t view_offset;
        /* producer */
        List own_link;
        ProtoState state;   /* as far as we know; NONE before the first publish */
        bool registered;    /* the broker we are connected to knows this id (else publish sends the memory) */
        bool ring_part;     /* part of a ring of ours: registered again by the ring, not as a buffer */
        bool withdrawn;     /* retired by us, not by the caller: a publish that timed out went through */
        bool broker_held;
        bool attrs_fixed;   /* a segment whose writable and broker_held its pool chose */
        unsigned retire_after;
        unsigned n_views;   /* a segment: its views not freed yet */
        struct PoolSegment *pool_seg; /* a segment of a pool (pool.c), else NULL */
        KindAlloc ka;
        /* consumer */
        List attached_link;
        Mapping *map;
        uint32_t owner_uid;        /* the producer's uid, as the attach said: what a reclaim names */
        uint64_t restore_round;    /* the reconnect that last reclaimed this handle's id */
};

typedef struct Subscription {
        List link;
        uint64_t id;        /* what the caller knows it by: stable across reconnects */
        uint64_t broker_id;
        char prefix[PROTO_MAX_NAME + 1];
} Subscription;

/* A received frame, decoded in place. */
typedef struct Frame {
        uint8_t *buf;       /* owned copy of the frame */
        ProtoMsg msg;
        int fd;             /* owned, or -1 */
} Frame;

/* What the transport hands up to the layers above it, which it never calls by name; gpuipc_connect
 * installs them (connect.c). */
/* A request whose reply we stopped waiting for: the reply may still come, and what the broker did
 * must then be undone (the caller was told it failed). */
typedef struct Abandoned {
        uint64_t id;
        ProtoOp op;
} Abandoned;

typedef struct ClientHooks {
        /* An event arrived (a buffer's, a subscription's, a ring's). */
        void (*event)(gpuipc_t *c, const ProtoMsg *ev);
        /* The reply to a request of op we stopped waiting for (client_abandon) arrived after all;
         * with_fd: it carried a file descriptor (dropped: nobody asks for it any more). */
        void (*late_reply)(gpuipc_t *c, ProtoOp op, const ProtoMsg *reply, bool with_fd);
        /* The broker went away: connect again and register everything again, within timeout_ms.
         * 0 or an error. */
        int (*reconnect)(gpuipc_t *c, int timeout_ms);
        /* The frames read by a client_pump were handled: work that needs requests of its own may
         * run now, never from inside event dispatch (the rings renew seats). */
        void (*after_events)(gpuipc_t *c);
} ClientHooks;

typedef struct RingThread RingThread;

struct gpuipc {
        /* Held by every public call that touches the connection (recursive: calls nest), and by the
         * ring thread (ring-thread.c) while it reads the socket or renews seats; a ring's data plane
         * never takes it. */
        pthread_mutex_t lock;
        unsigned lock_depth; /* how deep the holder's calls nest: 1 in the outermost (the caller's) */
        int fd;
        bool broken;        /* the broker went away; the next call reconnects if allowed */
        bool restoring;     /* reconnected, registering what we had again: no nested reconnect */
        /* What gpuipc_fd() returns: an epoll set that stays the same across reconnects, holding the
         * socket, and while the broker is away (with reconnect on) a timer that paces attempts. */
        int epfd, retry_timer;
        uint64_t restore_round;
        char *path;
        char label[PROTO_MAX_LABEL + 1];
        int connect_timeout_ms;
        bool reconnect, probe_gpus;
        uint64_t next_id, epoch, peer_id, next_sub;
        uint64_t pidns;
        bool pidns_same;
        uint32_t n_gpus;
        char gpus[PROTO_MAX_GPUS][PROTO_MAX_UUID + 1];
        char errmsg[PROTO_MAX_TEXT + 1];
        uint8_t *rbuf;
        ProtoBuf wbuf;          /* the request being sent, reused: no allocation per request */
        ProtoBuf nbuf;          /* the same for requests sent without waiting (client_send_nowait) */
        ClientHooks hooks;
        gpuipc_event_t *events; /* ring */
        size_t ev_head, ev_count;
        uint64_t events_lost;
        Abandoned *abandoned;   /* requests we stopped waiting for, on this connection to the broker */
        size_t n_abandoned;
        List own, attached, subs;
        List rings;             /* gpuipc_ring_t.link: rings this connection produces or is a member of */
        List pools;             /* gpuipc_pool_t.link: pools whose segments this connection shares */
        HMap maps_by_id;
        List idle;
        size_t n_idle, max_idle;
        int device_pref;        /* gpuipc_set_device(); -1: the buffer's own device */
        RingThread *ring_thread; /* while the connection has rings */
        /* The ring thread's view of the broker: an epoll set of the socket and the retry timer
         * alone (-1 until it starts), and an eventfd in the set behind gpuipc_fd() that is readable
         * while events it read wait for the caller. */
        int watch_epfd, news_fd;
};

/* ---- the connection's lock ---- */

/* A call from outside the library begins on c (its lock taken, not nested): what gpuipc_errmsg()
 * said about the call before is forgotten, so that a failure never shows an older failure's words.
 * The library's own threads (client_errmsg_sink) leave it alone. */
void client_call_begins(gpuipc_t *c);

static inline gpuipc_t *client_lock(gpuipc_t *c)
{
        if (c) {
                pthread_mutex_lock(&c->lock);
                if (c->lock_depth++ == 0)
                        client_call_begins(c);
        }
        return c;
}

static inline void client_unlock(gpuipc_t *c)
{
        if (c) {
                c->lock_depth--;
                pthread_mutex_unlock(&c->lock);
        }
}

static inline void client_unlockp(gpuipc_t **c)
{
        client_unlock(*c);
}

/* Holds c's lock (c may be NULL) until the end of the scope. */
#define CLIENT_LOCKED(c) _cleanup_(client_unlockp) gpuipc_t *client_locked_ __attribute__((unused)) = client_lock(c)

/* ---- forkgate.c: the library's own threads and fork(2) ---- */

/* A thread of the library's is about to do more than sleep (work, or its start or end, which its
 * creator and its joiner pass the gate for): until forkgate_leave, a fork of the process waits for it,
 * so that the child never inherits a lock (an allocator's) that one of our threads held. Waits while
 * a fork is under way. Never nested, never while waiting for anything unbounded. */
void forkgate_enter(void);
void forkgate_leave(void);

/* ---- transport.c: frames in and out ---- */

/* Sends req (its id is assigned here) with an optional borrowed fd, then waits up to timeout_ms
 * (<0: forever) for the reply; events arriving meanwhile are queued. On success the reply is in
 * *ret (release with frame_free); a reply with a non-zero status becomes its GPUIPC_E_* code,
 * and its message lands in gpuipc_errmsg(). */
int client_request(gpuipc_t *c, ProtoMsg *req, int fd, int timeout_ms, Frame *ret);
void frame_free(Frame *f);

/* Sends req (its id is assigned here) without an fd and without waiting for room or a reply: for
 * what the broker only needs to hear (unmap, the release of a late reference), also from inside
 * an event hook. Dropped when the socket is full or gone. 0 or an error. */
int client_send_nowait(gpuipc_t *c, ProtoMsg *req);

/* Copies a caller's options struct (its first field: size_t struct_size) into dst of dst_size
 * bytes: what the caller's release knew of is taken, the rest stays zero (the defaults), and fields
 * of a later release beyond dst_size are ignored. NULL gives the defaults. 0, or GPUIPC_E_INVALID
 * for a struct_size of 0 (an options struct whose size was never set). */
int client_copy_options(void *dst, size_t dst_size, const void *src);

/* Sets gpuipc_errmsg(), or, in a thread that set a sink of its own, the sink. */
void client_errmsg(gpuipc_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* client_errmsg, then returns err: a public call's refusal says why in the same statement. */
int client_fail(gpuipc_t *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Where the calling thread's messages about c go: c->errmsg, or its sink (PROTO_MAX_TEXT + 1
 * bytes either way). */
char *client_errbuf(gpuipc_t *c);
/* From now on the calling thread's messages go to buf (PROTO_MAX_TEXT + 1 bytes), not to any
 * connection's gpuipc_errmsg(): for the library's own threads, whose work is nobody's call. */
void client_errmsg_sink(char *buf);

/* Checks a name (what: "buffer name", "group name", ...) or, with prefix, a name prefix by the
 * protocol's rules (proto_name_valid) before it is sent, and at most max bytes long (0:
 * PROTO_MAX_NAME). 0, or GPUIPC_E_INVALID with gpuipc_errmsg() saying why. */
int client_check_name(gpuipc_t *c, const char *name, const char *what, bool prefix, size_t max);

/* Records that we stopped waiting for req's reply (what a late success did is undone: the late_reply
 * hook); forgotten when the connection is, since its replies will never come. */
void client_abandon(gpuipc_t *c, const ProtoMsg *req);
void client_forget_abandoned(gpuipc_t *c);

/* Reads and handles whatever is ready, waiting at most timeout_ms for the first frame. */
int client_pump(gpuipc_t *c, int timeout_ms);

/* A deadline timeout_ms from now on monotonic_ms()'s clock (<0: UINT64_MAX, never); the
 * milliseconds left until deadline as poll(2) wants them (-1: forever). The library's one pair:
 * requests and the rings' data plane (which must not call into the transport) both use it. */
static inline uint64_t client_deadline(int timeout_ms)
{
        return timeout_ms < 0 ? UINT64_MAX : monotonic_ms() + (uint64_t)timeout_ms;
}

static inline int client_remaining_ms(uint64_t deadline)
{
        uint64_t now;

        if (deadline == UINT64_MAX)
                return -1;
        now = monotonic_ms();
        return now >= deadline ? 0 : (int)MIN(deadline - now, (uint64_t)INT32_MAX);
}

/* The broker went away: the socket is closed, and with reconnect on a timer wakes gpuipc_fd(). */
void client_mark_broken(gpuipc_t *c);
/* A new socket joins the epoll set behind gpuipc_fd() (and the retry timer stops). */
void client_watch_socket(gpuipc_t *c);
/* Sets up c->watch_epfd and c->news_fd (the ring thread's). 0 or -errno. */
int client_watch_start(gpuipc_t *c);
/* Events were queued where the caller's event loop did not see them arrive: gpuipc_fd() becomes
 * readable (until the queue is empty again: client_news_clear). */
void client_news(gpuipc_t *c);
void client_news_clear(gpuipc_t *c);

/* ---- events.c: the event queue, subscriptions ---- */

/* Queues an event for the caller. */
void client_queue_event(gpuipc_t *c, const gpuipc_event_t *ev);

/* Takes queued events of this type about one of our own buffers (not a subscription's) out of the
 * queue: the caller waited for it another way. */
void client_drop_events(gpuipc_t *c, gpuipc_event_type_t type, uint64_t buffer);

/* Subscriptions keep the id the caller knows; the broker's id changes across a reconnect. */
int client_resubscribe(gpuipc_t *c);
uint64_t client_subscription_id(gpuipc_t *c, uint64_t broker_id);
/* A late subscribe reply: the subscription the caller never got is cancelled. */
void events_on_late_subscribe(gpuipc_t *c, const ProtoMsg *reply);

/* ---- buffer.c ---- */

/* A fresh buffer id: random, non-zero, at most PROTO_MAX_BUFFER_ID (the producer chooses ids so
 * that they survive a broker restart). */
uint64_t client_new_buffer_id(void);
/* A buffer of ours of that kind, not allocated yet: its id drawn, no memory, no device (NULL: out of
 * memory). Every own buffer starts here. */
gpuipc_buffer_t *buffer_new_own(gpuipc_t *c, gpuipc_kind_t kind);

/* A buffer event (the hooks route member events to ring.c). */
void buffer_on_event(gpuipc_t *c, const ProtoMsg *ev);
/* A late attach reply: the reference it took is given back, and the mapping the broker now believes
 * we hold (it sent the fd) is let go as well. */
void buffer_on_late_attach(gpuipc_t *c, const ProtoMsg *reply, bool with_fd);
/* A late publish reply: the publication is withdrawn (retired; freed if the caller freed the buffer
 * meanwhile), and the buffer counts as registered, so that the next publish of it is a publish
 * again. */
void buffer_on_late_publish(gpuipc_t *c, const ProtoMsg *reply);
/* After a reconnect: register own live and retired buffers again (restored), reclaim the references
 * of attached buffers, drop idle cached mappings. 0, or GPUIPC_E_DISCONNECTED if lost again. */
int buffer_after_reconnect(gpuipc_t *c);
void buffer_close_all(gpuipc_t *c);
/* gpuipc_abandon: forgets every buffer and mapping of c without unmapping or freeing their memory
 * and without a CUDA call (the process's exit releases them); own buffers' fds are closed. */
void buffer_abandon_all(gpuipc_t *c);
/* The same for one own buffer that is on none of c's lists (a pool's segment). */
void buffer_abandon(gpuipc_buffer_t *b);
/* Tells the broker to forget an own buffer it knows (forgotten once drained). 0 or an error; a
 * buffer the broker never heard of, or a lost connection, is no error. */
int buffer_unregister(gpuipc_t *c, gpuipc_buffer_t *b);
/* Frees an own buffer's memory and its handle without a word to the broker (the caller said
 * what was needed, or the connection is going). c may be NULL off the connection's thread. */
void buffer_free_local(gpuipc_t *c, gpuipc_buffer_t *b);
/* Drops b whichever end it is: gpuipc_buffer_free for this connection's own, gpuipc_release for an
 * attached one (for the library's own objects that may be either, such as a fence). */
int buffer_drop(gpuipc_t *c, gpuipc_buffer_t *b);

/* ---- pool.c ---- */

/* A view of a pool's segment was freed, or drained: ranges freed while it covered them become free. */
void pool_view_gone(gpuipc_buffer_t *view);
void pool_view_drained(gpuipc_buffer_t *view);
/* A view of a pool's segment is about to be published (again): 0, or GPUIPC_E_INVALID when it
 * drained and its memory was freed since. */
int pool_view_publishing(gpuipc_buffer_t *view);
/* After a reconnect: no broker knows the pools' segments any more (the next view sends their fds). */
void pool_after_reconnect(gpuipc_t *c);
/* Closes every pool of c (gpuipc_close), after the views. */
void pool_close_all(gpuipc_t *c);
/* gpuipc_abandon: forgets every pool of c (torch's hooks no longer find them), leaving their memory
 * mapped. */
void pool_abandon_all(gpuipc_t *c);

/* ---- ring.c ---- */

/* A member-joined or member-left event: the seat is taken or given up at once. */
void ring_on_event(gpuipc_t *c, const ProtoMsg *ev);
/* ClientHooks.after_events: what the rings' events leave to do (seat renewal, evictions the
 * broker must hear of, retired counters) is done by the ring thread, which is woken for it. */
void ring_after_events(gpuipc_t *c);
/* Closes every ring of c (gpuipc_close). */
void ring_close_all(gpuipc_t *c);
/* gpuipc_abandon: marks a producer's rings closed in their control pages (host memory that stays
 * mapped), stops every ring's helper thread and forgets the rings, with no request and no CUDA call
 * (the broker hears of it when the connection drops). */
void ring_abandon_all(gpuipc_t *c);
/* Stops the connection's ring thread (gpuipc_close, without holding the lock). */
void ring_thread_stop(gpuipc_t *c);
/* After a reconnect: producers declare their rings again, members take their seats back. 0, or
 * GPUIPC_E_DISCONNECTED if the broker was lost again. */
int ring_after_reconnect(gpuipc_t *c);

/* ---- kinds ---- */

typedef struct KindOps {
        /* producer: allocate size bytes (on device, for CUDA), setting b->ptr, b->ka, b->device */
        int (*alloc)(gpuipc_t *c, gpuipc_buffer_t *b, size_t size, int device);
        /* producer: before the first publish, produce what travels: an fd (borrowed, owned by b)
         * or the legacy handle in b->ka.ipc_handle */
        int (*export)(gpuipc_t *c, gpuipc_buffer_t *b, bool writable, int *ret_fd);
        /* producer: make prior writes visible to consumers (CUDA: synchronize) */
        int (*sync)(gpuipc_t *c, gpuipc_buffer_t *b);
        /* producer: release the memory */
        void (*free)(gpuipc_t *c, gpuipc_buffer_t *b);
        /* consumer: import what arrived (fd is owned and closed here; legacy reads the reply) */
        int (*import)(gpuipc_t *c, Mapping *m, const ProtoMsg *reply, int fd);
        /* consumer: unmap */
        void (*unmap)(gpuipc_t *c, Mapping *m);
        /* either: copy len bytes between the data at ptr (host or device, on device ordinal)
         * and host memory; to_host says the direction */
        int (*copy)(void *ptr, int ordinal, void *host, size_t len, bool to_host);
} KindOps;

const KindOps *kind_ops(gpuipc_kind_t kind);

/* ---- size-limit.c: how large a buffer may be ---- */

/* Whether a buffer of kind may be size bytes (c may be NULL: a pool's allocation off the connection's
 * thread): 0; GPUIPC_E_INVALID for 0 bytes or more than GPUIPC_MAX_BUFFER_SIZE; -ENOMEM for a memfd
 * buffer larger than size_limit_host_memory(). gpuipc_errmsg() says which. */
int size_limit_check(gpuipc_t *c, gpuipc_kind_t kind, size_t size);
/* The host memory this process may still use: MemAvailable, or less where its cgroup's memory.max
 * leaves less (UINT64_MAX: unknown); *ret_where names which, in words. */
uint64_t size_limit_host_memory(const char **ret_where);
extern const KindOps kind_memfd_ops;
extern const KindOps kind_cuda_vmm_ops;
extern const KindOps kind_cuda_legacy_ops;

/* kind-cuda-vmm.c: whether device ordinal can make cuda-vmm memory and export it; says which
 * capability it lacks, in words (GPUIPC_E_KIND), or what else is wrong with it. */
int cuda_vmm_check(gpuipc_t *c, int ordinal);

/* cuda.c (client/cuda.h): visible GPU UUIDs for hello (0 when CUDA is unavailable). */
uint32_t cuda_visible_gpus(char out[][PROTO_MAX_UUID + 1], uint32_t max);
