/* A tiny msgpack writer for hand-made test bodies: exact control over every encoding (widths,
 * lengths that lie, wrong types), which a real packer would not produce. Appends to a ProtoBuf;
 * allocation failures abort the test. */
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

static inline void w_raw(ProtoBuf *b, const void *p, size_t n)
{
        if (proto_buf_append(b, p, n) < 0)
                abort();
}

static inline void w_u8(ProtoBuf *b, uint8_t v)
{
        w_raw(b, &v, 1);
}

/* Big-endian integer of n bytes. */
static inline void w_be(ProtoBuf *b, uint64_t v, unsigned n)
{
        for (unsigned i = n; i-- > 0;)
                w_u8(b, (uint8_t)(v >> (8 * i)));
}

/* Typed header with an explicit width: w_hdr(b, 0xdf, 4, count) writes a map32 header. */
static inline void w_hdr(ProtoBuf *b, uint8_t type, unsigned width, uint64_t v)
{
        w_u8(b, type);
        w_be(b, v, width);
}

static inline void w_map(ProtoBuf *b, uint32_t n)
{
        if (n < 16)
                w_u8(b, (uint8_t)(0x80 | n));
        else if (n <= 0xffff)
                w_hdr(b, 0xde, 2, n);
        else
                w_hdr(b, 0xdf, 4, n);
}

static inline void w_arr(ProtoBuf *b, uint32_t n)
{
        if (n < 16)
                w_u8(b, (uint8_t)(0x90 | n));
        else if (n <= 0xffff)
                w_hdr(b, 0xdc, 2, n);
        else
                w_hdr(b, 0xdd, 4, n);
}

static inline void w_strn(ProtoBuf *b, const char *s, size_t n)
{
        if (n < 32)
                w_u8(b, (uint8_t)(0xa0 | n));
        else if (n <= 0xff)
                w_hdr(b, 0xd9, 1, n);
        else if (n <= 0xffff)
                w_hdr(b, 0xda, 2, n);
        else
                w_hdr(b, 0xdb, 4, n);
        w_raw(b, s, n);
}

static inline void w_str(ProtoBuf *b, const char *s)
{
        w_strn(b, s, strlen(s));
}

static inline void w_bin(ProtoBuf *b, const void *p, size_t n)
{
        if (n <= 0xff)
                w_hdr(b, 0xc4, 1, n);
        else if (n <= 0xffff)
                w_hdr(b, 0xc5, 2, n);
        else
                w_hdr(b, 0xc6, 4, n);
        w_raw(b, p, n);
}

static inline void w_uint(ProtoBuf *b, uint64_t v)
{
        if (v < 128)
                w_u8(b, (uint8_t)v);
        else if (v <= 0xff)
                w_hdr(b, 0xcc, 1, v);
        else if (v <= 0xffff)
                w_hdr(b, 0xcd, 2, v);
        else if (v <= 0xffffffff)
                w_hdr(b, 0xce, 4, v);
        else
                w_hdr(b, 0xcf, 8, v);
}

static inline void w_bool(ProtoBuf *b, int v)
{
        w_u8(b, v ? 0xc3 : 0xc2);
}

/* "key": unsigned value; "key": "string". */
static inline void w_kv_u(ProtoBuf *b, const char *k, uint64_t v)
{
        w_str(b, k);
        w_uint(b, v);
}

static inline void w_kv_s(ProtoBuf *b, const char *k, const char *v)
{
        w_str(b, k);
        w_str(b, v);
}
