/* Bounded msgpack reader (format: github.com/msgpack/msgpack/blob/master/spec.md). */
#include "mpread.h"

#include <string.h>

#include "proto.h"

static inline size_t left(const MpReader *r)
{
        return (size_t)(r->end - r->p);
}

/* The next type byte, or PROTO_E_MALFORMED at the end or on 0xc1, which msgpack never uses: a body
 * with it is garbage, not a field of the wrong type. */
static inline int peek(const MpReader *r, uint8_t *ret)
{
        if (left(r) < 1 || *r->p == 0xc1)
                return PROTO_E_MALFORMED;
        *ret = *r->p;
        return 0;
}

/* Reads a big-endian unsigned integer of n bytes after the type byte. */
static int take_be(MpReader *r, unsigned n, uint64_t *ret)
{
        uint64_t v = 0;

        if (left(r) < n)
                return PROTO_E_MALFORMED;
        for (unsigned i = 0; i < n; i++)
                v = (v << 8) | r->p[i];
        r->p += n;
        *ret = v;
        return 0;
}

/* Reads a container header; each entry needs at least one byte (two for a map), so a count that
 * cannot fit in what remains is rejected here, before anything could be sized from it. */
static int read_container(MpReader *r, uint8_t fix_lo, uint8_t fix_hi, uint8_t t16, uint8_t t32,
                          unsigned per_entry, uint32_t *ret_n)
{
        uint64_t n;
        uint8_t t;
        int e;

        if (peek(r, &t))
                return PROTO_E_MALFORMED;
        if (t >= fix_lo && t <= fix_hi) {
                r->p++;
                n = t & 0x0f;
        } else if (t == t16 || t == t32) {
                r->p++;
                e = take_be(r, t == t16 ? 2 : 4, &n);
                if (e)
                        return e;
        } else {
                return PROTO_E_FIELD;
        }
        if (n > left(r) / per_entry)
                return PROTO_E_MALFORMED;
        *ret_n = (uint32_t)n;
        return 0;
}

int mp_read_map(MpReader *r, uint32_t *ret_n)
{
        return read_container(r, 0x80, 0x8f, 0xde, 0xdf, 2, ret_n);
}

int mp_read_array(MpReader *r, uint32_t *ret_n)
{
        return read_container(r, 0x90, 0x9f, 0xdc, 0xdd, 1, ret_n);
}

/* str and bin share a shape (a length, then that many bytes) but not their type bytes: a str where
 * a bin is wanted is a field of the wrong type, so the caller's want_str picks which are accepted.
 * The result points into the body (no copy): it lives as long as the frame does. */
static int read_blob(MpReader *r, bool want_str, const uint8_t **ret, uint32_t *ret_len)
{
        uint64_t n;
        uint8_t t;
        int e;

        if (peek(r, &t))
                return PROTO_E_MALFORMED;
        if (want_str && t >= 0xa0 && t <= 0xbf) {
                r->p++;
                n = t & 0x1f;
        } else if ((want_str && t >= 0xd9 && t <= 0xdb) || (!want_str && t >= 0xc4 && t <= 0xc6)) {
                unsigned width = want_str ? 1u << (t - 0xd9) : 1u << (t - 0xc4);
                r->p++;
                e = take_be(r, width, &n);
                if (e)
                        return e;
        } else {
                return PROTO_E_FIELD;
        }
        if (n > left(r))
                return PROTO_E_MALFORMED;
        *ret = r->p;
        *ret_len = (uint32_t)n;
        r->p += n;
        return 0;
}

int mp_read_str(MpReader *r, const char **ret_s, uint32_t *ret_len)
{
        return read_blob(r, true, (const uint8_t **)ret_s, ret_len);
}

int mp_read_bin(MpReader *r, const uint8_t **ret_b, uint32_t *ret_len)
{
        return read_blob(r, false, ret_b, ret_len);
}

int mp_read_uint(MpReader *r, uint64_t *ret_v)
{
        uint8_t t;

        if (peek(r, &t))
                return PROTO_E_MALFORMED;
        if (t <= 0x7f) {
                r->p++;
                *ret_v = t;
                return 0;
        }
        if (t >= 0xcc && t <= 0xcf) {
                r->p++;
                return take_be(r, 1u << (t - 0xcc), ret_v);
        }
        /* Non-negative values in signed encodings are accepted: some packers prefer them. */
        if (t >= 0xd0 && t <= 0xd3) {
                uint64_t v;
                unsigned n = 1u << (t - 0xd0);
                int e;

                r->p++;
                e = take_be(r, n, &v);
                if (e)
                        return e;
                /* A set sign bit is a negative number, which no unsigned field can hold: refused
                 * rather than read as a huge value. */
                if (n < 8 && (v >> (8 * n - 1)))
                        return PROTO_E_FIELD;
                if (n == 8 && (v >> 63))
                        return PROTO_E_FIELD;
                *ret_v = v;
                return 0;
        }
        return PROTO_E_FIELD;
}

int mp_read_bool(MpReader *r, bool *ret_v)
{
        uint8_t t;

        if (peek(r, &t))
                return PROTO_E_MALFORMED;
        if (t != 0xc2 && t != 0xc3)
                return PROTO_E_FIELD;
        *ret_v = t == 0xc3;
        r->p++;
        return 0;
}

/* Size of the payload that follows a type byte for the fixed-width scalar types, -1 otherwise. */
static int scalar_width(uint8_t t)
{
        if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3)
                return 0;
        switch (t) {
        case 0xcc: case 0xd0: return 1;
        case 0xcd: case 0xd1: return 2;
        case 0xca: case 0xce: case 0xd2: return 4;
        case 0xcb: case 0xcf: case 0xd3: return 8;
        case 0xd4: return 2;  /* fixext 1: type + 1 */
        case 0xd5: return 3;
        case 0xd6: return 5;
        case 0xd7: return 9;
        case 0xd8: return 17;
        default: return -1;
        }
}

/* Steps over one value without decoding it (unknown keys, metadata). depth bounds the recursion:
 * each nesting level costs a stack frame, so a body of nested one-entry maps would otherwise run
 * the stack out long before it ran out of bytes. Scalars and blobs need no depth, containers one
 * level each. utf8: every string must be valid UTF-8 (metadata: the broker echoes it to every
 * reader, who may render it as JSON; docs/protocol.md "Strings are UTF-8"). */
static int skip(MpReader *r, unsigned depth, bool utf8)
{
        const uint8_t *b;
        uint32_t n;
        uint8_t t;
        int w, e;

        if (peek(r, &t))
                return PROTO_E_MALFORMED;
        w = scalar_width(t);
        if (w >= 0) {
                if (left(r) < (size_t)w + 1)
                        return PROTO_E_MALFORMED;
                r->p += w + 1;
                return 0;
        }
        if ((t >= 0xa0 && t <= 0xbf) || (t >= 0xd9 && t <= 0xdb)) {
                e = mp_read_str(r, (const char **)&b, &n);
                if (e == 0 && utf8 && !proto_utf8_valid((const char *)b, n))
                        return PROTO_E_UTF8;
                return e;
        }
        if (t >= 0xc4 && t <= 0xc6)
                return mp_read_bin(r, &b, &n);
        if (t >= 0xc7 && t <= 0xc9) { /* ext 8/16/32: length, type byte, data */
                uint64_t len;
                r->p++;
                e = take_be(r, 1u << (t - 0xc7), &len);
                if (e)
                        return e;
                if (len + 1 > left(r))
                        return PROTO_E_MALFORMED;
                r->p += len + 1;
                return 0;
        }
        if (depth == 0)
                return PROTO_E_MALFORMED;
        if ((t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf) {
                e = mp_read_map(r, &n);
                if (e)
                        return e;
                /* 2n values: n can be 2^32 - 1, so the bound is computed in 64 bits. */
                for (uint64_t i = 0; i < 2ull * n; i++)
                        if ((e = skip(r, depth - 1, utf8)))
                                return e;
                return 0;
        }
        if ((t >= 0x90 && t <= 0x9f) || t == 0xdc || t == 0xdd) {
                e = mp_read_array(r, &n);
                if (e)
                        return e;
                for (uint32_t i = 0; i < n; i++)
                        if ((e = skip(r, depth - 1, utf8)))
                                return e;
                return 0;
        }
        return PROTO_E_MALFORMED; /* 0xc1 is never used */
}

int mp_skip(MpReader *r, unsigned depth)
{
        return skip(r, depth, false);
}

int mp_skip_utf8(MpReader *r, unsigned depth)
{
        return skip(r, depth, true);
}
