/* A bounded msgpack reader: a cursor over bytes that never reads past the end and never allocates.
 * Every container count is checked against the bytes that remain before anyone can act on it, which
 * is what msgpack-c 4.0's own unpacker does not do (it allocates whatever a header announces). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

typedef struct MpReader {
        const uint8_t *p, *end;
} MpReader;

/* Each returns 0, PROTO_E_MALFORMED (truncated or not msgpack) or PROTO_E_FIELD (another type). */
int mp_read_map(MpReader *r, uint32_t *ret_n);
int mp_read_array(MpReader *r, uint32_t *ret_n);
int mp_read_str(MpReader *r, const char **ret_s, uint32_t *ret_len);
int mp_read_bin(MpReader *r, const uint8_t **ret_b, uint32_t *ret_len);
int mp_read_uint(MpReader *r, uint64_t *ret_v);
int mp_read_bool(MpReader *r, bool *ret_v);

/* Skips one value of any type, descending at most depth levels into maps and arrays. */
int mp_skip(MpReader *r, unsigned depth);

/* The same, and PROTO_E_UTF8 when a string inside (a key or a value) is not valid UTF-8. */
int mp_skip_utf8(MpReader *r, unsigned depth);

static inline bool mp_at_end(const MpReader *r)
{
        return r->p == r->end;
}
