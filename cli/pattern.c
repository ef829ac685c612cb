/* Fill and verify patterns; see pattern.h. */
#include "pattern.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A whole number of s up to max. strtoull's base 0 accepts 0x.. and 0.. too (byte:0xff); *end must
 * be the string's end so that a typo such as byte:25x is refused rather than read as 25. strtoull
 * also takes a sign, after blanks too (-1 wraps to the largest value), and saturates past its range
 * with ERANGE: both are refused, not read as another number. */
static int parse_number(const char *s, uint64_t max, uint64_t *ret)
{
        unsigned long long v;
        char *end;

        errno = 0;
        v = strtoull(s, &end, 0);
        if (end == s || *end || errno || memchr(s, '-', (size_t)(end - s)) || v > max)
                return -EINVAL;
        *ret = v;
        return 0;
}

int pattern_parse(const char *s, Pattern *ret)
{
        uint64_t v;

        if (strcmp(s, "counter") == 0) {
                *ret = (Pattern){ PATTERN_COUNTER, 0 };
                return 0;
        }
        if (strncmp(s, "byte:", 5) == 0) {
                if (parse_number(s + 5, 255, &v) < 0)
                        return -EINVAL;
                *ret = (Pattern){ PATTERN_BYTE, v };
                return 0;
        }
        if (strncmp(s, "random:", 7) == 0) {
                if (parse_number(s + 7, UINT64_MAX, &v) < 0)
                        return -EINVAL;
                *ret = (Pattern){ PATTERN_RANDOM, v };
                return 0;
        }
        return -EINVAL;
}

/* The pattern's 8-byte word number i (little-endian in memory). */
static uint64_t word_at(const Pattern *p, uint64_t i)
{
        uint64_t x;

        switch (p->type) {
        case PATTERN_COUNTER:
                return i;
        case PATTERN_BYTE:
                return p->arg * 0x0101010101010101ULL;
        case PATTERN_RANDOM:
                /* splitmix64 of (seed, index): any word can be computed without the ones before it */
                x = p->arg + (i + 1) * 0x9e3779b97f4a7c15ULL;
                x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
                x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
                return x ^ (x >> 31);
        }
        return 0;
}

/* Words are numbered from the buffer's start, not from dst: a range filled at any offset (a slot,
 * a view) holds the same bytes as the whole buffer filled at once, so one side may fill in pieces
 * and the other verify the whole. offset must be a multiple of 8 for that to hold. */
void pattern_fill(const Pattern *p, size_t offset, void *dst, size_t len)
{
        uint8_t *d = dst;
        size_t i = 0;

        for (; i + 8 <= len; i += 8) {
                uint64_t w = word_at(p, (offset + i) / 8);
                memcpy(d + i, &w, 8);
        }
        /* A tail shorter than a word gets the word's first bytes: what a longer fill would have
         * put there, so pieces of any length still join into the whole buffer's bytes. */
        if (i < len) {
                uint64_t w = word_at(p, (offset + i) / 8);
                memcpy(d + i, &w, len - i);
        }
}

size_t pattern_check(const Pattern *p, size_t offset, const void *src, size_t len)
{
        const uint8_t *s = src;
        uint8_t expect[8];

        for (size_t i = 0; i < len; i += 8) {
                size_t n = len - i < 8 ? len - i : 8;
                uint64_t w = word_at(p, (offset + i) / 8);

                /* The last, partial word is compared on its first n bytes, as pattern_fill wrote
                 * them. */
                memcpy(expect, &w, 8);
                /* memcmp first (the common case is a match); the byte loop only names the first
                 * byte that differs, for the error message. */
                if (memcmp(s + i, expect, n) != 0) {
                        for (size_t j = 0; j < n; j++)
                                if (s[i + j] != expect[j])
                                        return i + j;
                }
        }
        return SIZE_MAX;
}
