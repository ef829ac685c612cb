/* The broker's statistics as Prometheus metrics: each broker record mapped to a metric family with
 * a name in base units, its type and its own HELP text; histograms assembled from their bucket,
 * count and sum records. Pure: records in, text out. */
#pragma once

#include <stdbool.h>
#include <stdio.h>

#include "gpuipc.h"

/* The exposition format, version 0.0.4 (the HTTP Content-Type to announce it with). */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* What one scrape got from the broker: its statistics and its rings (a ring listing). */
typedef struct MetricsInput {
        bool up;           /* the broker answered: stats came from it */
        bool stale;        /* !up, but stats are the last the broker gave (it did not answer in time) */
        double sampled_at; /* when the stats came (Unix time, seconds); 0: unknown */
        const gpuipc_stat_t *stats;
        int n_stats;
        const gpuipc_ring_info_t *rings;
        int n_rings;
} MetricsInput;

/* Writes every family: gpuipc_up, gpuipc_build_info, then, when up or stale, gpuipc_sample_timestamp_
 * seconds, the families the stats hold, and one sample per ring in each gpuipc_ring_* family
 * (labelled ring="NAME": as many series as rings); nothing but up and build_info otherwise. Records
 * this release does not know are exported too, as gauges or counters (by their _total suffix) with
 * a HELP text saying so. */
void metrics_write_text(FILE *f, const MetricsInput *in);

/* The same families as one JSON array: [{"name", "type", "help", "samples": [{"name", "labels",
 * "value"}]}], sample values as numbers. */
void metrics_write_json(FILE *f, const MetricsInput *in);
