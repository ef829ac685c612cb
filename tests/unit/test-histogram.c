/* broker/histogram.c: observations land in the bucket of the first bound at or above them, the
 * cumulative counts are what Prometheus calls le=bound, and count and sum cover everything. */
#include <stdint.h>

#include "check.h"
#include "histogram.h"
#include "macro.h"

static const uint32_t bounds[] = { 10, 100, 1000 };

/* Bounds are inclusive (le means "less than or equal"); values above the last go to +Inf only. */
static void test_histogram_buckets(void)
{
        static const uint64_t values[] = { 0, 10, 11, 100, 101, 999, 1000, 1001, UINT32_MAX };
        Histogram h;

        histogram_init(&h, bounds, ARRAY_SIZE(bounds));
        for (size_t i = 0; i < ARRAY_SIZE(values); i++)
                histogram_record(&h, values[i]);
        CHECK_EQ(histogram_cumulative(&h, 0), 2); /* 0, 10 */
        CHECK_EQ(histogram_cumulative(&h, 1), 4); /* + 11, 100 */
        CHECK_EQ(histogram_cumulative(&h, 2), 7); /* + 101, 999, 1000 */
        CHECK_EQ(histogram_cumulative(&h, 3), 9); /* the +Inf bucket: everything */
        CHECK_EQ(h.count, 9);
        CHECK_EQ(h.sum_us, 0 + 10 + 11 + 100 + 101 + 999 + 1000 + 1001 + (uint64_t)UINT32_MAX);
}

/* An empty histogram reports zeros; more bounds than fit are cut to HISTOGRAM_MAX_BOUNDS. */
static void test_histogram_limits(void)
{
        static uint32_t many[HISTOGRAM_MAX_BOUNDS + 4];
        Histogram h;

        histogram_init(&h, bounds, ARRAY_SIZE(bounds));
        for (size_t i = 0; i <= ARRAY_SIZE(bounds); i++)
                CHECK_EQ(histogram_cumulative(&h, i), 0);
        CHECK_EQ(h.count, 0);
        for (size_t i = 0; i < ARRAY_SIZE(many); i++)
                many[i] = (uint32_t)(i + 1);
        histogram_init(&h, many, ARRAY_SIZE(many));
        CHECK_EQ(h.n_bounds, HISTOGRAM_MAX_BOUNDS);
        histogram_record(&h, 1000);
        CHECK_EQ(histogram_cumulative(&h, HISTOGRAM_MAX_BOUNDS - 1), 0);
        CHECK_EQ(histogram_cumulative(&h, HISTOGRAM_MAX_BOUNDS), 1);
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_histogram_buckets);
        TEST_RUN(argc, argv, test_histogram_limits);
        return TEST_END();
}
