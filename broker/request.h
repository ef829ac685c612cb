/* Turns a peer's decoded request into a registry operation: checks that hello came first, that
 * every field is in range, that any fd is what the buffer kind needs, and that the policy allows
 * it; answers bad requests itself. */
#pragma once

#include <stdint.h>

#include "outbox.h"
#include "policy.h"
#include "proto.h"
#include "registry.h"
#include "stats.h"

typedef struct RequestCtx {
        Registry *reg;
        const Policy *policy;
        ServerStats *stats;
        uint64_t now_ms;
        uint64_t broker_pidns;
        Outbox *out;      /* replies, refusals, listings and what registry operations change */
} RequestCtx;

/* Handles one request. fd is the frame's fd or -1; ownership passes to this function. Returns
 * whether the audit trail keeps the request (audit_request_end). */
bool request_handle(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int fd);
