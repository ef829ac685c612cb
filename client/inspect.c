/* The broker's read-only views and an operator's retire, as public calls: listings of buffers,
 * peers and rings (paged with a cursor), one buffer with its holders, one ring with its seats, the
 * statistics, and what a connection
 * knows about itself. Records arrive as msgpack maps; here they become the plain structs of
 * gpuipc.h, so that gpuipcctl and other languages need nothing but the public header. This file
 * only asks and copies: it keeps no state and never changes a buffer handle. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "identity.h"
#include "internal.h"
#include "macro.h"
#include "ring.h"

/* Like every request that does not wait, an inspection gives the broker this long to answer. */
#define INSPECT_REPLY_TIMEOUT_MS 10000

/* The public header restates the protocol's limits and enums (gpuipc.h includes nothing of
 * proto/); these make a change on one side a build error instead of a silent mismatch. */
_Static_assert(GPUIPC_MAX_NAME == PROTO_MAX_NAME, "names fit gpuipc_buffer_info_t");
_Static_assert(GPUIPC_MAX_LABEL == PROTO_MAX_LABEL, "labels fit gpuipc_peer_info_t");
_Static_assert(GPUIPC_MAX_UUID == PROTO_MAX_UUID, "UUIDs fit the info structs");
_Static_assert(GPUIPC_MAX_GPUS == PROTO_MAX_GPUS, "declared GPUs fit the info structs");
_Static_assert(GPUIPC_MAX_PAGE == PROTO_MAX_ITEMS, "a page is at most one listing reply");
_Static_assert(GPUIPC_RING_MAX_SLOTS == RING_MAX_SLOTS && GPUIPC_RING_MAX_MEMBERS == RING_MAX_MEMBERS,
               "public ring limits are the layout's");
_Static_assert((int)GPUIPC_STATE_LIVE == PROTO_STATE_LIVE && (int)GPUIPC_STATE_RETIRED == PROTO_STATE_RETIRED &&
                       (int)GPUIPC_STATE_IDLE == PROTO_STATE_IDLE,
               "public states are the protocol's");
_Static_assert((int)GPUIPC_KIND_MEMFD == PROTO_KIND_MEMFD && (int)GPUIPC_KIND_CUDA_VMM == PROTO_KIND_CUDA_VMM &&
                       (int)GPUIPC_KIND_CUDA_LEGACY == PROTO_KIND_CUDA_LEGACY,
               "public kinds are the protocol's");
_Static_assert((int)GPUIPC_RING_BACKPRESSURE == PROTO_MODE_BACKPRESSURE - 1 &&
                       (int)GPUIPC_RING_LATEST == PROTO_MODE_LATEST - 1 &&
                       (int)GPUIPC_RING_STREAM == PROTO_MODE_STREAM - 1,
               "public ring modes are the protocol's minus one");
_Static_assert((int)GPUIPC_SEAT_WAITING == PROTO_SEAT_WAITING && (int)GPUIPC_SEAT_JOINED == PROTO_SEAT_JOINED &&
                       (int)GPUIPC_SEAT_UNCONFIRMED == PROTO_SEAT_UNCONFIRMED &&
                       (int)GPUIPC_SEAT_SEATED == PROTO_SEAT_SEATED,
               "public seat states are the protocol's");

/* ---- names ---- */

/* Each name call checks the range itself: the values come from callers and from a possibly newer
 * broker, and the proto tables are indexed by them. */
_public_ const char *gpuipc_kind_name(gpuipc_kind_t kind)
{
        return kind > 0 && kind < (int)_PROTO_KIND_MAX ? proto_kind_name((ProtoKind)kind) : "unknown";
}

_public_ const char *gpuipc_state_name(gpuipc_buffer_state_t state)
{
        return state > 0 && state < (int)_PROTO_STATE_MAX ? proto_state_name((ProtoState)state) : "unknown";
}

_public_ const char *gpuipc_ring_mode_name(gpuipc_ring_mode_t mode)
{
        return (int)mode >= 0 && (int)mode < (int)_PROTO_MODE_MAX - 1 ? proto_mode_name((ProtoMode)(mode + 1))
                                                                       : "unknown";
}

_public_ const char *gpuipc_seat_state_name(gpuipc_seat_state_t state)
{
        return state > 0 && state < (int)_PROTO_SEAT_MAX ? proto_seat_name((ProtoSeat)state) : "unknown";
}

_public_ const char *gpuipc_event_name(gpuipc_event_type_t type)
{
        switch (type) {
        case GPUIPC_EVENT_PUBLISHED: return "published";
        case GPUIPC_EVENT_RETIRED: return "retired";
        case GPUIPC_EVENT_REVOKED: return "revoked";
        case GPUIPC_EVENT_DRAINED: return "drained";
        case GPUIPC_EVENT_RECONNECTED: return "reconnected";
        }
        return "unknown";
}

_public_ int gpuipc_kind_from_name(const char *name, gpuipc_kind_t *ret)
{
        ProtoKind k = proto_kind_from_name(name);

        if (k == PROTO_KIND_NONE || !ret)
                return GPUIPC_E_INVALID;
        *ret = (gpuipc_kind_t)k;
        return 0;
}

/* ---- records into structs ---- */

/* The *_from functions zero the struct first: a field the broker did not send reads as 0 or "",
 * never as what the caller's memory held, and padding leaks nothing when the struct is copied. */
static void buffer_info_from(const ProtoMsg *m, gpuipc_buffer_info_t *ret)
{
        memset(ret, 0, sizeof(*ret));
        ret->buffer = m->buffer;
        ret->generation = m->generation;
        proto_str_copy(m->name, ret->name, sizeof(ret->name));
        ret->kind = (gpuipc_kind_t)m->kind;
        ret->state = (gpuipc_buffer_state_t)m->state;
        ret->size = m->size;
        ret->refs = m->refs;
        ret->holders = m->holders;
        ret->owner = m->owner;
        ret->uid = m->uid;
        ret->pid = m->pid;
        proto_str_copy(m->device, ret->device, sizeof(ret->device));
        ret->writable = m->writable;
        ret->broker_held = m->broker_held;
        ret->self_pid = m->self_pid;
}

static void peer_info_from(const ProtoMsg *m, gpuipc_peer_info_t *ret)
{
        memset(ret, 0, sizeof(*ret));
        ret->peer = m->peer;
        ret->pid = m->pid;
        ret->uid = m->uid;
        ret->gid = m->gid;
        ret->pidns = m->pidns;
        ret->pidns_declared = m->pidns_declared;
        ret->self_pid = m->self_pid;
        ret->shm_dev = m->shm_dev;
        ret->shm_ino = m->shm_ino;
        proto_str_copy(m->label, ret->label, sizeof(ret->label));
        ret->buffers = m->buffers;
        ret->refs = m->refs;
        ret->subs = m->subs;
        ret->waits = m->waits;
        ret->started_ms = m->started_ms;
        ret->n_gpus = m->n_gpus;
        for (uint32_t i = 0; i < m->n_gpus; i++)
                proto_str_copy(m->gpus[i], ret->gpus[i], sizeof(ret->gpus[i]));
}

static void holder_info_from(const ProtoMsg *m, gpuipc_holder_info_t *ret)
{
        *ret = (gpuipc_holder_info_t){ .peer = m->peer, .pid = m->pid, .uid = m->uid, .refs = m->refs };
}

static void ring_info_from(const ProtoMsg *m, gpuipc_ring_info_t *ret)
{
        memset(ret, 0, sizeof(*ret));
        proto_str_copy(m->name, ret->name, sizeof(ret->name));
        ret->mode = m->mode > PROTO_MODE_NONE ? (gpuipc_ring_mode_t)(m->mode - 1) : GPUIPC_RING_BACKPRESSURE;
        ret->kind = (gpuipc_kind_t)m->kind;
        ret->slot_size = m->size;
        ret->slots = (unsigned)MIN(m->slots, (uint64_t)UINT_MAX);
        ret->members = (unsigned)MIN(m->members, (uint64_t)UINT_MAX);
        ret->taken = (unsigned)MIN(m->taken, (uint64_t)UINT_MAX);
        ret->lease_ms = m->timeout_ms;
        proto_str_copy(m->device, ret->device, sizeof(ret->device));
        ret->owner = m->owner;
        ret->uid = m->uid;
        ret->pid = m->pid;
        ret->ready = !m->pending;
        ret->head_known = proto_has(m, PF_HEAD);
        ret->head = m->head;
        ret->lag_known = proto_has(m, PF_LAG);
        ret->lag = m->lag;
        proto_str_copy(m->reason, ret->why, sizeof(ret->why));
        /* A cut may split a character: keep the text valid UTF-8. */
        ret->why[proto_utf8_trim(ret->why, strlen(ret->why))] = 0;
}

static void ring_member_info_from(const ProtoMsg *m, gpuipc_ring_member_info_t *ret)
{
        memset(ret, 0, sizeof(*ret));
        /* Clamped, not truncated: a broker's 64-bit index must not wrap into a small seat number. */
        ret->seat = (unsigned)MIN(m->index, (uint64_t)UINT_MAX);
        ret->epoch = m->generation;
        ret->state = (gpuipc_seat_state_t)m->seat;
        ret->peer = m->peer;
        ret->pid = m->pid;
        ret->uid = m->uid;
        proto_str_copy(m->label, ret->label, sizeof(ret->label));
        ret->position_known = proto_has(m, PF_POSITION);
        ret->position = m->position;
        ret->lag = m->lag;
}

static void stat_from(const ProtoMsg *m, gpuipc_stat_t *ret)
{
        memset(ret, 0, sizeof(*ret));
        proto_str_copy(m->name, ret->name, sizeof(ret->name));
        proto_str_copy(m->error, ret->status, sizeof(ret->status));
        /* A series by kind or by uid has its qualifier where a series by status has its status. */
        if (proto_has(m, PF_KIND))
                snprintf(ret->status, sizeof(ret->status), "%s", proto_kind_name(m->kind));
        else if (proto_has(m, PF_UID))
                snprintf(ret->status, sizeof(ret->status), "%" PRIu64, m->uid);
        ret->le_us = m->le_us;
        ret->value = m->value;
}

/* Copies up to cap records of a reply through fn (which knows the struct) into items, of elem_size
 * bytes each. Returns the number of records in the reply, or GPUIPC_E_BAD_REPLY. */
static int copy_records(gpuipc_t *c, const ProtoMsg *reply, void *items, size_t elem_size, size_t cap,
                        void (*fn)(const ProtoMsg *, void *))
{
        ProtoIter it;
        ProtoMsg rec;
        size_t n = 0;
        int r;

        proto_iter_init(&it, &reply->items);
        /* Every record is walked (and so checked) even past cap: the count returned is the
         * reply's, so a caller can tell it saw only part of it. */
        while ((r = proto_iter_next(&it, &rec)) == 1) {
                if (n < cap)
                        fn(&rec, (char *)items + n * elem_size);
                n++;
        }
        if (r < 0) {
                client_errmsg(c, "the broker sent a listing we cannot read (%s)", proto_strerror(r));
                return GPUIPC_E_BAD_REPLY;
        }
        return (int)n;
}

/* ---- listings ---- */

/* One page of a listing: asks for records after *cursor, copies them, moves the cursor. */
static int list_page(gpuipc_t *c, ProtoMsg *req, uint64_t *cursor, void *items, size_t elem_size, size_t cap,
                     void (*fn)(const ProtoMsg *, void *))
{
        Frame f = { .fd = -1 };
        int n, r;

        if (!c || !cursor || (!items && cap))
                return -EINVAL;
        if (cap == 0)
                return 0;
        proto_set_after(req, *cursor);
        /* Asking for no more than fits: the broker then moves the cursor past exactly what was
         * copied, and no record falls between two pages. */
        proto_set_limit(req, MIN(cap, (size_t)GPUIPC_MAX_PAGE));
        r = client_request(c, req, -1, INSPECT_REPLY_TIMEOUT_MS, &f);
        if (r < 0)
                return r;
        n = copy_records(c, &f.msg, items, elem_size, req->limit, fn);
        if (n >= 0 && f.msg.more && (n == 0 || f.msg.after <= *cursor)) {
                /* "More" without progress would make the caller loop forever. */
                client_errmsg(c, "the broker's listing said there is more but did not move on");
                n = GPUIPC_E_BAD_REPLY;
        }
        if (n >= 0)
                *cursor = f.msg.more ? f.msg.after : 0;
        frame_free(&f);
        return n < 0 ? n : (int)MIN((size_t)n, (size_t)req->limit);
}

static void buffer_info_cb(const ProtoMsg *m, void *ret)
{
        buffer_info_from(m, ret);
}

static void peer_info_cb(const ProtoMsg *m, void *ret)
{
        peer_info_from(m, ret);
}

static void holder_info_cb(const ProtoMsg *m, void *ret)
{
        holder_info_from(m, ret);
}

static void ring_info_cb(const ProtoMsg *m, void *ret)
{
        ring_info_from(m, ret);
}

static void ring_member_info_cb(const ProtoMsg *m, void *ret)
{
        ring_member_info_from(m, ret);
}

static void stat_cb(const ProtoMsg *m, void *ret)
{
        stat_from(m, ret);
}

_public_ int gpuipc_list_buffers(gpuipc_t *c, const char *prefix, uint64_t *cursor, gpuipc_buffer_info_t *items,
                                 size_t cap)
{
        CLIENT_LOCKED(c);
        ProtoMsg req;

        proto_request_init(&req, PROTO_OP_LIST);
        if (prefix && *prefix) {
                if (strlen(prefix) > PROTO_MAX_NAME)
                        return GPUIPC_E_INVALID;
                proto_set_prefix(&req, proto_str(prefix));
        }
        return list_page(c, &req, cursor, items, sizeof(*items), cap, buffer_info_cb);
}

_public_ int gpuipc_list_peers(gpuipc_t *c, uint64_t *cursor, gpuipc_peer_info_t *items, size_t cap)
{
        CLIENT_LOCKED(c);
        ProtoMsg req;

        proto_request_init(&req, PROTO_OP_PEERS);
        return list_page(c, &req, cursor, items, sizeof(*items), cap, peer_info_cb);
}

_public_ int gpuipc_stat_buffer(gpuipc_t *c, const char *name, uint64_t buffer, gpuipc_holder_info_t *holders,
                                size_t cap, gpuipc_buffer_info_t *ret)
{
        CLIENT_LOCKED(c);
        Frame f = { .fd = -1 };
        ProtoMsg req;
        int n;

        if (!c || !ret || (!holders && cap))
                return -EINVAL;
        proto_request_init(&req, PROTO_OP_STAT);
        if (name) {
                if (strlen(name) > PROTO_MAX_NAME)
                        return GPUIPC_E_INVALID;
                proto_set_name(&req, proto_str(name));
        } else {
                proto_set_buffer(&req, buffer);
        }
        n = client_request(c, &req, -1, INSPECT_REPLY_TIMEOUT_MS, &f);
        if (n < 0)
                return n;
        n = copy_records(c, &f.msg, holders, sizeof(*holders), cap, holder_info_cb);
        if (n >= 0) {
                buffer_info_from(&f.msg, ret);
                n = (int)MIN((size_t)n, cap);
        }
        frame_free(&f);
        return n;
}

_public_ int gpuipc_list_rings(gpuipc_t *c, const char *prefix, uint64_t *cursor, gpuipc_ring_info_t *items,
                               size_t cap)
{
        CLIENT_LOCKED(c);
        ProtoMsg req;

        proto_request_init(&req, PROTO_OP_RINGS);
        if (prefix && *prefix) {
                if (strlen(prefix) > PROTO_MAX_NAME)
                        return GPUIPC_E_INVALID;
                proto_set_prefix(&req, proto_str(prefix));
        }
        return list_page(c, &req, cursor, items, sizeof(*items), cap, ring_info_cb);
}

_public_ int gpuipc_stat_ring(gpuipc_t *c, const char *name, gpuipc_ring_member_info_t *members, size_t cap,
                              gpuipc_ring_info_t *ret)
{
        CLIENT_LOCKED(c);
        Frame f = { .fd = -1 };
        ProtoMsg req;
        int n;

        if (!c || !name || !ret || (!members && cap))
                return -EINVAL;
        if (strlen(name) > PROTO_MAX_NAME)
                return GPUIPC_E_INVALID;
        proto_request_init(&req, PROTO_OP_RING_STAT);
        proto_set_name(&req, proto_str(name));
        n = client_request(c, &req, -1, INSPECT_REPLY_TIMEOUT_MS, &f);
        if (n < 0)
                return n;
        n = copy_records(c, &f.msg, members, sizeof(*members), cap, ring_member_info_cb);
        if (n >= 0) {
                ring_info_from(&f.msg, ret);
                n = (int)MIN((size_t)n, cap);
        }
        frame_free(&f);
        return n;
}

_public_ int gpuipc_retire_id(gpuipc_t *c, uint64_t buffer)
{
        CLIENT_LOCKED(c);
        Frame f = { .fd = -1 };
        ProtoMsg req;
        int r;

        if (!c)
                return -EINVAL;
        proto_request_init(&req, PROTO_OP_RETIRE);
        proto_set_buffer(&req, buffer);
        r = client_request(c, &req, -1, INSPECT_REPLY_TIMEOUT_MS, &f);
        if (r == 0)
                frame_free(&f);
        return r;
}

_public_ int gpuipc_stats(gpuipc_t *c, gpuipc_stat_t *items, size_t cap)
{
        CLIENT_LOCKED(c);
        Frame f = { .fd = -1 };
        ProtoMsg req;
        int n;

        if (!c || (!items && cap))
                return -EINVAL;
        proto_request_init(&req, PROTO_OP_STATS);
        n = client_request(c, &req, -1, INSPECT_REPLY_TIMEOUT_MS, &f);
        if (n < 0)
                return n;
        n = copy_records(c, &f.msg, items, sizeof(*items), cap, stat_cb);
        frame_free(&f);
        return n;
}

/* ---- this connection ---- */

_public_ int gpuipc_connection_info(const gpuipc_t *c, gpuipc_connection_info_t *ret)
{
        CLIENT_LOCKED((gpuipc_t *)c);
        if (!c || !ret)
                return -EINVAL;
        memset(ret, 0, sizeof(*ret));
        ret->peer = c->peer_id;
        ret->epoch = c->epoch;
        ret->pidns = c->pidns;
        ret->pidns_same = c->pidns_same;
        ret->self_pid = (uint64_t)getpid();
        ipc_shm_identity(&ret->shm_dev, &ret->shm_ino);
        ret->connected = !c->broken && c->fd >= 0;
        snprintf(ret->socket_path, sizeof(ret->socket_path), "%s", c->path);
        ret->n_gpus = c->n_gpus;
        for (uint32_t i = 0; i < c->n_gpus && i < GPUIPC_MAX_GPUS; i++)
                snprintf(ret->gpus[i], sizeof(ret->gpus[i]), "%s", c->gpus[i]);
        return 0;
}
