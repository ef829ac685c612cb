/* The reply layer: turns what the registry says happened (registry-change.h) into the protocol's
 * frames, with their texts (broker/reply-text.c) and fds, and answers the requests that the request
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

/* Puts the frame(s) of one change into out. */
void reply_change(Outbox *out, const RegChange *c);

/* A RegSink's emit for an Outbox (ctx): reply_change. */
void reply_sink_emit(void *ctx, const RegChange *c);

/* The registry's sink for out: each change becomes its frames there as it is emitted. */
static inline RegSink reply_sink(Outbox *out)
{
        return (RegSink){ reply_sink_emit, out };
}

/* An error reply to request id of p, with a message (a refusal of the request layer, an undecodable
 * frame, the broker stopping). */
void reply_error(Outbox *out, RegPeer *p, uint64_t id, unsigned status, const char *message);
