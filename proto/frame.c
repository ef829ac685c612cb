/* The fixed 12-byte frame header: magic "GIPC", version, fd count, reserved, body length (LE). */
#include <string.h>

#include "proto.h"

int proto_header_parse(const uint8_t *buf, size_t len, ProtoHeader *ret)
{
        uint32_t body;

        if (len < PROTO_HEADER_SIZE)
                return PROTO_E_NEED_MORE;
        if (memcmp(buf, PROTO_MAGIC, 4) != 0)
                return PROTO_E_MAGIC;
        if (buf[4] != PROTO_VERSION)
                return PROTO_E_VERSION;
        /* Reserved bytes must be zero so a later version can give them meaning. */
        if (buf[6] || buf[7])
                return PROTO_E_RESERVED;
        body = (uint32_t)buf[8] | (uint32_t)buf[9] << 8 | (uint32_t)buf[10] << 16 | (uint32_t)buf[11] << 24;
        if (body > PROTO_MAX_BODY || buf[5] > PROTO_MAX_FDS)
                return PROTO_E_TOO_BIG;
        *ret = (ProtoHeader){ .version = buf[4], .n_fds = buf[5], .body_len = body };
        return 0;
}

void proto_header_write(uint8_t out[PROTO_HEADER_SIZE], uint32_t body_len, uint8_t n_fds)
{
        memcpy(out, PROTO_MAGIC, 4);
        out[4] = PROTO_VERSION;
        out[5] = n_fds;
        out[6] = out[7] = 0;
        out[8] = body_len & 0xff;
        out[9] = (body_len >> 8) & 0xff;
        out[10] = (body_len >> 16) & 0xff;
        out[11] = (body_len >> 24) & 0xff;
}
