/* An in-place sort that makes no system call and allocates nothing. The broker sorts under its
 * seccomp filter: glibc's qsort switches, past 1 KiB of elements, to a merge sort that allocates a
 * copy and first asks the kernel how much memory the machine has (sysinfo), a call the filter
 * refuses; and what it does differs between glibc versions. A heapsort has neither dependency. */
#pragma once

#include <stddef.h>

/* Sorts n elements of size bytes at base into ascending order of cmp (qsort's contract, not
 * stable). O(n log n) comparisons, no allocation, no system call. */
void sort_array(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *));
