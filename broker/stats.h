/* The broker's own counters (connections, frames, bytes, fds, cleanup times), kept by the server
 * and its peers and reported by the stats request (broker/inspect.c) next to the registry's. The
 * registry keeps its own (RegCounters): these are what only the I/O layers see. */
#pragma once

#include <stdint.h>

#include "budget.h"
#include "fair.h"
#include "histogram.h"

typedef struct ServerStats {
        uint64_t connections_total, connections_refused, frames_in, frames_out, bytes_in, bytes_out;
        uint64_t protocol_errors, slow_peers_dropped, fds_in, fds_out;
        uint64_t peer_cleanup_us_last, peer_cleanup_us_max, peer_cleanup_refs_last; /* forgetting a peer */
        Histogram request_us;      /* a request, from its frame read to its replies handed to the kernel */
        Histogram peer_cleanup_us; /* forgetting a peer */
        uint64_t started_ms;
        uint64_t open_fds, open_fds_limit; /* refreshed by stats_refresh when stats are asked for */
        uint64_t fds_counted_ms;           /* when open_fds was last refreshed */
        uint64_t seccomp_refused;          /* calls the filter refused (sandbox.c), likewise */
        const Budget *budget;              /* the server's memory budget, NULL for none */
        const Fair *fair;                  /* the server's scheduler */
} ServerStats;

/* Empty counters and histograms; started_ms on the caller's clock. */
void stats_init(ServerStats *st, uint64_t started_ms);

/* Refreshes what is read only when stats are asked for: seccomp_refused, and open_fds and
 * open_fds_limit at most once a second (now_ms on the started_ms clock): listing /proc/self/fd
 * costs a lot with 100k fds held. */
void stats_refresh(ServerStats *st, uint64_t now_ms);

/* Forgetting a peer that held refs references took us microseconds. */
void stats_peer_cleanup(ServerStats *st, uint64_t us, uint32_t refs);
