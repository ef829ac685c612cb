/* A fixed-bucket histogram of durations in microseconds, for the stats reply (and so for
 * Prometheus): recording is a short scan of at most HISTOGRAM_MAX_BOUNDS bounds and two additions,
 * cheap enough for every request. Pure; no allocation. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define HISTOGRAM_MAX_BOUNDS 16

typedef struct Histogram {
        const uint32_t *bounds_us; /* ascending upper bounds (inclusive) */
        size_t n_bounds;
        uint64_t counts[HISTOGRAM_MAX_BOUNDS + 1]; /* per bucket, not cumulative; the last: above every bound */
        uint64_t count, sum_us;
} Histogram;

/* Starts an empty histogram over n_bounds (at most HISTOGRAM_MAX_BOUNDS) ascending bounds, which
 * must outlive it. */
void histogram_init(Histogram *h, const uint32_t *bounds_us, size_t n_bounds);

void histogram_record(Histogram *h, uint64_t us);

/* Observations at or below bound i: the cumulative count Prometheus reports as le=bound. */
uint64_t histogram_cumulative(const Histogram *h, size_t i);
