/* What the pipeline example's frames hold, and its shared command line. A frame starts with its
 * number, and every 8-byte word after it is derived from (frame, word index), so a consumer can
 * tell a stale or torn frame from the right one. */
#pragma once

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Options {
        uint64_t frames;
        unsigned slots, consumers, index;
        size_t frame_size;
        const char *prefix, *group;
        bool full_check;
} Options;

static inline uint64_t frame_word(uint64_t frame, uint64_t i)
{
        uint64_t x = (frame << 32) ^ (i * 0x9e3779b97f4a7c15ULL);
        x ^= x >> 29;
        return x * 0xbf58476d1ce4e5b9ULL;
}

static inline void frame_write(void *p, size_t size, uint64_t frame)
{
        uint64_t *w = p;

        w[0] = frame;
        for (size_t i = 1; i < size / 8; i++)
                w[i] = frame_word(frame, i);
}

/* Checks the frame number and, unless full, one word in every 4 KiB page. */
static inline bool frame_check(const void *p, size_t size, uint64_t frame, bool full)
{
        const uint64_t *w = p;
        size_t step = full ? 1 : 512;

        if (w[0] != frame)
                return false;
        for (size_t i = 1; i < size / 8; i += step)
                if (w[i] != frame_word(frame, i))
                        return false;
        return w[size / 8 - 1] == frame_word(frame, size / 8 - 1);
}

static inline void frame_name(char *buf, size_t cap, const char *prefix, uint64_t frame)
{
        snprintf(buf, cap, "%s/frame/%llu", prefix, (unsigned long long)frame);
}

static inline Options options_parse(int argc, char **argv)
{
        static const struct option longopts[] = {
                { "frames", required_argument, NULL, 'f' },
                { "slots", required_argument, NULL, 's' },
                { "consumers", required_argument, NULL, 'c' },
                { "size", required_argument, NULL, 'b' },
                { "prefix", required_argument, NULL, 'p' },
                { "index", required_argument, NULL, 'i' },
                { "full-check", no_argument, NULL, 'F' },
                {}
        };
        Options o = { 1000, 4, 3, 0, 1 << 20, "pipeline", "pipeline/start", false };
        int c;

        while ((c = getopt_long(argc, argv, "f:s:c:b:p:i:F", longopts, NULL)) >= 0) {
                switch (c) {
                case 'f': o.frames = strtoull(optarg, NULL, 10); break;
                case 's': o.slots = (unsigned)strtoul(optarg, NULL, 10); break;
                case 'c': o.consumers = (unsigned)strtoul(optarg, NULL, 10); break;
                case 'b': o.frame_size = strtoull(optarg, NULL, 10); break;
                case 'p': o.prefix = optarg; break;
                case 'i': o.index = (unsigned)strtoul(optarg, NULL, 10); break;
                case 'F': o.full_check = true; break;
                default:
                        fprintf(stderr, "usage: %s [--frames N] [--slots K] [--consumers M] [--size BYTES] "
                                        "[--prefix P] [--index I] [--full-check]\n", argv[0]);
                        exit(2);
                }
        }
        if (!o.frames || !o.slots || !o.consumers || o.frame_size < 16 || o.frame_size % 8) {
                fprintf(stderr, "%s: frames, slots and consumers must be positive; size a multiple of 8, >= 16\n",
                        argv[0]);
                exit(2);
        }
        return o;
}
