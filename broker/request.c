/* Request dispatch: validation, fd checks and policy in front of the registry.
 *
 * What it must never do: let a request reach the registry before hello, with a field out of
 * range, with an fd that is not what its kind needs, or without the policy's consent; or keep an
 * fd it refused (request_handle owns the frame's fd and closes it unless the registry took it). */
#include "request.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "audit.h"
#include "config.h"
#include "inspect.h"
#include "macro.h"
#include "seals.h"
#include "reply.h"
#include "ring.h"

/* A group needs one connection per member: more than the default --max-connections could never
 * complete. */
#define GROUP_MAX_MEMBERS 4096

/* A refusal of the request layer itself (a bad field, the policy, a missing hello): it never reaches
 * the registry, so it has no registry code and is worded here, next to the check that makes it. */
_printf_(5, 6) static void fail(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, unsigned status, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        outbox_send_errorv(ctx->out, p, m->id, status, fmt, ap);
        va_end(ap);
}

/* A wait's timeout: absent is 0 (do not wait); a value past 32 bits is clamped, not refused, since
 * any wait that long is "wait until the broker stops" to the client that asked for it. */
static uint32_t timeout_of(const ProtoMsg *m)
{
        if (!proto_has(m, PF_TIMEOUT_MS))
                return 0;
        return m->timeout_ms > UINT32_MAX ? UINT32_MAX : (uint32_t)m->timeout_ms;
}

/* The policy judges the peer's kernel credentials (SO_PEERCRED), never anything it declared. */
static bool allowed(RequestCtx *ctx, RegPeer *p, PolicyAction action, const char *name)
{
        const PeerCreds *c = registry_peer_creds(p);
        return policy_allows(ctx->policy, c->uid, c->gid, action, name);
}

static PolicyAction op_policy(ProtoOp op);

/* What the policy says to this request on name, under its operation's verb (the table's column). */
static bool op_allowed(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, const char *name)
{
        return allowed(ctx, p, op_policy(m->op), name);
}

/* The kinds of name a request carries, and what each is called when it is not valid. */
typedef enum NameKind { NAME_BUFFER, NAME_GROUP, NAME_PREFIX, NAME_RING } NameKind;

/* Copies a name field into name and checks it by the protocol's rules for its kind (a ring's is a
 * buffer name of at most RING_NAME_MAX bytes); false once the request was answered `invalid`. */
static bool read_name(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, ProtoStr s, NameKind kind,
                      char name[PROTO_MAX_NAME + 1])
{
        static const char *const what[] = { [NAME_BUFFER] = "buffer name", [NAME_GROUP] = "group name",
                                            [NAME_PREFIX] = "name prefix" };
        bool valid = kind == NAME_PREFIX ? proto_prefix_valid(s.ptr, s.len) : proto_name_valid(s.ptr, s.len);

        proto_str_copy(s, name, PROTO_MAX_NAME + 1);
        if (kind == NAME_RING && valid && s.len > RING_NAME_MAX)
                valid = false;
        if (valid)
                return true;
        if (kind == NAME_RING)
                fail(ctx, p, m, PROTO_STATUS_INVALID, "'%s' is not a valid ring name (a buffer name of at most %d "
                     "bytes)", name, RING_NAME_MAX);
        else
                fail(ctx, p, m, PROTO_STATUS_INVALID, "'%s' is not a valid %s", name, what[kind]);
        return false;
}

/* ---- hello and ping ---- */

/* hello: the version first, since a client of another version may mean other things by the same
 * fields; then what the peer declares (label, GPUs, its own PID and /dev/shm), kept for diagnoses
 * and listings only, never for a permission. */
static void handle_hello(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        char label[PROTO_MAX_LABEL + 1];
        char gpus[PROTO_MAX_GPUS][PROTO_MAX_UUID + 1];
        const char *gpu_ptrs[PROTO_MAX_GPUS];
        const PeerCreds *c = registry_peer_creds(p);
        PeerHello h = { 0 };
        ReplyRequest rq;
        ProtoMsg r;
        int e;

        if (m->version != PROTO_VERSION) {
                fail(ctx, p, m, PROTO_STATUS_VERSION, "this broker speaks protocol version %d, the client %llu",
                     PROTO_VERSION, (unsigned long long)m->version);
                return;
        }
        for (uint32_t i = 0; i < m->n_gpus; i++)
                gpu_ptrs[i] = proto_str_copy(m->gpus[i], gpus[i], sizeof(gpus[i]));
        h.pid = m->pid;
        h.pidns = m->pidns;
        h.shm_dev = m->shm_dev;
        h.shm_ino = m->shm_ino;
        h.label = proto_str_copy(m->label, label, sizeof(label));
        h.n_gpus = m->n_gpus;
        h.gpus = gpu_ptrs;
        reply_request_init(&rq, ctx->out, p, m->id);
        e = registry_peer_hello(ctx->reg, p, &h, &rq.why);
        if (e != 0) {
                reply_request_done(&rq, e);
                return;
        }

        /* The reply tells the client how the broker sees it: that is what a doctor needs. */
        proto_reply_init(&r, m->id, PROTO_STATUS_OK);
        proto_set_version(&r, PROTO_VERSION);
        proto_set_peer(&r, registry_peer_id(p));
        proto_set_epoch(&r, registry_epoch(ctx->reg));
        proto_set_pid(&r, c->pid);
        proto_set_uid(&r, c->uid);
        proto_set_gid(&r, c->gid);
        proto_set_pidns(&r, ctx->broker_pidns);
        proto_set_pidns_same(&r, ctx->broker_pidns && (c->pidns ? c->pidns : m->pidns) == ctx->broker_pidns);
        proto_set_label(&r, proto_str("gpuipc-broker " GPUIPC_VERSION));
        outbox_send(ctx->out, p, &r, -1);
}

/* ping: answered here, without the registry; the epoch tells a client whether the broker it talks
 * to is the one it registered with. */
static void handle_ping(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        ProtoMsg r;

        proto_reply_init(&r, m->id, PROTO_STATUS_OK);
        proto_set_epoch(&r, registry_epoch(ctx->reg));
        outbox_send(ctx->out, p, &r, -1);
}

/* ---- publish ---- */

/* A memfd must be sealed so nobody can shrink it under a consumer's mapping (SIGBUS) and must
 * be exactly the announced size; a read-only buffer must be sealed against new writable mappings,
 * since any holder of the fd could otherwise reopen it read-write through /proc. */
static const char *check_memfd(int fd, uint64_t size, bool writable)
{
        struct stat st;
        int seals, need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                return "the fd is not a memfd";
        seals = fcntl(fd, F_GET_SEALS);
        if (seals < 0)
                return "the fd is not a memfd (it cannot carry seals)";
        if ((uint64_t)st.st_size != size)
                return "the memfd's size differs from the size the publish announces";
        if (!writable)
                need |= F_SEAL_FUTURE_WRITE;
        if ((seals & need) != need)
                return writable ? "the memfd lacks F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL"
                                : "a read-only memfd also needs F_SEAL_FUTURE_WRITE (seal after mapping it)";
        if (writable && (fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDWR)
                return "a writable buffer must be sent as a read-write fd";
        return NULL;
}

/* What travels with a CUDA VMM buffer is the driver's own fd; the broker cannot look inside it,
 * but it refuses sockets (fd-passing loops) and the obviously wrong file types. */
static const char *check_opaque_fd(int fd)
{
        struct stat st;

        if (fstat(fd, &st) < 0)
                return "the fd cannot be inspected";
        if (S_ISSOCK(st.st_mode) || S_ISDIR(st.st_mode) || S_ISFIFO(st.st_mode))
                return "sockets, directories and pipes are never accepted as buffer fds";
        return NULL;
}

/* Checks a view's publish (it names a range of a segment: `segment`, `offset`, `size`): the
 * segment's memory comes with it only the first time (its fd and segment_size); returns a reason
 * or NULL. The range is checked against the segment by the registry, which knows its size. */
static const char *check_view(const ProtoMsg *m, int fd, unsigned *ret_status)
{
        *ret_status = PROTO_STATUS_INVALID;
        if (m->segment == 0 || m->segment > PROTO_MAX_BUFFER_ID)
                return "segment ids are between 1 and 2^53 - 1";
        if (proto_has(m, PF_BUFFER) && m->buffer == m->segment)
                return "a view is a buffer of its own: its id differs from its segment's";
        if (m->offset > UINT64_MAX - m->size)
                return "offset + size overflows";
        *ret_status = PROTO_STATUS_KIND;
        if (m->kind != PROTO_KIND_MEMFD && m->kind != PROTO_KIND_CUDA_VMM)
                return "views are ranges of memfd or cuda-vmm segments";
        *ret_status = PROTO_STATUS_INVALID;
        if (proto_has(m, PF_HANDLE))
                return "a view travels as its segment's fd, not as a handle";
        if (m->kind != PROTO_KIND_MEMFD && (!proto_has(m, PF_DEVICE) || m->device.len == 0))
                return "CUDA buffers need the UUID of their device";
        *ret_status = PROTO_STATUS_BAD_REQUEST;
        if (fd < 0)
                return proto_has(m, PF_SEGMENT_SIZE) ? "segment_size comes with the segment's fd" : NULL;
        if (!proto_has(m, PF_SEGMENT_SIZE) || m->segment_size == 0)
                return "the segment's fd comes with its segment_size";
        *ret_status = PROTO_STATUS_BAD_FD;
        return m->kind == PROTO_KIND_MEMFD ? check_memfd(fd, m->segment_size, m->writable) : check_opaque_fd(fd);
}

/* Checks the kind-specific rules of a new publish; returns a reason or NULL. */
static const char *check_new_buffer(const ProtoMsg *m, int fd, unsigned *ret_status)
{
        *ret_status = PROTO_STATUS_BAD_REQUEST;
        if (!proto_has(m, PF_KIND) || !proto_has(m, PF_SIZE))
                return "publishing new memory needs kind and size";
        *ret_status = PROTO_STATUS_INVALID;
        if (m->size == 0)
                return "size must be greater than zero";
        if (proto_has(m, PF_SEGMENT))
                return check_view(m, fd, ret_status);
        *ret_status = PROTO_STATUS_BAD_REQUEST;
        if (proto_has(m, PF_SEGMENT_SIZE))
                return "segment_size belongs to a view (with segment)";
        *ret_status = PROTO_STATUS_INVALID;
        if (m->kind != PROTO_KIND_CUDA_LEGACY && m->offset)
                return "offset is only meaningful for cuda-legacy and views";
        if (m->kind != PROTO_KIND_CUDA_LEGACY && proto_has(m, PF_HANDLE))
                return "a handle is only for cuda-legacy; a memfd or cuda-vmm buffer travels as its fd";
        if (m->offset > UINT64_MAX - m->size)
                return "offset + size overflows";
        if (m->kind != PROTO_KIND_MEMFD && (!proto_has(m, PF_DEVICE) || m->device.len == 0))
                return "CUDA buffers need the UUID of their device";
        *ret_status = PROTO_STATUS_BAD_FD;
        switch (m->kind) {
        case PROTO_KIND_MEMFD:
                if (fd < 0)
                        return "a memfd buffer needs its fd attached to the publish";
                return check_memfd(fd, m->size, m->writable);
        case PROTO_KIND_CUDA_VMM:
                return fd < 0 ? "a cuda-vmm buffer needs its exported fd attached to the publish" : check_opaque_fd(fd);
        case PROTO_KIND_CUDA_LEGACY:
                if (fd >= 0)
                        return "a cuda-legacy buffer travels as its 64-byte handle, not as an fd";
                *ret_status = PROTO_STATUS_BAD_REQUEST;
                if (!proto_has(m, PF_HANDLE))
                        return "a cuda-legacy publish needs the 64-byte handle";
                *ret_status = PROTO_STATUS_KIND;
                if (m->broker_held)
                        return "cuda-legacy memory dies with its producer, so it cannot be broker-held; publish "
                               "it as cuda-vmm for a lifetime owned by the broker";
                return NULL;
        default:
                *ret_status = PROTO_STATUS_INVALID;
                return "unknown kind";
        }
}

/* Reads the fields of a publish into a. Returns NULL, or why the request is wrong (with *status). */
static const char *read_publish(const ProtoMsg *m, int fd, RegPublish *a, unsigned *status)
{
        bool restored = proto_has(m, PF_RESTORED) && m->restored;

        *status = PROTO_STATUS_INVALID;
        if (m->retire_after > UINT32_MAX)
                return "retire_after is at most 4294967295";
        if (proto_has(m, PF_BUFFER) && (m->buffer == 0 || m->buffer > PROTO_MAX_BUFFER_ID))
                return "buffer ids are between 1 and 2^53 - 1; leave buffer out to let the broker pick one";
        /* Without a kind, a publish puts a registered idle buffer back under a name. */
        a->again = !proto_has(m, PF_KIND);
        if (a->again) {
                *status = PROTO_STATUS_BAD_REQUEST;
                if (!proto_has(m, PF_BUFFER))
                        return "publish needs kind and size for new memory, or buffer to publish an idle buffer again";
                if (restored)
                        return "restored applies to new memory (with kind and size)";
                *status = PROTO_STATUS_BAD_FD;
                if (fd >= 0)
                        return "publishing a registered buffer again sends no fd";
                return NULL;
        }
        if (restored) {
                *status = PROTO_STATUS_BAD_REQUEST;
                if (!proto_has(m, PF_BUFFER) || !proto_has(m, PF_GENERATION))
                        return "a restored buffer needs the buffer id and generation it had";
                if (proto_has(m, PF_STATE) && m->state != PROTO_STATE_LIVE && m->state != PROTO_STATE_RETIRED)
                        return "a restored buffer is live or retired";
        } else if (proto_has(m, PF_STATE) || proto_has(m, PF_GENERATION)) {
                *status = PROTO_STATUS_BAD_REQUEST;
                return "state and generation are only given with restored";
        }
        a->restored = restored;
        a->generation = m->generation;
        a->retired = restored && proto_has(m, PF_STATE) && m->state == PROTO_STATE_RETIRED;
        return check_new_buffer(m, fd, status);
}

/* Copies what describes the memory from a publish (or ring-part) into a; takes *fd. device is
 * where the device UUID is copied to. */
static void fill_memory(const ProtoMsg *m, int *fd, RegPublish *a, char device[PROTO_MAX_UUID + 1])
{
        a->buffer = m->buffer;
        proto_buffer_info_read(m, &a->info);
        a->device = proto_has(m, PF_DEVICE) ? proto_str_copy(m->device, device, PROTO_MAX_UUID + 1) : NULL;
        /* An empty map is a request too: publishing again with it clears the metadata. */
        a->has_meta = proto_has(m, PF_META);
        if (a->has_meta && m->meta.count) {
                a->meta = m->meta.ptr;
                a->meta_len = m->meta.len;
        }
        a->handle = proto_has(m, PF_HANDLE) ? (const uint8_t *)m->handle.ptr : NULL;
        a->fd = steal_fd(*fd);
        a->retire_after = (uint32_t)m->retire_after;
        a->segment_size = m->segment_size;
}

/* publish: the name and the policy first, then the fd's seals and size, and only then the registry:
 * a buffer the registry takes has passed every check that does not depend on its state. */
static void handle_publish(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        char name[PROTO_MAX_NAME + 1], device[PROTO_MAX_UUID + 1];
        RegPublish a = { 0 };
        ReplyRequest rq;
        unsigned status;
        const char *why;

        if (!read_name(ctx, p, m, m->name, NAME_BUFFER, name))
                return;
        if (!op_allowed(ctx, p, m, name)) {
                fail(ctx, p, m, PROTO_STATUS_DENIED, "the policy does not let uid %u publish '%s'",
                     registry_peer_creds(p)->uid, name);
                return;
        }
        why = read_publish(m, *fd, &a, &status);
        if (why) {
                fail(ctx, p, m, status, "%s", why);
                return;
        }
        a.name = name;
        fill_memory(m, fd, &a, device);
        reply_request_init(&rq, ctx->out, p, m->id);
        reply_request_done(&rq, registry_publish(ctx->reg, p, &a, &rq.why, &rq.sink));
}

/* ---- attach, release, retire, free ---- */

/* attach by name (which may wait for a publish) or by id (which never waits): the policy is checked
 * on the buffer's own name, so an id gives no way around it. */
static void handle_attach(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        char copy[PROTO_MAX_NAME + 1];
        bool by_name = proto_has(m, PF_NAME), by_id = proto_has(m, PF_BUFFER);
        RegBuffer *b = NULL;
        ReplyRequest rq;
        const char *name;

        reply_request_init(&rq, ctx->out, p, m->id);
        if (by_name == by_id) {
                fail(ctx, p, m, PROTO_STATUS_BAD_REQUEST, "attach takes either a name or a buffer id");
                return;
        }
        if (by_name) {
                if (!read_name(ctx, p, m, m->name, NAME_BUFFER, copy))
                        return;
                name = copy;
        } else {
                /* Looked up once: the policy judges the name of the very buffer the attach takes. */
                if (registry_request_buffer(ctx->reg, m->buffer, &b, &rq.why)) {
                        reply_request_done(&rq, rq.why.code);
                        return;
                }
                name = registry_buffer_name(b);
        }
        if (!op_allowed(ctx, p, m, name)) {
                fail(ctx, p, m, PROTO_STATUS_DENIED, "the policy does not let uid %u attach '%s'",
                     registry_peer_creds(p)->uid, name);
                return;
        }
        if (b)
                reply_request_done(&rq, registry_buffer_attach(ctx->reg, p, b, &rq.why, &rq.sink));
        else
                reply_request_done(&rq, registry_attach(ctx->reg, p, m->id, name, 0, timeout_of(m), ctx->now_ms,
                                                        &rq.why, &rq.sink));
}

/* ---- rings ---- */

#define RING_LEASE_DEFAULT_MS 2000

/* Copies and checks a ring's name and asks the policy; false once answered. */
static bool ring_name(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, char name[PROTO_MAX_NAME + 1])
{
        PolicyAction action = op_policy(m->op);

        if (!read_name(ctx, p, m, m->name, NAME_RING, name))
                return false;
        if (!allowed(ctx, p, action, name)) {
                fail(ctx, p, m, PROTO_STATUS_DENIED, "the policy does not let uid %u %s ring '%s'",
                     registry_peer_creds(p)->uid, action == POLICY_PUBLISH ? "produce" : "join", name);
                return false;
        }
        return true;
}

/* ring-create: the ring's shape is bounded here (slots, members, sizes), before the registry
 * allocates the ring and its seat table for it. */
static void handle_ring_create(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        char name[PROTO_MAX_NAME + 1], device[PROTO_MAX_UUID + 1];
        uint64_t epochs[RING_MAX_MEMBERS] = { 0 };
        RegRingSpec s = { 0 };
        ReplyRequest rq;

        if (!ring_name(ctx, p, m, name))
                return;
        if (m->kind == PROTO_KIND_CUDA_LEGACY) {
                fail(ctx, p, m, PROTO_STATUS_KIND, "ring slots are memfd or cuda-vmm: cuda-legacy memory dies with "
                     "its producer");
                return;
        }
        if (m->size == 0 || m->slots == 0 || m->slots > RING_MAX_SLOTS || m->members == 0 ||
            m->members > RING_MAX_MEMBERS) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "a ring has a slot size above 0, 1 to %d slots and 1 to %d "
                     "member seats", RING_MAX_SLOTS, RING_MAX_MEMBERS);
                return;
        }
        /* Latest mode: every member may hold a slot and the newest frame must stay readable, and the
         * producer still needs one to write. */
        if (m->mode == PROTO_MODE_LATEST && m->slots < m->members + 2) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "a latest-frame ring with %llu member seats needs at least %llu "
                     "slots", (unsigned long long)m->members, (unsigned long long)m->members + 2);
                return;
        }
        if (m->mode == PROTO_MODE_STREAM && m->kind != PROTO_KIND_CUDA_VMM) {
                fail(ctx, p, m, PROTO_STATUS_KIND, "a stream-ordered ring has cuda-vmm slots");
                return;
        }
        if (m->kind == PROTO_KIND_CUDA_VMM && (!proto_has(m, PF_DEVICE) || m->device.len == 0)) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "CUDA slots need the UUID of their device");
                return;
        }
        s.name = name;
        s.kind = m->kind;
        s.slot_size = m->size;
        s.n_slots = (uint32_t)m->slots;
        s.n_members = (uint32_t)m->members;
        s.mode = m->mode;
        s.lease_ms = proto_has(m, PF_TIMEOUT_MS) ? timeout_of(m) : RING_LEASE_DEFAULT_MS;
        s.device = proto_has(m, PF_DEVICE) ? proto_str_copy(m->device, device, sizeof(device)) : NULL;
        if (proto_has(m, PF_RESTORED) && m->restored) {
                /* The seats its producer still counts as seated: items of {index, generation}. */
                ProtoIter it;
                ProtoMsg rec;
                int e;

                s.restored = true;
                s.next_epoch = m->generation;
                s.epochs = epochs;
                proto_iter_init(&it, &m->items);
                while ((e = proto_iter_next(&it, &rec)) == 1) {
                        if (rec.index >= s.n_members || rec.generation == 0 || rec.generation >= s.next_epoch + 1) {
                                fail(ctx, p, m, PROTO_STATUS_INVALID, "a restored ring's seats have an index below its "
                                     "member count and an epoch from 1 to its generation");
                                return;
                        }
                        epochs[rec.index] = rec.generation;
                }
                if (e < 0) {
                        fail(ctx, p, m, PROTO_STATUS_BAD_REQUEST, "the seats of a restored ring are records of index "
                             "and generation");
                        return;
                }
        }
        reply_request_init(&rq, ctx->out, p, m->id);
        reply_request_done(&rq, registry_ring_create(ctx->reg, p, &s, &rq.why, &rq.sink));
}

/* ring-part: a part is published like a buffer (its fd checked the same way) but under the ring's
 * name, so the policy on the ring covers its parts. */
static void handle_ring_part(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        char name[PROTO_MAX_NAME + 1], device[PROTO_MAX_UUID + 1];
        RegPublish a = { 0 };
        ReplyRequest rq;
        unsigned status;
        const char *why;

        if (!ring_name(ctx, p, m, name))
                return;
        if (m->index > UINT32_MAX || (proto_has(m, PF_BUFFER) && (m->buffer == 0 || m->buffer > PROTO_MAX_BUFFER_ID))) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "a part index is 32-bit and a buffer id between 1 and 2^53 - 1");
                return;
        }
        if (proto_has(m, PF_SEGMENT)) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "a ring's parts are memory of their own, not views");
                return;
        }
        why = check_new_buffer(m, *fd, &status);
        if (why) {
                fail(ctx, p, m, status, "%s", why);
                return;
        }
        fill_memory(m, fd, &a, device);
        a.restored = proto_has(m, PF_RESTORED) && m->restored;
        a.generation = m->generation;
        reply_request_init(&rq, ctx->out, p, m->id);
        reply_request_done(&rq, registry_ring_part(ctx->reg, p, name, (uint32_t)m->index, &a, &rq.why, &rq.sink));
}

/* ring-join (or, restored, a seat taken back), ring-leave, ring-evict and ring-close. */
static void handle_ring(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        char name[PROTO_MAX_NAME + 1];
        ReplyRequest rq;
        int e;

        if (!ring_name(ctx, p, m, name))
                return;
        reply_request_init(&rq, ctx->out, p, m->id);
        switch (m->op) {
        case PROTO_OP_RING_JOIN:
                if (!(proto_has(m, PF_RESTORED) && m->restored)) {
                        e = registry_ring_join(ctx->reg, p, name, &rq.why, &rq.sink);
                        break;
                }
                if (!proto_has(m, PF_INDEX) || !proto_has(m, PF_GENERATION) || m->index > UINT32_MAX) {
                        fail(ctx, p, m, PROTO_STATUS_BAD_REQUEST, "taking a seat back needs its index and generation");
                        return;
                }
                e = registry_ring_rejoin(ctx->reg, p, name, (uint32_t)m->index, m->generation, &rq.why, &rq.sink);
                break;
        case PROTO_OP_RING_LEAVE:
                e = registry_ring_leave(ctx->reg, p, name, &rq.why, &rq.sink);
                break;
        case PROTO_OP_RING_EVICT:
                if (m->index > UINT32_MAX) {
                        fail(ctx, p, m, PROTO_STATUS_INVALID, "a seat index is 32-bit");
                        return;
                }
                e = registry_ring_evict(ctx->reg, p, name, (uint32_t)m->index, m->generation, &rq.why, &rq.sink);
                break;
        default:
                e = registry_ring_close(ctx->reg, p, name, &rq.why, &rq.sink);
                break;
        }
        reply_request_done(&rq, e);
}

/* reclaim: after a broker restart, a consumer asks back the references it held; the counts are
 * bounded here, and the registry decides whether the publication is still the one it held. */
static void handle_reclaim(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        char name[PROTO_MAX_NAME + 1];
        const RegBuffer *b = registry_buffer_by_id(ctx->reg, m->buffer);
        RegReclaim a = { 0 };
        ReplyRequest rq;

        if (!read_name(ctx, p, m, m->name, NAME_BUFFER, name))
                return;
        if (m->refs == 0 || m->refs > UINT32_MAX || m->uid > UINT32_MAX) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "a reclaim names 1 to 4294967295 references and a 32-bit uid");
                return;
        }
        /* The name the buffer really has, once registered; until then the one the consumer held it
         * under (the registry checks that the two agree when the producer comes back). */
        if (!op_allowed(ctx, p, m, b ? registry_buffer_name(b) : name)) {
                fail(ctx, p, m, PROTO_STATUS_DENIED, "the policy does not let uid %u attach '%s'",
                     registry_peer_creds(p)->uid, b ? registry_buffer_name(b) : name);
                return;
        }
        a.buffer = m->buffer;
        a.generation = m->generation;
        a.refs = (uint32_t)m->refs;
        a.owner_uid = (uint32_t)m->uid;
        a.name = name;
        a.kind = m->kind;
        reply_request_init(&rq, ctx->out, p, m->id);
        reply_request_done(&rq, registry_reclaim(ctx->reg, p, &a, &rq.why, &rq.sink));
}

/* Retire and free: the buffer is looked up once, for the policy's admin check (may this peer
 * manage buffers of other uids?) and for the operation. */
static void handle_retire_free(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        ReplyRequest rq;
        bool as_admin;
        RegBuffer *b;
        int e;

        reply_request_init(&rq, ctx->out, p, m->id);
        e = registry_request_buffer(ctx->reg, m->buffer, &b, &rq.why);
        if (e == 0) {
                as_admin = op_allowed(ctx, p, m, registry_buffer_name(b));
                if (m->op == PROTO_OP_RETIRE)
                        e = registry_buffer_retire(ctx->reg, p, b, as_admin, &rq.why, &rq.sink);
                else
                        e = registry_buffer_free(ctx->reg, p, b, as_admin, &rq.why, &rq.sink);
        }
        reply_request_done(&rq, e);
}

/* ---- dispatch ---- */

/* subscribe: the policy judges the prefix, so a subscriber hears only of names it may watch. */
static void handle_subscribe(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        char prefix[PROTO_MAX_NAME + 1];
        ReplyRequest rq;

        if (!read_name(ctx, p, m, m->prefix, NAME_PREFIX, prefix))
                return;
        if (!op_allowed(ctx, p, m, prefix)) {
                fail(ctx, p, m, PROTO_STATUS_DENIED, "the policy does not let uid %u watch '%s'",
                     registry_peer_creds(p)->uid, prefix);
                return;
        }
        reply_request_init(&rq, ctx->out, p, m->id);
        reply_request_done(&rq, registry_subscribe(ctx->reg, p, prefix, &rq.why, &rq.sink));
}

/* group-join: a timeout is required, since a group whose last member never comes would otherwise
 * hold its members' waits until the broker stops. */
static void handle_group_join(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        char group[PROTO_MAX_NAME + 1];
        ReplyRequest rq;

        if (!read_name(ctx, p, m, m->group, NAME_GROUP, group))
                return;
        if (m->members == 0 || m->members > GROUP_MAX_MEMBERS) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "a group has 1 to %d members", GROUP_MAX_MEMBERS);
                return;
        }
        if (!proto_has(m, PF_TIMEOUT_MS) || m->timeout_ms == 0) {
                fail(ctx, p, m, PROTO_STATUS_BAD_REQUEST, "group-join needs a timeout_ms above zero");
                return;
        }
        /* Joining tells the other members who is ready and holds them up until the deadline: as
         * for subscriptions, the group's name must be one this peer may attach. */
        if (!op_allowed(ctx, p, m, group)) {
                fail(ctx, p, m, PROTO_STATUS_DENIED, "the policy does not let uid %u join group '%s'",
                     registry_peer_creds(p)->uid, group);
                return;
        }
        reply_request_init(&rq, ctx->out, p, m->id);
        reply_request_done(&rq, registry_group_join(ctx->reg, p, m->id, group, (uint32_t)m->members, timeout_of(m),
                                                    ctx->now_ms, &rq.why, &rq.sink));
}

/* Operations that are one registry call, and the read-only views (inspect.c). */
static void handle_release(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        ReplyRequest rq;

        reply_request_init(&rq, ctx->out, p, m->id);
        reply_request_done(&rq, registry_release(ctx->reg, p, m->buffer, &rq.why, &rq.sink));
}

static void handle_unmap(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        ReplyRequest rq;

        reply_request_init(&rq, ctx->out, p, m->id);
        reply_request_done(&rq, registry_unmap(ctx->reg, p, m->buffer, &rq.why, &rq.sink));
}

static void handle_unsubscribe(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        ReplyRequest rq;

        reply_request_init(&rq, ctx->out, p, m->id);
        reply_request_done(&rq, registry_unsubscribe(ctx->reg, p, m->sub, &rq.why, &rq.sink));
}

#define INSPECT(fn)                                                                     \
        static void handle_##fn(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd) \
        {                                                                               \
                inspect_##fn(ctx, p, m);                                                \
        }
INSPECT(list)
INSPECT(stat)
INSPECT(peers)
INSPECT(stats)
INSPECT(rings)
INSPECT(ring_stat)
#undef INSPECT

/* Every operation with its rules: the columns are checked here, in this order, before its handler
 * runs (docs/protocol.md 6.0): an fd on an operation that carries none is refused first, then
 * anything but hello and ping before hello. The policy verb is the one the handler asks for on the
 * name it resolves (ring-leave is the producer's verb, as ring management; retire and free ask
 * admin only to tell whether the peer manages other uids' buffers; the listings filter by attach
 * themselves, in inspect.c). */
typedef struct OpRule {
        void (*handle)(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd);
        bool before_hello; /* allowed before hello */
        bool carries_fd;   /* may carry an fd */
        PolicyAction policy; /* 0: asks the policy nothing here */
} OpRule;

static const OpRule op_rules[_PROTO_OP_MAX] = {
        [PROTO_OP_HELLO] = { handle_hello, .before_hello = true },
        [PROTO_OP_PING] = { handle_ping, .before_hello = true },
        [PROTO_OP_PUBLISH] = { handle_publish, .carries_fd = true, .policy = POLICY_PUBLISH },
        [PROTO_OP_ATTACH] = { handle_attach, .policy = POLICY_ATTACH },
        [PROTO_OP_RELEASE] = { handle_release },
        [PROTO_OP_RETIRE] = { handle_retire_free, .policy = POLICY_ADMIN },
        [PROTO_OP_FREE] = { handle_retire_free, .policy = POLICY_ADMIN },
        [PROTO_OP_SUBSCRIBE] = { handle_subscribe, .policy = POLICY_ATTACH },
        [PROTO_OP_UNSUBSCRIBE] = { handle_unsubscribe },
        [PROTO_OP_GROUP_JOIN] = { handle_group_join, .policy = POLICY_ATTACH },
        [PROTO_OP_UNMAP] = { handle_unmap },
        [PROTO_OP_RECLAIM] = { handle_reclaim, .policy = POLICY_ATTACH },
        [PROTO_OP_RING_CREATE] = { handle_ring_create, .policy = POLICY_PUBLISH },
        [PROTO_OP_RING_PART] = { handle_ring_part, .carries_fd = true, .policy = POLICY_PUBLISH },
        [PROTO_OP_RING_JOIN] = { handle_ring, .policy = POLICY_ATTACH },
        [PROTO_OP_RING_LEAVE] = { handle_ring, .policy = POLICY_PUBLISH },
        [PROTO_OP_RING_EVICT] = { handle_ring, .policy = POLICY_PUBLISH },
        [PROTO_OP_RING_CLOSE] = { handle_ring, .policy = POLICY_PUBLISH },
        [PROTO_OP_LIST] = { handle_list },
        [PROTO_OP_STAT] = { handle_stat },
        [PROTO_OP_PEERS] = { handle_peers },
        [PROTO_OP_STATS] = { handle_stats },
        [PROTO_OP_RINGS] = { handle_rings },
        [PROTO_OP_RING_STAT] = { handle_ring_stat },
};

/* An op this broker has no rule for is unknown-op, so a newer client can tell "not supported" from
 * a refusal. */
static const OpRule *op_rule(ProtoOp op)
{
        return op < _PROTO_OP_MAX && op_rules[op].handle ? &op_rules[op] : NULL;
}

static PolicyAction op_policy(ProtoOp op)
{
        const OpRule *rule = op_rule(op);
        return rule ? rule->policy : 0;
}

static void handle_checked(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd);

/* Each request is an audit record (broker/audit.h): opened here, completed by its reply. */
bool request_handle(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int fd)
{
        _cleanup_close_ int owned_fd = fd;

        audit_request_begin(ctx->reg, p, m);
        handle_checked(ctx, p, m, &owned_fd);
        return audit_request_end();
}

static void handle_checked(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *owned_fd)
{
        const OpRule *rule = op_rule(m->op);

        if (*owned_fd >= 0 && !(rule && rule->carries_fd)) {
                fail(ctx, p, m, PROTO_STATUS_BAD_FD, "only publish and ring-part carry an fd; '%s' does not",
                     proto_op_name(m->op));
                return;
        }
        if (rule && !rule->before_hello && !registry_peer_said_hello(p)) {
                fail(ctx, p, m, PROTO_STATUS_HELLO_FIRST, "send hello before '%s'", proto_op_name(m->op));
                return;
        }
        if (!rule) {
                if (!registry_peer_said_hello(p)) {
                        fail(ctx, p, m, PROTO_STATUS_HELLO_FIRST, "send hello before '%s'", proto_op_name(m->op));
                        return;
                }
                fail(ctx, p, m, PROTO_STATUS_UNKNOWN_OP, "this broker does not know that operation");
                return;
        }
        rule->handle(ctx, p, m, owned_fd);
}
