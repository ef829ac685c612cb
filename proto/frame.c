/* Frames: the fixed 12-byte header (magic "GIPC", version, fd count, reserved, body length LE),
 * proto_frame_encode, and proto_frame_decode, the one path by which the broker and the library
 * read a received frame: whatever either side accepts, the other side's encoder produced, and the
 * fuzzer checks both. Dependency: frame.c -> msg.c (the body codec), never the other way. */
#include <stdio.h>
#include <string.h>

#include "proto.h"

int proto_header_parse(const uint8_t *buf, size_t len, ProtoHeader *ret)
{
        uint32_t body;

        if (len < PROTO_HEADER_SIZE)
                return PROTO_E_LENGTH;
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

int proto_frame_encode(ProtoBuf *out, const ProtoMsg *m, uint8_t n_fds)
{
        static const uint8_t header_placeholder[PROTO_HEADER_SIZE];
        size_t start = out->len, body;
        int r;

        if (n_fds > PROTO_MAX_FDS)
                return PROTO_E_TOO_BIG;
        /* The header's room first: its body length is known only once the body is written. */
        r = proto_buf_append(out, header_placeholder, sizeof(header_placeholder));
        if (r < 0)
                return r;
        r = proto_record_encode(out, m);
        if (r < 0) {
                out->len = start;
                return r;
        }
        body = out->len - start - PROTO_HEADER_SIZE;
        if (body > PROTO_MAX_BODY) {
                out->len = start;
                return PROTO_E_TOO_BIG;
        }
        proto_header_write(out->data + start, (uint32_t)body, n_fds);
        return 0;
}

static bool is_field_error(int e)
{
        return e == PROTO_E_FIELD || e == PROTO_E_MISSING || e == PROTO_E_DUPLICATE || e == PROTO_E_UTF8;
}

int proto_frame_decode(const uint8_t *frame, size_t len, size_t n_fds, bool truncated, ProtoType expect, ProtoMsg *m,
                       ProtoFrameError *err)
{
        const uint8_t *body = frame + PROTO_HEADER_SIZE;
        ProtoHeader h;
        int e;

        *err = (ProtoFrameError){ .field = _PF_MAX };
        if (truncated) {
                snprintf(err->text, sizeof(err->text), "a frame exceeded the size limit or carried too many fds");
                return err->code = PROTO_E_TOO_BIG;
        }
        e = proto_header_parse(frame, len, &h);
        if (e == 0 && h.body_len != len - PROTO_HEADER_SIZE)
                e = PROTO_E_LENGTH;
        if (e) {
                snprintf(err->text, sizeof(err->text), "%s", proto_strerror(e));
                return err->code = e;
        }
        if (h.n_fds != n_fds) {
                snprintf(err->text, sizeof(err->text), "the header announces %u fds but the frame carries %zu", h.n_fds,
                         n_fds);
                return err->code = PROTO_E_FDS;
        }
        e = proto_msg_decode(body, h.body_len, m, &err->field);
        if (e == 0 && expect != PROTO_NONE && m->type != expect)
                e = PROTO_E_KIND;
        if (is_field_error(e)) {
                snprintf(err->text, sizeof(err->text), "field '%s' is %s", proto_field_name(err->field),
                         e == PROTO_E_MISSING     ? "missing"
                         : e == PROTO_E_DUPLICATE ? "given twice"
                         : e == PROTO_E_UTF8      ? "not valid UTF-8"
                                                  : "of the wrong type or too long");
                /* Well-formed but wrong: a request is answered with its id and the connection stays.
                 * Without a readable id no reply could be matched to its request (clients pipeline),
                 * so that is a violation: the client would otherwise wait for an answer forever. */
                if (expect == PROTO_REQUEST && (proto_peek_id(body, h.body_len, &err->id) != 0 || err->id == 0)) {
                        err->id = 0;
                        snprintf(err->text + strlen(err->text), sizeof(err->text) - strlen(err->text),
                                 ", and the request has no readable id to answer it with");
                }
        } else if (e == PROTO_E_KIND && expect == PROTO_REQUEST) {
                snprintf(err->text, sizeof(err->text), "peers may only send requests");
        } else if (e) {
                snprintf(err->text, sizeof(err->text), "%s", proto_strerror(e));
        }
        return err->code = e;
}
