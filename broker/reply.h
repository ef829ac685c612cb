/* The reply layer: turns what the registry says (an operation's result, registry-change.h's changes)
 * into the protocol's frames, with their statuses (the one table from registry codes to protocol
 * statuses is here), texts (broker/reply-text.c) and fds, and answers the requests that the request
 * layer refuses itself. It is the one place below the request layer that encodes a reply or an
 * event; the registry never does. */
#pragma once

#include <stdint.h>

#include "outbox.h"
#include "registry-change.h"
#include "registry.h"

/* An outbox for registry operations: a peer that misses a frame is marked lost in the registry,
 * and registry_take_lost() hands it to whoever disconnects it. */
#define OUTBOX_INIT { .lost = registry_peer_mark_lost }

/* Puts the frame(s) of one change into out. A REG_CH_RESULT belongs to a request: it goes through a
 * ReplyRequest's sink, never here (its peer would miss its reply, so it is reported lost). */
void reply_change(Outbox *out, const RegChange *c);

/* A RegSink's emit for an Outbox (ctx): reply_change. */
void reply_sink_emit(void *ctx, const RegChange *c);

/* The registry's sink for out: each change becomes its frames there as it is emitted. */
static inline RegSink reply_sink(Outbox *out)
{
        return (RegSink){ reply_sink_emit, out };
}

/* The protocol status a registry code answers a request with; PROTO_STATUS_OK for a code that
 * answers none (an event's reason, REG_R_*). */
unsigned reply_status(RegWhyCode code);

/* One request as a registry operation handles it: who asked (asker, id), the sink the operation
 * emits into (its result, REG_CH_RESULT, becomes the reply to (asker, id); any other change goes as
 * reply_change says), and where the operation puts its facts when it fails. Lives on the caller's
 * stack for one operation; the sink points into it. */
typedef struct ReplyRequest {
        Outbox *out;
        RegPeer *asker;
        uint64_t id;
        RegSink sink;
        RegWhy why;
} ReplyRequest;

void reply_request_init(ReplyRequest *rq, Outbox *out, RegPeer *asker, uint64_t id);

/* Answers rq by the operation's return value e: 0 needs nothing more (the operation emitted its
 * result, or its request waits); a registry code is an error reply with rq->why's status and text;
 * -ENOMEM (or any -errno) cuts the asker off, since it would miss its reply. */
void reply_request_done(ReplyRequest *rq, int e);

/* Fills m with buffer b's description (name, kind, size, state, refs, ...), from the registry's view
 * of it; m points into b. Every description the broker sends (attach replies, list, stat) is this. */
void reply_buffer_describe(const RegBuffer *b, ProtoMsg *m);

/* Fills m with peer p's record for listings; m points into p. */
void reply_peer_describe(const RegPeer *p, ProtoMsg *m);

/* An error reply to request id of p, with a message (a refusal of the request layer, an undecodable
 * frame, the broker stopping). */
void reply_error(Outbox *out, RegPeer *p, uint64_t id, unsigned status, const char *message);
