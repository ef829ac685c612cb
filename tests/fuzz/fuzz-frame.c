/* Fuzz target: proto_frame_decode (the one way broker and library read a frame), frame header
 * parse, message decode, listing iteration and the encoder.
 *
 * The input is tried two ways: as a frame (12-byte header, then the body it announces) and as a
 * bare body. Whatever decodes must re-encode (unless it carries an op or event name this version
 * does not know, which the encoder refuses), and the re-encoding must decode to the same fields;
 * encoding that again must give the same bytes. Records inside "items" get the same treatment. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fuzz.h"
#include "proto-eq.h"
#include "proto.h"

/* Decodes body (which must stay alive while m is used). */
static int decode(const uint8_t *body, size_t len, ProtoMsg *m)
{
        ProtoField f = _PF_MAX;
        int e = proto_msg_decode(body, len, m, &f);

        CHECK(e >= 0 && e <= PROTO_E_UTF8 && e != PROTO_E_RESERVED);
        if (e == PROTO_E_FIELD || e == PROTO_E_MISSING || e == PROTO_E_DUPLICATE || e == PROTO_E_UTF8)
                CHECK(f < _PF_MAX);
        CHECK(proto_strerror(e) != NULL);
        return e;
}

/* Every record of a decoded listing re-encodes to itself. */
static void check_items(const ProtoMsg *m)
{
        ProtoIter it;
        ProtoMsg rec;
        uint32_t seen = 0;
        int r;

        proto_iter_init(&it, &m->items);
        while ((r = proto_iter_next(&it, &rec)) == 1) {
                ProtoBuf b = { 0 };
                ProtoRaw raw;
                ProtoIter it2;
                ProtoMsg back;
                int e;

                seen++;
                CHECK(seen <= m->items.count);
                CHECK_EQ(rec.type, PROTO_RECORD);
                /* [record] as a one-element listing. */
                CHECK_EQ(proto_buf_append(&b, "\x91", 1), 0);
                e = proto_record_encode(&b, &rec);
                if ((proto_has(&rec, PF_OP) && rec.op == PROTO_OP_UNKNOWN) ||
                    (proto_has(&rec, PF_EVENT) && rec.event == PROTO_EV_UNKNOWN)) {
                        CHECK_EQ(e, -EINVAL);
                        proto_buf_free(&b);
                        continue;
                }
                CHECK_EQ(e, 0);
                raw = (ProtoRaw){ b.data, (uint32_t)b.len, 1 };
                proto_iter_init(&it2, &raw);
                CHECK_EQ(proto_iter_next(&it2, &back), 1);
                CHECK(proto_msg_eq(&rec, &back, NULL));
                CHECK_EQ(proto_iter_next(&it2, &back), 0);
                proto_buf_free(&b);
        }
        /* Records are checked as they are read: a bad one ends the listing with its error. */
        CHECK(r == 0 || (r >= PROTO_E_MALFORMED && r <= PROTO_E_UTF8 && r != PROTO_E_RESERVED));
        if (r == 0)
                CHECK_EQ(seen, m->items.count);
}

static void check_roundtrip(const uint8_t *body, size_t len, const ProtoMsg *m, uint8_t n_fds)
{
        ProtoBuf b1 = { 0 }, b2 = { 0 };
        ProtoHeader h;
        ProtoMsg m2, m3;
        ProtoField diff = _PF_MAX;
        uint64_t id;
        int e;

        if (proto_has(m, PF_META))
                CHECK(proto_meta_valid(m->meta.ptr, m->meta.len));
        if (proto_has(m, PF_ITEMS))
                check_items(m);
        /* The id can be found without a full decode (used for errors on requests that fail). Only
         * for messages without items: peek skips values within the meta depth only. */
        if (proto_has(m, PF_ID) && !proto_has(m, PF_ITEMS)) {
                CHECK_EQ(proto_peek_id(body, len, &id), 0);
                CHECK_EQ(id, m->id);
        }

        e = proto_frame_encode(&b1, m, n_fds);
        if ((proto_has(m, PF_OP) && m->op == PROTO_OP_UNKNOWN) ||
            (proto_has(m, PF_EVENT) && m->event == PROTO_EV_UNKNOWN)) {
                CHECK_EQ(e, -EINVAL);
                CHECK_EQ(b1.len, 0);
                proto_buf_free(&b1);
                return;
        }
        CHECK_EQ(e, 0);
        /* The canonical encoding is never longer than what it came from. */
        CHECK(b1.len - PROTO_HEADER_SIZE <= len);
        CHECK_EQ(proto_header_parse(b1.data, b1.len, &h), 0);
        CHECK_EQ(h.n_fds, n_fds);
        CHECK_EQ(h.body_len, b1.len - PROTO_HEADER_SIZE);
        CHECK_EQ(decode(b1.data + PROTO_HEADER_SIZE, h.body_len, &m2), 0);
        if (!proto_msg_eq(m, &m2, &diff)) {
                fprintf(stderr, "round trip changed field %s\n", proto_field_name(diff));
                CHECK(!"round trip differs");
        }
        /* A fixpoint: encoding the decoded copy gives the same bytes. */
        CHECK_EQ(proto_frame_encode(&b2, &m2, n_fds), 0);
        CHECK_EQ(b2.len, b1.len);
        CHECK(memcmp(b1.data, b2.data, b1.len) == 0);
        CHECK_EQ(decode(b2.data + PROTO_HEADER_SIZE, b2.len - PROTO_HEADER_SIZE, &m3), 0);
        CHECK(proto_msg_eq(&m2, &m3, NULL));
        proto_buf_free(&b1);
        proto_buf_free(&b2);
}

static void try_body(const uint8_t *body, size_t len, uint8_t n_fds)
{
        ProtoMsg m;
        uint64_t id;

        if (decode(body, len, &m) == 0) {
                CHECK(m.type == PROTO_REQUEST || m.type == PROTO_REPLY || m.type == PROTO_EVENT);
                check_roundtrip(body, len, &m, n_fds);
        } else {
                (void)proto_peek_id(body, len, &id);
        }
}

/* The input as a received record, with and without an fd, as the broker and as a client read it:
 * an error is named, only a request's field error is answerable (by its id), and what decodes is
 * what the receiver expects. */
static void try_frame(const uint8_t *data, size_t size)
{
        for (unsigned i = 0; i < 4; i++) {
                ProtoType expect = i & 1 ? PROTO_REQUEST : PROTO_NONE;
                ProtoFrameError err;
                ProtoMsg m;
                int e = proto_frame_decode(data, size, i >> 1, false, expect, &m, &err);

                CHECK_EQ(e, err.code);
                if (e == 0) {
                        CHECK(expect == PROTO_NONE || m.type == expect);
                        continue;
                }
                CHECK(err.text[0] != 0);
                if (err.id)
                        CHECK(expect == PROTO_REQUEST && err.field < _PF_MAX);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        ProtoHeader h;
        int e;

        try_frame(data, size);

        e = proto_header_parse(data, size, &h);
        if (size < PROTO_HEADER_SIZE)
                CHECK_EQ(e, PROTO_E_LENGTH);
        if (e == 0) {
                CHECK_EQ(h.version, PROTO_VERSION);
                CHECK(h.n_fds <= PROTO_MAX_FDS);
                CHECK(h.body_len <= PROTO_MAX_BODY);
                /* The body the header announces, or what there is of it. */
                if (size - PROTO_HEADER_SIZE >= h.body_len)
                        try_body(data + PROTO_HEADER_SIZE, h.body_len, h.n_fds);
                else
                        try_body(data + PROTO_HEADER_SIZE, size - PROTO_HEADER_SIZE, h.n_fds);
        }
        /* The whole input as a body, as metadata, and as a listing. */
        try_body(data, size, 0);
        if (proto_meta_valid(data, size)) {
                CHECK(size <= PROTO_MAX_META);
                CHECK(size > 0 && (data[0] >> 4 == 0x8 || data[0] == 0xde || data[0] == 0xdf));
        }
        {
                ProtoRaw raw = { data, (uint32_t)(size > UINT32_MAX ? UINT32_MAX : size), 0 };
                ProtoIter it;
                ProtoMsg rec;
                unsigned n = 0;

                proto_iter_init(&it, &raw);
                while (proto_iter_next(&it, &rec) == 1)
                        CHECK(++n <= size);
        }
        return 0;
}
