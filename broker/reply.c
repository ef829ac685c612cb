/* The reply layer (reply.h): registry results and changes become frames here, and nowhere else below
 * the request layer. Each change is encoded as it is emitted, so frames keep the registry's order; a
 * failed operation's reply is encoded when the operation returns, and nothing precedes it (a failure
 * changes nothing). */
#include "reply.h"

#include <errno.h>
#include <stdio.h>

#include "registry.h"
#include "reply-text.h"

/* The status each registry code answers a request with: the one table from the registry's codes to
 * the protocol's statuses (its texts: reply-text.c). Reasons of events (REG_R_*) answer nothing. */
static const ProtoStatus reg_status[_REG_WHY_MAX] = {
        [REG_E_SUBS_LIMIT] = PROTO_STATUS_QUOTA,
        [REG_E_NO_SUB] = PROTO_STATUS_NOT_FOUND,
        [REG_E_GROUP_EMPTY] = PROTO_STATUS_INVALID,
        [REG_E_GROUP_MISMATCH] = PROTO_STATUS_GROUP_MISMATCH,
        [REG_E_GROUP_JOINED] = PROTO_STATUS_STATE,
        [REG_E_WAITS_LIMIT] = PROTO_STATUS_QUOTA,
        [REG_E_GROUP_TIMEOUT] = PROTO_STATUS_TIMEOUT,
        [REG_E_WAIT_MISSED] = PROTO_STATUS_TIMEOUT,
        [REG_E_WAIT_TIMEOUT] = PROTO_STATUS_TIMEOUT,
        [REG_E_STOPPING] = PROTO_STATUS_SHUTDOWN,
        [REG_E_SAME_PID] = PROTO_STATUS_SAME_PID,
        [REG_E_DEVICE] = PROTO_STATUS_DEVICE,
        [REG_E_NO_BUFFER] = PROTO_STATUS_NOT_FOUND,
        [REG_E_PART_OF_NO_RING] = PROTO_STATUS_DENIED,
        [REG_E_RING_MEMBERS_ONLY] = PROTO_STATUS_DENIED,
        [REG_E_RING_EXISTS] = PROTO_STATUS_NAME_TAKEN,
        [REG_E_RING_BUFFERS_LIMIT] = PROTO_STATUS_QUOTA,
        [REG_E_RING_OTHERS] = PROTO_STATUS_NOT_OWNER,
        [REG_E_NO_RING] = PROTO_STATUS_NOT_FOUND,
        [REG_E_PART_MISFIT] = PROTO_STATUS_INVALID,
        [REG_E_PART_KEY_TAKEN] = PROTO_STATUS_KEY_TAKEN,
        [REG_E_RING_SETTING_UP] = PROTO_STATUS_NOT_FOUND,
        [REG_E_RING_MEMBER] = PROTO_STATUS_STATE,
        [REG_E_RING_NO_SEAT_READY] = PROTO_STATUS_NOT_FOUND,
        [REG_E_RING_FULL] = PROTO_STATUS_QUOTA,
        [REG_E_RING_SEATS] = PROTO_STATUS_INVALID,
        [REG_E_SEAT_NOT_WAITING] = PROTO_STATUS_REVOKED,
        [REG_E_RING_GONE] = PROTO_STATUS_REVOKED,
        [REG_E_SEAT_CLAIMS_LIMIT] = PROTO_STATUS_QUOTA,
        [REG_E_NOT_MEMBER] = PROTO_STATUS_NOT_FOUND,
        [REG_E_CONNECTIONS_LIMIT] = PROTO_STATUS_QUOTA,
        [REG_E_CONNECTIONS_PER_UID] = PROTO_STATUS_QUOTA,
        [REG_E_HELLO_AGAIN] = PROTO_STATUS_STATE,
        [REG_E_MEMORY_BUDGET] = PROTO_STATUS_QUOTA,
        [REG_E_REFS_FULL] = PROTO_STATUS_QUOTA,
        [REG_E_NOT_LIVE] = PROTO_STATUS_STATE,
        [REG_E_NOTHING_UNDER] = PROTO_STATUS_NOT_FOUND,
        [REG_E_NAME_ORPHANED] = PROTO_STATUS_NAME_TAKEN,
        [REG_E_NAME_TAKEN] = PROTO_STATUS_NAME_TAKEN,
        [REG_E_OTHERS_BUFFER] = PROTO_STATUS_NOT_OWNER,
        [REG_E_NOT_IDLE] = PROTO_STATUS_STATE,
        [REG_E_KEY_TAKEN] = PROTO_STATUS_KEY_TAKEN,
        [REG_E_BUFFERS_LIMIT] = PROTO_STATUS_QUOTA,
        [REG_E_FDS_LIMIT] = PROTO_STATUS_QUOTA,
        [REG_E_HELD_MEMORY_LIMIT] = PROTO_STATUS_QUOTA,
        [REG_E_OTHERS_SEGMENT] = PROTO_STATUS_NOT_OWNER,
        [REG_E_NOT_A_SEGMENT] = PROTO_STATUS_INVALID,
        [REG_E_SEGMENT_FREED] = PROTO_STATUS_STATE,
        [REG_E_NO_SEGMENT] = PROTO_STATUS_NOT_FOUND,
        [REG_E_VIEW_OUTSIDE] = PROTO_STATUS_INVALID,
        [REG_E_RESTORED_GENERATION] = PROTO_STATUS_INVALID,
        [REG_E_NOT_ATTACHED] = PROTO_STATUS_NOT_ATTACHED,
        [REG_E_NOT_OWNER] = PROTO_STATUS_NOT_OWNER,
        [REG_E_CLAIM_OWNER] = PROTO_STATUS_REVOKED,
        [REG_E_CLAIM_REPUBLISHED] = PROTO_STATUS_REVOKED,
        [REG_E_CLAIM_DRAINED] = PROTO_STATUS_REVOKED,
        [REG_E_CLAIM_RING_PART] = PROTO_STATUS_REVOKED,
        [REG_E_CLAIM_RETIRED] = PROTO_STATUS_REVOKED,
        [REG_E_CLAIM_RETIRE_AFTER] = PROTO_STATUS_REVOKED,
        [REG_E_RECLAIM_NO_REFS] = PROTO_STATUS_INVALID,
        [REG_E_REFS_LIMIT] = PROTO_STATUS_QUOTA,
        [REG_E_CLAIM_UNKNOWN] = PROTO_STATUS_REVOKED,
        [REG_E_CLAIMS_PER_UID] = PROTO_STATUS_QUOTA,
        [REG_E_CLAIMS_ALL] = PROTO_STATUS_QUOTA,
};

/* A code past the table has no status (OK) rather than an index past the table; send_failure then
 * answers invalid. */
unsigned reply_status(RegWhyCode code)
{
        return code < _REG_WHY_MAX ? reg_status[code] : PROTO_STATUS_OK;
}

/* Through "%s": message may hold a peer's text (a name), which must never be read as a format. */
void reply_error(Outbox *out, RegPeer *p, uint64_t id, unsigned status, const char *message)
{
        outbox_send_error(out, p, id, status, "%s", message);
}

/* Built from the registry's read-only view (registry_buffer_view), not its structs: the reply layer
 * sees what a buffer is, never how the registry keeps it. */
void reply_buffer_describe(const RegBuffer *b, ProtoMsg *m)
{
        RegBufferView v;

        registry_buffer_view(b, &v);
        proto_record_init(m);
        proto_set_buffer(m, v.id);
        proto_set_name(m, proto_str(v.name));
        proto_set_generation(m, v.generation);
        proto_set_buffer_info(m, &v.info);
        if (v.is_view)
                proto_set_segment_size(m, v.segment_size); /* what a consumer maps */
        proto_set_state(m, v.state);
        proto_set_refs(m, v.refs);
        proto_set_holders(m, v.holders);
        proto_set_owner(m, v.owner);
        proto_set_uid(m, v.owner_uid);
        proto_set_pid(m, v.owner_pid);
        if (v.device)
                proto_set_device(m, proto_str(v.device));
        if (v.meta_len)
                proto_set_meta(m, (ProtoRaw){ v.meta, v.meta_len, 0 });
        if (v.handle)
                proto_set_handle(m, (ProtoStr){ (const char *)v.handle, PROTO_LEGACY_HANDLE_SIZE });
        /* What a legacy handle's opener must differ in (and its diagnosis, should CUDA still fail). */
        if (v.info.kind == PROTO_KIND_CUDA_LEGACY && v.owner_self_pid)
                proto_set_self_pid(m, v.owner_self_pid);
        /* Registered again after a restart, and holders may still come back: it does not drain yet. */
        if (v.restored)
                proto_set_restored(m, true);
}

/* The peer's kernel credentials and what it declared side by side: pidns_declared says which of
 * the two a listing's PID namespace is, so nobody mistakes a claim for a fact. */
void reply_peer_describe(const RegPeer *p, ProtoMsg *m)
{
        RegPeerView v;

        registry_peer_view(p, &v);
        proto_record_init(m);
        proto_set_peer(m, v.id);
        proto_set_pid(m, v.creds.pid);
        proto_set_uid(m, v.creds.uid);
        proto_set_gid(m, v.creds.gid);
        proto_set_pidns(m, v.pidns);
        proto_set_pidns_declared(m, v.pidns_declared);
        if (v.self_pid)
                proto_set_self_pid(m, v.self_pid);
        if (v.shm_dev || v.shm_ino) {
                proto_set_shm_dev(m, v.shm_dev);
                proto_set_shm_ino(m, v.shm_ino);
        }
        proto_set_label(m, proto_str(v.label));
        proto_set_refs(m, v.n_refs);
        proto_set_subs(m, v.n_subs);
        proto_set_waits(m, v.n_waits);
        proto_set_started_ms(m, v.connected_ms);
        proto_set_gpus(m, v.gpus, v.n_gpus);
        proto_set_buffers(m, v.owned);
}

/* The fields every buffer event carries. */
static void buffer_event(ProtoMsg *m, ProtoEvent ev, const RegBufferKey *k)
{
        proto_event_init(m, ev);
        proto_set_buffer(m, k->id);
        proto_set_generation(m, k->generation);
        proto_set_name(m, proto_str(k->name));
        proto_set_kind(m, k->kind);
}

/* An attach's reply carries the buffer's description and, unless the consumer still has it mapped
 * (cached), the memory's fd: borrowed from the registry, which keeps it open until the frame is out. */
static void send_attached(Outbox *out, uint64_t req, const RegChange *c)
{
        RegBufferView v;
        ProtoMsg m;

        registry_buffer_view(c->buffer, &v);
        reply_buffer_describe(c->buffer, &m);
        m.type = PROTO_REPLY;
        proto_set_reply(&m, req);
        proto_set_status(&m, PROTO_STATUS_OK);
        proto_set_cached(&m, c->flag);
        outbox_send(out, c->to, &m, c->flag ? -1 : v.fd);
}

/* A member's seat: the ring's shape and the parts it attaches (as items). */
static void send_seat(Outbox *out, uint64_t req, const RegChange *c)
{
        RegRingView g;
        ProtoItems items;
        ProtoMsg m;

        registry_ring_view(c->ring, &g);
        proto_items_init(&items, PROTO_MAX_BODY / 2); /* 67 records of two numbers: a few KiB */
        /* A record that does not fit cannot be left out (the member would miss a part it must
         * attach): the peer is cut off instead, as for any frame it cannot be sent. */
        for (uint64_t i = 0; i < c->n; i++) {
                ProtoMsg rec;

                proto_record_init(&rec);
                proto_set_index(&rec, c->parts[i].index);
                proto_set_buffer(&rec, c->parts[i].buffer);
                if (!proto_items_add(&items, &rec)) {
                        proto_items_free(&items);
                        out->lost(c->to);
                        return;
                }
        }
        proto_reply_init(&m, req, PROTO_STATUS_OK);
        proto_set_index(&m, c->index);
        proto_set_generation(&m, c->epoch);
        proto_set_slots(&m, g.n_slots);
        proto_set_members(&m, g.n_members);
        proto_set_mode(&m, g.mode);
        proto_set_kind(&m, g.kind);
        proto_set_size(&m, g.slot_size);
        proto_set_timeout_ms(&m, g.lease_ms);
        proto_set_items(&m, proto_items_finish(&items));
        if (g.device)
                proto_set_device(&m, proto_str(g.device));
        outbox_send(out, c->to, &m, -1);
        proto_items_free(&items);
}

/* The error reply to request req of `to`: why's status and text. */
static void send_failure(Outbox *out, RegPeer *to, uint64_t req, const RegWhy *why)
{
        char text[PROTO_MAX_TEXT + 1];

        unsigned status = reply_status(why->code);

        reply_text(why, text, sizeof(text));
        /* A failure answered as success would be a lie; a code the table lacks is a bug the unit
         * tests catch (regenv.h), answered meanwhile as a value the broker could not take. */
        outbox_send_error(out, to, req, status != PROTO_STATUS_OK ? status : PROTO_STATUS_INVALID, "%s", text);
}

/* The reply to request req of c->to, which succeeded: what c says it got. */
/* Buffer fields are read when the reply is encoded, which is when the operation emitted its result:
 * the state a publish reply reports is the state right after the publish, not after later changes
 * of the same step. */
static void send_success(Outbox *out, uint64_t req, const RegChange *c)
{
        RegBufferView v;
        ProtoMsg m;

        if (c->reply == REG_RE_ATTACHED) {
                send_attached(out, req, c);
                return;
        }
        if (c->reply == REG_RE_SEAT) {
                send_seat(out, req, c);
                return;
        }
        proto_reply_init(&m, req, PROTO_STATUS_OK);
        switch (c->reply) {
        case REG_RE_SUB:
                proto_set_sub(&m, c->sub);
                break;
        case REG_RE_GROUP:
                proto_set_group(&m, proto_str(c->str));
                proto_set_members(&m, c->n);
                break;
        case REG_RE_STATE:
                proto_set_state(&m, (ProtoState)c->n);
                break;
        case REG_RE_PENDING:
                proto_set_pending(&m, true);
                break;
        case REG_RE_PUBLISHED:
                registry_buffer_view(c->buffer, &v);
                proto_set_buffer(&m, v.id);
                proto_set_generation(&m, v.generation);
                proto_set_state(&m, v.state);
                break;
        case REG_RE_PART:
                registry_buffer_view(c->buffer, &v);
                proto_set_buffer(&m, v.id);
                proto_set_generation(&m, v.generation);
                break;
        case REG_RE_PLAIN:
        case REG_RE_ATTACHED:
        case REG_RE_SEAT:
                break;
        }
        outbox_send(out, c->to, &m, -1);
}

/* An event: a ring event names the ring and seat, a buffer event the publication (RegBufferKey);
 * both are encoded as they are emitted, while what they name still exists. A reason is worded only
 * when the registry gave one. */
static void send_event(Outbox *out, const RegChange *c)
{
        char text[PROTO_MAX_TEXT + 1];
        ProtoMsg m;

        if (c->type == REG_CH_RING_EVENT) {
                proto_event_init(&m, c->event);
                proto_set_name(&m, proto_str(c->str));
                proto_set_index(&m, c->index);
                proto_set_generation(&m, c->epoch);
        } else {
                buffer_event(&m, c->event, &c->key);
        }
        if (c->sub)
                proto_set_sub(&m, c->sub);
        if (c->why.code != REG_WHY_NONE) {
                reply_text(&c->why, text, sizeof(text));
                proto_set_reason(&m, proto_str(text));
        }
        outbox_send(out, c->to, &m, -1);
}

void reply_change(Outbox *out, const RegChange *c)
{
        switch (c->type) {
        case REG_CH_RESULT:
                out->lost(c->to); /* no request to answer: see reply.h */
                break;
        case REG_CH_ANSWER:
                if (c->why.code != REG_WHY_NONE)
                        send_failure(out, c->to, c->req, &c->why);
                else
                        send_success(out, c->req, c);
                break;
        case REG_CH_EVENT:
        case REG_CH_RING_EVENT:
                send_event(out, c);
                break;
        case REG_CH_FORGET_PEER:
                outbox_drop_peer(out, c->to);
                break;
        case REG_CH_CLOSE_FD:
                outbox_close_fd(out, c->fd);
                break;
        }
}

void reply_sink_emit(void *ctx, const RegChange *c)
{
        reply_change(ctx, c);
}

/* A ReplyRequest's sink: the operation's result answers the request; the rest as reply_change. */
static void request_emit(void *ctx, const RegChange *c)
{
        ReplyRequest *rq = ctx;

        if (c->type == REG_CH_RESULT && c->to == rq->asker)
                send_success(rq->out, rq->id, c);
        else
                reply_change(rq->out, c);
}

void reply_request_init(ReplyRequest *rq, Outbox *out, RegPeer *asker, uint64_t id)
{
        *rq = (ReplyRequest){ .out = out, .asker = asker, .id = id, .sink = { request_emit, rq } };
}

/* Nothing is sent for 0: the operation emitted its result (or its request waits, and the wait will
 * answer it). */
void reply_request_done(ReplyRequest *rq, int e)
{
        if (e < 0)
                rq->out->lost(rq->asker);
        else if (e > 0)
                send_failure(rq->out, rq->asker, rq->id, &rq->why);
}
