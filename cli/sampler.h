/* The metrics exporter's broker side (metrics --listen): a thread of its own owns the broker
 * connection. It asks the broker for a sample when a scrape wants one, and otherwise pings it once
 * a second so that /healthz knows how it is; what it gets it renders once, and leaves where the
 * HTTP loop takes it without waiting. So a slow or stopped broker costs a scrape at most its
 * deadline (then it gets the last good sample, with gpuipc_up 0) and never holds up /healthz or any
 * other request. Every call but sampler_new/start/stop returns at once. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuipc.h"
#include "http.h"
#include "metrics.h"

/* Rings exported per scrape at most: one series each per gpuipc_ring_* family. A bound, so that a
 * scrape's memory and time do not grow with whatever peers create; past it the first ones by
 * cursor are shown. */
#define SAMPLER_MAX_RINGS 4096

/* One sample from the broker into stats (GPUIPC_MAX_PAGE records) and rings (SAMPLER_MAX_RINGS):
 * 0 with *ret filled in (up, sampled_at), or the library's error with *what naming the call that
 * failed. Used by the exporter's thread and by `gpuipcctl metrics` run once. */
int sampler_collect(gpuipc_t *c, gpuipc_stat_t *stats, gpuipc_ring_info_t *rings, MetricsInput *ret,
                    const char **what);

typedef struct Sampler Sampler;

typedef struct SamplerConfig {
        const char *socket; /* the broker's socket (NULL: the library's default); must outlive the sampler */
        int timeout_ms;     /* a scrape's deadline; the broker calls' timeout */
        int wake_fd;        /* written to (an eventfd) after every attempt to sample */
} SamplerConfig;

/* Prepares a sampler (no thread yet): 0 or -ENOMEM. */
int sampler_new(Sampler **ret, const SamplerConfig *cfg);

/* Starts its thread: 0 or -errno. */
int sampler_start(Sampler *s);

/* Stops the thread and frees the sampler, or, when the thread is still inside a call to the broker
 * after a short while, leaves both to the process's exit (a stopping sidecar must not wait for a
 * stopped broker). */
void sampler_stop(Sampler *s);

/* A scrape arrived at now (CLOCK_MONOTONIC ms): the ticket its answer waits for (non-zero). A
 * sample that began less than 250 ms ago answers it, so that no client makes the broker work
 * more than four times a second. */
uint64_t sampler_want(Sampler *s, uint64_t now);

/* The answer to ticket: true with a reference to the exposition in *ret once an attempt for it
 * ended (a fresh sample, or only gpuipc_up 0 when the broker could not be reached), or, when late
 * (the scrape's deadline passed first), the last good sample with gpuipc_up 0; false when the
 * scrape should wait. */
bool sampler_answer(Sampler *s, uint64_t ticket, bool late, HttpBody **ret);

/* For /healthz: true when the broker answered the last attempt and none has been waiting for longer
 * than the deadline; else false, with why saying what is wrong. */
bool sampler_healthy(Sampler *s, uint64_t now, char *why, size_t cap);
