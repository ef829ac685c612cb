/* The reply layer (reply.h): registry changes become frames here, and nowhere else below the
 * request layer. Each change is encoded as it is emitted, so frames keep the registry's order. */
#include "reply.h"

#include <stdio.h>

#include "registry.h"
#include "reply-text.h"

void reply_error(Outbox *out, RegPeer *p, uint64_t id, unsigned status, const char *message)
{
        outbox_send_error(out, p, id, status, "%s", message);
}

void registry_buffer_describe(const RegBuffer *b, ProtoMsg *m)
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

void registry_peer_describe(const RegPeer *p, ProtoMsg *m)
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

static void send_attached(Outbox *out, const RegChange *c)
{
        RegBufferView v;
        ProtoMsg m;

        registry_buffer_view(c->buffer, &v);
        registry_buffer_describe(c->buffer, &m);
        m.type = PROTO_REPLY;
        proto_set_reply(&m, c->req);
        proto_set_status(&m, PROTO_STATUS_OK);
        proto_set_cached(&m, c->flag);
        outbox_send(out, c->to, &m, c->flag ? -1 : v.fd);
}

/* A member's seat: the ring's shape and the parts it attaches (as items). */
static void send_seat(Outbox *out, const RegChange *c)
{
        RegRingView g;
        ProtoItems items;
        ProtoMsg m;

        registry_ring_view(c->ring, &g);
        proto_items_init(&items, PROTO_MAX_BODY / 2); /* 67 records of two numbers: a few KiB */
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
        proto_reply_init(&m, c->req, PROTO_STATUS_OK);
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

static void send_reply(Outbox *out, const RegChange *c)
{
        char text[PROTO_MAX_TEXT + 1];
        RegBufferView v;
        ProtoMsg m;

        if (c->status != PROTO_STATUS_OK) {
                reply_text(&c->why, text, sizeof(text));
                outbox_send_error(out, c->to, c->req, c->status, "%s", text);
                return;
        }
        if (c->reply == REG_RE_ATTACHED) {
                send_attached(out, c);
                return;
        }
        if (c->reply == REG_RE_SEAT) {
                send_seat(out, c);
                return;
        }
        proto_reply_init(&m, c->req, PROTO_STATUS_OK);
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
        case REG_CH_REPLY:
                send_reply(out, c);
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
