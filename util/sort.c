/* Heapsort (util/sort.h says why the broker does not use qsort). */
#include "sort.h"

#include <stdint.h>

static void swap_bytes(unsigned char *a, unsigned char *b, size_t size)
{
        while (size--) {
                unsigned char t = *a;
                *a++ = *b;
                *b++ = t;
        }
}

/* Moves the element at root down until the max-heap property holds again in base[0 .. n). */
static void sift_down(unsigned char *base, size_t root, size_t n, size_t size,
                      int (*cmp)(const void *, const void *))
{
        for (;;) {
                size_t child = 2 * root + 1, largest = root;

                if (child < n && cmp(base + child * size, base + largest * size) > 0)
                        largest = child;
                if (child + 1 < n && cmp(base + (child + 1) * size, base + largest * size) > 0)
                        largest = child + 1;
                if (largest == root)
                        return;
                swap_bytes(base + root * size, base + largest * size, size);
                root = largest;
        }
}

void sort_array(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
        unsigned char *b = base;

        if (n < 2 || size == 0)
                return;
        /* Heapify bottom-up from the last parent (O(n)), then move the largest to the end, one by
         * one: in place, and O(n log n) even on input chosen to be hostile, unlike quicksort. */
        for (size_t i = n / 2; i-- > 0;)
                sift_down(b, i, n, size, cmp);
        for (size_t end = n - 1; end > 0; end--) {
                swap_bytes(b, b + end * size, size);
                sift_down(b, 0, end, size, cmp);
        }
}
