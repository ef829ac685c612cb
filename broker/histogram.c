/* Fixed-bucket histograms; see histogram.h. */
#include "histogram.h"

#include <string.h>

void histogram_init(Histogram *h, const uint32_t *bounds_us, size_t n_bounds)
{
        memset(h, 0, sizeof(*h));
        h->bounds_us = bounds_us;
        /* Clamped to the counts array: extra bounds are dropped (their observations land in the
         * last bucket) rather than written past it. */
        h->n_bounds = n_bounds < HISTOGRAM_MAX_BOUNDS ? n_bounds : HISTOGRAM_MAX_BOUNDS;
}

void histogram_record(Histogram *h, uint64_t us)
{
        size_t i = 0;

        /* A linear scan of at most a dozen bounds, on every request: cheaper than a binary search at
         * this size. us <= bound counts in that bucket, Prometheus's "le". */
        while (i < h->n_bounds && us > h->bounds_us[i])
                i++;
        h->counts[i]++;
        h->count++;
        h->sum_us += us;
}

uint64_t histogram_cumulative(const Histogram *h, size_t i)
{
        uint64_t n = 0;

        for (size_t k = 0; k <= i && k <= h->n_bounds; k++)
                n += h->counts[k];
        return n;
}
