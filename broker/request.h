/* Turns a peer's decoded request into a registry operation: checks that hello came first, that
 * every field is in range, that any fd is what the buffer kind needs, and that the policy allows
 * it; answers bad requests itself. */
#pragma once

#include <stdint.h>

#include "histogram.h"
#include "outbox.h"
#include "policy.h"
#include "proto.h"
#include "registry.h"

/* Counters kept by the server, reported by the stats request. */
typedef struct ServerStats {
        uint64_t connections_total, connections_refused, frames_in, frames_out, bytes_in, bytes_out;
        uint64_t protocol_errors, slow_peers_dropped, fds_in, fds_out;
        uint64_t peer_cleanup_us_last, peer_cleanup_us_max, peer_cleanup_refs_last; /* forgetting a peer */
        Histogram request_us;      /* a request, from its frame read to its replies handed to the kernel */
        Histogram peer_cleanup_us; /* forgetting a peer */
        uint64_t started_ms;
        uint64_t open_fds, open_fds_limit; /* filled by the server when stats are asked for */
} ServerStats;

typedef struct RequestCtx {
        Registry *reg;
        const Policy *policy;
        ServerStats *stats;
        uint64_t now_ms;
        uint64_t broker_pidns;
        Outbox *out;
} RequestCtx;

/* Handles one request. fd is the frame's fd or -1; ownership passes to this function. */
void request_handle(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m, int fd);

/* Replies with an error status and a message (used for frames that could not be decoded). */
void request_reply_error(Outbox *out, RegPeer *p, uint64_t id, unsigned status, const char *message);
