/* Request dispatch: validation, fd checks and policy in front of the registry. */
#include "request.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "inspect.h"
#include "macro.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

#define GROUP_MAX_MEMBERS 4096

void request_reply_error(Outbox *out, RegPeer *p, uint64_t id, unsigned status, const char *message)
{
        ProtoMsg m = { 0 };

        m.reply = id;
        m.status = status;
        m.error = proto_str(proto_status_name(status));
        m.message = proto_str(message);
        m.has = PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS) | PROTO_BIT(PF_ERROR) | PROTO_BIT(PF_MESSAGE);
        outbox_send(out, p, &m, -1);
}

_printf_(5, 6) static void fail(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, unsigned status, const char *fmt, ...)
{
        char text[PROTO_MAX_TEXT + 1];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(text, sizeof(text), fmt, ap);
        va_end(ap);
        text[proto_utf8_trim(text, strlen(text))] = 0; /* a cut may split a character */
        request_reply_error(ctx->out, p, m->id, status, text);
}

static uint32_t timeout_of(const ProtoMsg *m)
{
        if (!proto_has(m, PF_TIMEOUT_MS))
                return 0;
        return m->timeout_ms > UINT32_MAX ? UINT32_MAX : (uint32_t)m->timeout_ms;
}

static bool allowed(RequestCtx *ctx, RegPeer *p, PolicyAction action, const char *name)
{
        const PeerCreds *c = registry_peer_creds(p);
        return policy_allows(ctx->policy, c->uid, c->gid, action, name);
}

/* ---- hello and ping ---- */

static void handle_hello(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        char label[PROTO_MAX_LABEL + 1];
        char gpus[PROTO_MAX_GPUS][PROTO_MAX_UUID + 1];
        const char *gpu_ptrs[PROTO_MAX_GPUS];
        const PeerCreds *c = registry_peer_creds(p);
        PeerHello h = { 0 };
        ProtoMsg r = { 0 };
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
        h.label = proto_str_copy(m->label, label, sizeof(label));
        h.n_gpus = m->n_gpus;
        h.gpus = gpu_ptrs;
        e = registry_peer_hello(ctx->reg, p, &h);
        if (e == PROTO_STATUS_STATE) {
                fail(ctx, p, m, PROTO_STATUS_STATE, "hello was already received on this connection");
                return;
        }
        if (e < 0) {
                registry_peer_mark_lost(p);
                return;
        }

        /* The reply tells the client how the broker sees it: that is what a doctor needs. */
        r.reply = m->id;
        r.status = PROTO_STATUS_OK;
        r.version = PROTO_VERSION;
        r.peer = registry_peer_id(p);
        r.epoch = registry_epoch(ctx->reg);
        r.pid = c->pid;
        r.uid = c->uid;
        r.gid = c->gid;
        r.pidns = ctx->broker_pidns;
        r.pidns_same = ctx->broker_pidns && (c->pidns ? c->pidns : m->pidns) == ctx->broker_pidns;
        r.label = proto_str("gpuipc-broker " GPUIPC_VERSION);
        r.has = PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS) | PROTO_BIT(PF_VERSION) | PROTO_BIT(PF_PEER) |
                PROTO_BIT(PF_EPOCH) | PROTO_BIT(PF_PID) | PROTO_BIT(PF_UID) | PROTO_BIT(PF_GID) |
                PROTO_BIT(PF_PIDNS) | PROTO_BIT(PF_PIDNS_SAME) | PROTO_BIT(PF_LABEL);
        outbox_send(ctx->out, p, &r, -1);
}

static void handle_ping(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        ProtoMsg r = { 0 };

        r.reply = m->id;
        r.status = PROTO_STATUS_OK;
        r.epoch = registry_epoch(ctx->reg);
        r.has = PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS) | PROTO_BIT(PF_EPOCH);
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

/* Checks the kind-specific rules of a new publish; returns a reason or NULL. */
static const char *check_new_buffer(const ProtoMsg *m, int fd, unsigned *ret_status)
{
        *ret_status = PROTO_STATUS_BAD_REQUEST;
        if (!proto_has(m, PF_KIND) || !proto_has(m, PF_SIZE))
                return "publishing new memory needs kind and size";
        *ret_status = PROTO_STATUS_INVALID;
        if (m->size == 0)
                return "size must be greater than zero";
        if (m->kind != PROTO_KIND_CUDA_LEGACY && m->offset)
                return "offset is only meaningful for cuda-legacy";
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

static void handle_publish(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int *fd)
{
        char name[PROTO_MAX_NAME + 1], device[PROTO_MAX_UUID + 1];
        RegPublish a = { 0 };
        unsigned status;
        const char *why;

        proto_str_copy(m->name, name, sizeof(name));
        if (!registry_name_valid(m->name.ptr, m->name.len)) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "'%s' is not a valid buffer name", name);
                return;
        }
        if (!allowed(ctx, p, POLICY_PUBLISH, name)) {
                fail(ctx, p, m, PROTO_STATUS_DENIED, "the policy does not let uid %u publish '%s'",
                     registry_peer_creds(p)->uid, name);
                return;
        }
        if (m->retire_after > UINT32_MAX) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "retire_after is at most %u", UINT32_MAX);
                return;
        }
        if (proto_has(m, PF_BUFFER)) {
                if (m->buffer == 0) {
                        fail(ctx, p, m, PROTO_STATUS_INVALID,
                             "buffer ids start at 1; leave buffer out to publish new memory");
                        return;
                }
                if (*fd >= 0) {
                        fail(ctx, p, m, PROTO_STATUS_BAD_FD, "publishing a registered buffer again sends no fd");
                        return;
                }
        } else {
                why = check_new_buffer(m, *fd, &status);
                if (why) {
                        fail(ctx, p, m, status, "%s", why);
                        return;
                }
        }
        a.name = name;
        a.buffer = m->buffer;
        a.kind = m->kind;
        a.size = m->size;
        a.offset = m->offset;
        a.device = proto_has(m, PF_DEVICE) ? proto_str_copy(m->device, device, sizeof(device)) : NULL;
        /* An empty map is a request too: publishing again with it clears the metadata. */
        a.has_meta = proto_has(m, PF_META);
        if (a.has_meta && m->meta.count) {
                a.meta = m->meta.ptr;
                a.meta_len = m->meta.len;
        }
        a.handle = proto_has(m, PF_HANDLE) ? (const uint8_t *)m->handle.ptr : NULL;
        a.fd = steal_fd(*fd);
        a.writable = m->writable;
        a.broker_held = m->broker_held;
        a.retire_after = (uint32_t)m->retire_after;
        registry_publish(ctx->reg, p, m->id, &a, ctx->out);
}

/* ---- attach, release, retire, free ---- */

static void handle_attach(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        char name[PROTO_MAX_NAME + 1];
        bool by_name = proto_has(m, PF_NAME), by_id = proto_has(m, PF_BUFFER);
        const RegBuffer *b;

        if (by_name == by_id) {
                fail(ctx, p, m, PROTO_STATUS_BAD_REQUEST, "attach takes either a name or a buffer id");
                return;
        }
        if (by_name) {
                proto_str_copy(m->name, name, sizeof(name));
                if (!registry_name_valid(m->name.ptr, m->name.len)) {
                        fail(ctx, p, m, PROTO_STATUS_INVALID, "'%s' is not a valid buffer name", name);
                        return;
                }
        } else {
                b = registry_buffer_by_id(ctx->reg, m->buffer);
                if (!b) {
                        fail(ctx, p, m, PROTO_STATUS_NOT_FOUND, "no buffer with id %llu",
                             (unsigned long long)m->buffer);
                        return;
                }
                snprintf(name, sizeof(name), "%s", registry_buffer_name(b));
        }
        if (!allowed(ctx, p, POLICY_ATTACH, name)) {
                fail(ctx, p, m, PROTO_STATUS_DENIED, "the policy does not let uid %u attach '%s'",
                     registry_peer_creds(p)->uid, name);
                return;
        }
        registry_attach(ctx->reg, p, m->id, by_name ? name : NULL, m->buffer, timeout_of(m), ctx->now_ms, ctx->out);
}

/* May this peer manage buffers of other uids (by policy)? */
static bool as_admin(RequestCtx *ctx, RegPeer *p, uint64_t buffer)
{
        const RegBuffer *b = registry_buffer_by_id(ctx->reg, buffer);
        return b && allowed(ctx, p, POLICY_ADMIN, registry_buffer_name(b));
}

/* ---- dispatch ---- */

static void handle_subscribe(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        char prefix[PROTO_MAX_NAME + 1];

        proto_str_copy(m->prefix, prefix, sizeof(prefix));
        if (!registry_prefix_valid(m->prefix.ptr, m->prefix.len)) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "'%s' is not a valid name prefix", prefix);
                return;
        }
        if (!allowed(ctx, p, POLICY_ATTACH, prefix)) {
                fail(ctx, p, m, PROTO_STATUS_DENIED, "the policy does not let uid %u watch '%s'",
                     registry_peer_creds(p)->uid, prefix);
                return;
        }
        registry_subscribe(ctx->reg, p, m->id, prefix, ctx->out);
}

static void handle_group_join(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m)
{
        char group[PROTO_MAX_NAME + 1];

        proto_str_copy(m->group, group, sizeof(group));
        if (!registry_name_valid(m->group.ptr, m->group.len)) {
                fail(ctx, p, m, PROTO_STATUS_INVALID, "'%s' is not a valid group name", group);
                return;
        }
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
        if (!allowed(ctx, p, POLICY_ATTACH, group)) {
                fail(ctx, p, m, PROTO_STATUS_DENIED, "the policy does not let uid %u join group '%s'",
                     registry_peer_creds(p)->uid, group);
                return;
        }
        registry_group_join(ctx->reg, p, m->id, group, (uint32_t)m->members, timeout_of(m), ctx->now_ms, ctx->out);
}

void request_handle(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int fd)
{
        _cleanup_close_ int owned_fd = fd;

        if (owned_fd >= 0 && m->op != PROTO_OP_PUBLISH) {
                fail(ctx, p, m, PROTO_STATUS_BAD_FD, "only publish carries an fd; '%s' does not", proto_op_name(m->op));
                return;
        }
        if (m->op == PROTO_OP_HELLO) {
                handle_hello(ctx, p, m);
                return;
        }
        if (!registry_peer_said_hello(p) && m->op != PROTO_OP_PING) {
                fail(ctx, p, m, PROTO_STATUS_HELLO_FIRST, "send hello before '%s'", proto_op_name(m->op));
                return;
        }
        switch (m->op) {
        case PROTO_OP_PING:
                handle_ping(ctx, p, m);
                break;
        case PROTO_OP_PUBLISH:
                handle_publish(ctx, p, m, &owned_fd);
                break;
        case PROTO_OP_ATTACH:
                handle_attach(ctx, p, m);
                break;
        case PROTO_OP_RELEASE:
                registry_release(ctx->reg, p, m->id, m->buffer, ctx->out);
                break;
        case PROTO_OP_RETIRE:
                registry_retire(ctx->reg, p, m->id, m->buffer, as_admin(ctx, p, m->buffer), ctx->out);
                break;
        case PROTO_OP_FREE:
                registry_free_buffer(ctx->reg, p, m->id, m->buffer, as_admin(ctx, p, m->buffer), ctx->out);
                break;
        case PROTO_OP_SUBSCRIBE:
                handle_subscribe(ctx, p, m);
                break;
        case PROTO_OP_UNMAP:
                registry_unmap(ctx->reg, p, m->id, m->buffer, ctx->out);
                break;
        case PROTO_OP_UNSUBSCRIBE:
                registry_unsubscribe(ctx->reg, p, m->id, m->sub, ctx->out);
                break;
        case PROTO_OP_GROUP_JOIN:
                handle_group_join(ctx, p, m);
                break;
        case PROTO_OP_LIST:
                inspect_list(ctx, p, m);
                break;
        case PROTO_OP_STAT:
                inspect_stat(ctx, p, m);
                break;
        case PROTO_OP_PEERS:
                inspect_peers(ctx, p, m);
                break;
        case PROTO_OP_STATS:
                inspect_stats(ctx, p, m);
                break;
        default:
                fail(ctx, p, m, PROTO_STATUS_UNKNOWN_OP, "this broker does not know that operation");
                break;
        }
}
