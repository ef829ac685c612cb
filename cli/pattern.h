/* Data patterns for `gpuipcctl publish --fill` and `attach --verify`: generated the same way on
 * both sides, so a consumer can check every byte it received without any other channel. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum PatternType { PATTERN_COUNTER, PATTERN_BYTE, PATTERN_RANDOM } PatternType;

typedef struct Pattern {
        PatternType type;
        uint64_t arg; /* the byte value, or the random seed */
} Pattern;

/* "counter" (each 8-byte word holds its index), "byte:0xAB", "random:SEED". 0 or -EINVAL. */
int pattern_parse(const char *s, Pattern *ret);

/* Writes the pattern's bytes [offset, offset + len) into dst. offset must be a multiple of 8. */
void pattern_fill(const Pattern *p, size_t offset, void *dst, size_t len);

/* Compares src with the pattern's bytes [offset, offset + len); returns the index of the first
 * differing byte relative to offset, or SIZE_MAX when everything matches. */
size_t pattern_check(const Pattern *p, size_t offset, const void *src, size_t len);
