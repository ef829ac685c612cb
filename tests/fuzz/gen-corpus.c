/* Writes the seed corpora of the fuzz targets: meaningful inputs each target should start from.
 *
 *     gen-corpus OUTDIR      (creates OUTDIR/frame, OUTDIR/registry, OUTDIR/policy, OUTDIR/ring)
 *
 * frame: a valid frame of every request, typical replies and every event, plus frames that
 * exercise the decoder's limits (the msgpack-c map32 trap, deep metadata, duplicates, limits).
 * registry: operation programs in fuzz-registry.c's encoding, one per lifetime scenario.
 * policy: policy files, valid and not. ring: rings' shared memory as fuzz-ring.c reads it (a member
 * page, what the reader knows, a control page, the broker's seats), in each mode and scribbled. The
 * output is committed (tests/fuzz/corpus/); run this
 * again only when the formats change. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mpwrite.h"
#include "proto.h"
#include "ring.h"

static const char *outdir;

static void write_file(const char *sub, const char *name, const void *data, size_t len)
{
        char path[4096];
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", outdir, sub);
        if (mkdir(path, 0755) < 0 && errno != EEXIST) {
                perror(path);
                exit(1);
        }
        snprintf(path, sizeof(path), "%s/%s/%s", outdir, sub, name);
        f = fopen(path, "wb");
        if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
                perror(path);
                exit(1);
        }
}

/* ---- frames ---- */

static void frame(const char *name, const ProtoMsg *m, uint8_t n_fds)
{
        ProtoBuf b = { 0 };

        if (proto_frame_encode(&b, m, n_fds) != 0) {
                fprintf(stderr, "cannot encode %s\n", name);
                exit(1);
        }
        write_file("frame", name, b.data, b.len);
        proto_buf_free(&b);
}

/* A frame around hand-made body bytes. */
static void raw_frame(const char *name, const ProtoBuf *body)
{
        ProtoBuf b = { 0 };
        uint8_t hdr[PROTO_HEADER_SIZE];

        proto_header_write(hdr, (uint32_t)body->len, 0);
        w_raw(&b, hdr, sizeof(hdr));
        w_raw(&b, body->data, body->len);
        write_file("frame", name, b.data, b.len);
        proto_buf_free(&b);
}

static ProtoMsg request(ProtoOp op, uint64_t id)
{
        ProtoMsg m = { 0 };

        m.op = op;
        m.id = id;
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID);
        return m;
}

#define SET(m, field, member, value) ((m).member = (value), proto_set(&(m), (field)))

/* What several frames carry: a small metadata map ({"dtype": "f16", "shape": [1, 1080, 1920]}), a
 * cuda-legacy handle, and a GPU and a MIG UUID. */
static const uint8_t meta[] = { 0x82, 0xa5, 'd', 't', 'y', 'p', 'e', 0xa3, 'f', '1', '6', 0xa5,
                                's', 'h', 'a', 'p', 'e', 0x93, 0x01, 0xcd, 0x04, 0x38, 0xcd, 0x07, 0x80 };
static const uint8_t handle[PROTO_LEGACY_HANDLE_SIZE] = { 0xde, 0xad, 0xbe, 0xef, [63] = 1 };
static const char *const gpus[] = { "GPU-5f0b2d9e-3c41-4a7e-9d61-0123456789ab", "MIG-1c2d" };

/* The requests that open a connection and share memory: hello, ping, a publish of each kind,
 * and a buffer published again. */
static void gen_requests_connect_publish(void)
{
        ProtoMsg m;

        m = request(PROTO_OP_HELLO, 1);
        SET(m, PF_VERSION, version, PROTO_VERSION);
        SET(m, PF_PID, pid, 4242);
        SET(m, PF_PIDNS, pidns, 4026531836u);
        SET(m, PF_LABEL, label, proto_str("camera-producer"));
        m.gpus[0] = proto_str(gpus[0]);
        m.gpus[1] = proto_str(gpus[1]);
        SET(m, PF_GPUS, n_gpus, 2);
        frame("req-hello", &m, 0);
        m = request(PROTO_OP_PING, 2);
        frame("req-ping", &m, 0);
        m = request(PROTO_OP_PUBLISH, 3);
        SET(m, PF_NAME, name, proto_str("frames/cam0"));
        SET(m, PF_KIND, kind, PROTO_KIND_MEMFD);
        SET(m, PF_SIZE, size, 1 << 20);
        SET(m, PF_WRITABLE, writable, true);
        SET(m, PF_BROKER_HELD, broker_held, true);
        SET(m, PF_RETIRE_AFTER, retire_after, 2);
        SET(m, PF_META, meta, ((ProtoRaw){ meta, sizeof(meta), 2 }));
        frame("req-publish-memfd", &m, 1);
        m = request(PROTO_OP_PUBLISH, 4);
        SET(m, PF_NAME, name, proto_str("weights/layer0"));
        SET(m, PF_KIND, kind, PROTO_KIND_CUDA_VMM);
        SET(m, PF_SIZE, size, 2u << 20);
        SET(m, PF_DEVICE, device, proto_str(gpus[0]));
        frame("req-publish-vmm", &m, 1);
        m = request(PROTO_OP_PUBLISH, 5);
        SET(m, PF_NAME, name, proto_str("legacy/0"));
        SET(m, PF_KIND, kind, PROTO_KIND_CUDA_LEGACY);
        SET(m, PF_SIZE, size, 4096);
        SET(m, PF_OFFSET, offset, 512);
        SET(m, PF_DEVICE, device, proto_str(gpus[0]));
        SET(m, PF_HANDLE, handle, ((ProtoStr){ (const char *)handle, sizeof(handle) }));
        frame("req-publish-legacy", &m, 0);
        m = request(PROTO_OP_PUBLISH, 6);
        SET(m, PF_NAME, name, proto_str("frames/cam0"));
        SET(m, PF_BUFFER, buffer, 17);
        SET(m, PF_META, meta, ((ProtoRaw){ (const uint8_t *)"\x80", 1, 0 }));
        frame("req-publish-again", &m, 0);
}

/* The requests a consumer and a producer make about one buffer. */
static void gen_requests_buffer(void)
{
        ProtoMsg m;

        m = request(PROTO_OP_ATTACH, 7);
        SET(m, PF_NAME, name, proto_str("frames/cam0"));
        SET(m, PF_TIMEOUT_MS, timeout_ms, 30000);
        frame("req-attach-name", &m, 0);
        m = request(PROTO_OP_ATTACH, 8);
        SET(m, PF_BUFFER, buffer, 17);
        frame("req-attach-id", &m, 0);
        m = request(PROTO_OP_RELEASE, 9);
        SET(m, PF_BUFFER, buffer, 17);
        frame("req-release", &m, 0);
        m = request(PROTO_OP_RETIRE, 10);
        SET(m, PF_BUFFER, buffer, 17);
        frame("req-retire", &m, 0);
        m = request(PROTO_OP_FREE, 11);
        SET(m, PF_BUFFER, buffer, 17);
        frame("req-free", &m, 0);
        m = request(PROTO_OP_UNMAP, 19);
        SET(m, PF_BUFFER, buffer, 17);
        frame("req-unmap", &m, 0);
}

/* The listing and inspection requests, of buffers and of rings. */
static void gen_requests_listings(void)
{
        ProtoMsg m;

        m = request(PROTO_OP_LIST, 12);
        SET(m, PF_PREFIX, prefix, proto_str("frames/"));
        SET(m, PF_AFTER, after, 3);
        SET(m, PF_LIMIT, limit, 100);
        frame("req-list", &m, 0);
        m = request(PROTO_OP_STAT, 13);
        SET(m, PF_NAME, name, proto_str("frames/cam0"));
        frame("req-stat", &m, 0);
        m = request(PROTO_OP_PEERS, 14);
        frame("req-peers", &m, 0);
        m = request(PROTO_OP_STATS, 15);
        frame("req-stats", &m, 0);
        m = request(PROTO_OP_RINGS, 20);
        SET(m, PF_PREFIX, prefix, proto_str("cams/"));
        SET(m, PF_AFTER, after, 2);
        frame("req-rings", &m, 0);
        m = request(PROTO_OP_RING_STAT, 21);
        SET(m, PF_NAME, name, proto_str("cams/front"));
        frame("req-ring-stat", &m, 0);
}

/* Subscriptions and rendezvous groups. */
static void gen_requests_subscriptions(void)
{
        ProtoMsg m;

        m = request(PROTO_OP_SUBSCRIBE, 16);
        SET(m, PF_PREFIX, prefix, proto_str("frames/"));
        frame("req-subscribe", &m, 0);
        m = request(PROTO_OP_UNSUBSCRIBE, 17);
        SET(m, PF_SUB, sub, 3);
        frame("req-unsubscribe", &m, 0);
        m = request(PROTO_OP_GROUP_JOIN, 18);
        SET(m, PF_GROUP, group, proto_str("gang"));
        SET(m, PF_MEMBERS, members, 4);
        SET(m, PF_TIMEOUT_MS, timeout_ms, 10000);
        frame("req-group-join", &m, 0);
}

/* Replies with fields: a publish, an error with its text, an attach with everything, hello. */
static void gen_replies(void)
{
        ProtoMsg m;

        memset(&m, 0, sizeof(m));
        SET(m, PF_REPLY, reply, 3);
        SET(m, PF_STATUS, status, 0);
        SET(m, PF_BUFFER, buffer, 17);
        SET(m, PF_GENERATION, generation, 5);
        frame("reply-publish", &m, 0);
        memset(&m, 0, sizeof(m));
        SET(m, PF_REPLY, reply, 7);
        SET(m, PF_STATUS, status, PROTO_STATUS_SAME_PID);
        SET(m, PF_ERROR, error, proto_str("pidns"));
        SET(m, PF_MESSAGE, message, proto_str("buffer 'legacy/0' is cuda-legacy: its producer is in another "
                                              "PID namespace. Fix: set shareProcessNamespace: true"));
        frame("reply-error", &m, 0);
        memset(&m, 0, sizeof(m));
        SET(m, PF_REPLY, reply, 7);
        SET(m, PF_STATUS, status, 0);
        SET(m, PF_BUFFER, buffer, 17);
        SET(m, PF_NAME, name, proto_str("frames/cam0"));
        SET(m, PF_GENERATION, generation, 5);
        SET(m, PF_KIND, kind, PROTO_KIND_MEMFD);
        SET(m, PF_STATE, state, PROTO_STATE_LIVE);
        SET(m, PF_SIZE, size, 1 << 20);
        SET(m, PF_OFFSET, offset, 0);
        SET(m, PF_WRITABLE, writable, true);
        SET(m, PF_BROKER_HELD, broker_held, false);
        SET(m, PF_REFS, refs, 2);
        SET(m, PF_HOLDERS, holders, 1);
        SET(m, PF_OWNER, owner, 1);
        SET(m, PF_UID, uid, 1000);
        SET(m, PF_PID, pid, 4242);
        SET(m, PF_CACHED, cached, false);
        SET(m, PF_META, meta, ((ProtoRaw){ meta, sizeof(meta), 2 }));
        frame("reply-attach", &m, 1);
        memset(&m, 0, sizeof(m));
        SET(m, PF_REPLY, reply, 1);
        SET(m, PF_STATUS, status, 0);
        SET(m, PF_VERSION, version, PROTO_VERSION);
        SET(m, PF_PEER, peer, 1);
        SET(m, PF_EPOCH, epoch, 0x1234567890ULL);
        SET(m, PF_PIDNS, pidns, 4026531836u);
        SET(m, PF_PIDNS_SAME, pidns_same, true);
        SET(m, PF_LABEL, label, proto_str("gpuipc-broker 0.1.0"));
        frame("reply-hello", &m, 0);
}

/* A listing whose items are records (a buffer and a stat). */
static void gen_reply_list(void)
{
        ProtoMsg m, rec = { 0 };
        ProtoBuf items = { 0 };

        w_arr(&items, 2);
        SET(rec, PF_BUFFER, buffer, 17);
        SET(rec, PF_NAME, name, proto_str("frames/cam0"));
        SET(rec, PF_STATE, state, PROTO_STATE_RETIRED);
        SET(rec, PF_META, meta, ((ProtoRaw){ meta, sizeof(meta), 2 }));
        proto_record_encode(&items, &rec);
        memset(&rec, 0, sizeof(rec));
        SET(rec, PF_NAME, name, proto_str("references"));
        SET(rec, PF_VALUE, value, 12);
        proto_record_encode(&items, &rec);
        memset(&m, 0, sizeof(m));
        SET(m, PF_REPLY, reply, 12);
        SET(m, PF_STATUS, status, 0);
        SET(m, PF_MORE, more, true);
        SET(m, PF_AFTER, after, 17);
        SET(m, PF_ITEMS, items, ((ProtoRaw){ items.data, (uint32_t)items.len, 2 }));
        frame("reply-list", &m, 0);
        proto_buf_free(&items);
}

/* A ring with two seats: one seated and behind, one waiting for its member. */
static void gen_reply_ring_stat(void)
{
        ProtoMsg m, rec = { 0 };
        ProtoBuf items = { 0 };

        w_arr(&items, 2);
        SET(rec, PF_INDEX, index, 0);
        SET(rec, PF_GENERATION, generation, 3);
        SET(rec, PF_SEAT, seat, PROTO_SEAT_SEATED);
        SET(rec, PF_PEER, peer, 4);
        SET(rec, PF_LABEL, label, proto_str("detector"));
        SET(rec, PF_POSITION, position, 1200);
        SET(rec, PF_LAG, lag, 7);
        proto_record_encode(&items, &rec);
        memset(&rec, 0, sizeof(rec));
        SET(rec, PF_INDEX, index, 1);
        SET(rec, PF_GENERATION, generation, 2);
        SET(rec, PF_SEAT, seat, PROTO_SEAT_WAITING);
        proto_record_encode(&items, &rec);
        memset(&m, 0, sizeof(m));
        SET(m, PF_REPLY, reply, 21);
        SET(m, PF_STATUS, status, 0);
        SET(m, PF_NAME, name, proto_str("cams/front"));
        SET(m, PF_MODE, mode, PROTO_MODE_BACKPRESSURE);
        SET(m, PF_SLOTS, slots, 8);
        SET(m, PF_MEMBERS, members, 4);
        SET(m, PF_HEAD, head, 1207);
        SET(m, PF_TAKEN, taken, 2);
        SET(m, PF_LAG, lag, 7);
        SET(m, PF_ITEMS, items, ((ProtoRaw){ items.data, (uint32_t)items.len, 2 }));
        frame("reply-ring-stat", &m, 0);
        proto_buf_free(&items);
}

/* Every event, with the fields the broker sends for it. */
static void gen_events(void)
{
        ProtoMsg m;

        for (int ev = PROTO_EV_PUBLISHED; ev < PROTO_EV_UNKNOWN; ev++) {
                char name[64];

                memset(&m, 0, sizeof(m));
                SET(m, PF_EVENT, event, ev);
                SET(m, PF_BUFFER, buffer, 17);
                SET(m, PF_GENERATION, generation, 5);
                SET(m, PF_NAME, name, proto_str("frames/cam0"));
                SET(m, PF_KIND, kind, PROTO_KIND_CUDA_VMM);
                if (ev != PROTO_EV_DRAINED && ev != PROTO_EV_FREED)
                        SET(m, PF_SUB, sub, 2);
                if (ev == PROTO_EV_REVOKED)
                        SET(m, PF_REASON, reason, proto_str("producer (peer 1, pid 4242, uid 1000) disconnected"));
                snprintf(name, sizeof(name), "event-%s", proto_event_name(ev));
                frame(name, &m, 0);
        }
}

/* Structures the decoder must refuse (or accept) without effort: the msgpack-c map32 trap,
 * metadata at the depth limit, a duplicate key, an unknown op with unknown keys. */
static void gen_edges_structure(void)
{
        ProtoBuf body = { 0 };

        w_raw(&body, "\xdf\xff\xff\xff\x5e\x81\xa1" "a\x01\xc0\xc0", 11);
        raw_frame("edge-map32-trap", &body);
        proto_buf_free(&body);
        w_map(&body, 3);
        w_kv_s(&body, "op", "ping");
        w_kv_u(&body, "id", 1);
        w_str(&body, "meta");
        for (int i = 0; i < PROTO_MAX_DEPTH; i++) {
                w_map(&body, 1);
                w_str(&body, "k");
        }
        w_u8(&body, 0xc0);
        raw_frame("edge-meta-depth-max", &body);
        proto_buf_free(&body);
        w_map(&body, 3);
        w_kv_s(&body, "op", "ping");
        w_kv_u(&body, "id", 1);
        w_kv_u(&body, "id", 2);
        raw_frame("edge-duplicate-key", &body);
        proto_buf_free(&body);
        w_map(&body, 4);
        w_kv_s(&body, "op", "frobnicate");
        w_kv_u(&body, "id", 1);
        w_str(&body, "x-future");
        w_raw(&body, "\xc7\x02\x05\xaa\xbb", 5);
        w_str(&body, "x-nested");
        w_raw(&body, "\x92\xcb\x3f\xf0\0\0\0\0\0\0\x81\xa0\xc0", 13);
        raw_frame("edge-unknown-op-and-keys", &body);
        proto_buf_free(&body);
}

/* Values at the edge of their type: a name of PROTO_MAX_NAME bytes, integers sent wider than they
 * need (int64 and uint64 encodings of small numbers). */
static void gen_edges_values(void)
{
        ProtoBuf body = { 0 };

        {
                char name[PROTO_MAX_NAME];

                memset(name, 'n', sizeof(name));
                w_map(&body, 3);
                w_kv_s(&body, "op", "publish");
                w_kv_u(&body, "id", 1);
                w_str(&body, "name");
                w_strn(&body, name, sizeof(name));
                raw_frame("edge-name-max", &body);
                proto_buf_free(&body);
        }
        w_map(&body, 3);
        w_kv_s(&body, "op", "release");
        w_str(&body, "id");
        w_raw(&body, "\xd3\x00\x00\x00\x00\x00\x00\x00\x05", 9); /* int64 */
        w_str(&body, "buffer");
        w_raw(&body, "\xcf\x00\x00\x00\x00\x00\x00\x00\x11", 9);
        raw_frame("edge-wide-ints", &body);
        proto_buf_free(&body);
}

/* Encodings the decoder must refuse: strings that are not UTF-8, a field error in a request
 * without an id, a header with a reserved byte set. */
static void gen_edges_encoding(void)
{
        ProtoBuf body = { 0 };

        /* Strings that are not UTF-8: a label (cut inside a character) and a string inside meta. */
        w_map(&body, 4);
        w_kv_s(&body, "op", "hello");
        w_kv_u(&body, "id", 1);
        w_kv_u(&body, "version", 1);
        w_str(&body, "label");
        w_strn(&body, "caf\xc3", 4);
        raw_frame("edge-label-not-utf8", &body);
        proto_buf_free(&body);
        w_map(&body, 4);
        w_kv_s(&body, "op", "publish");
        w_kv_u(&body, "id", 1);
        w_kv_s(&body, "name", "m");
        w_str(&body, "meta");
        w_map(&body, 1);
        w_strn(&body, "\xed\xa0\x80", 3); /* a surrogate, as a key */
        w_kv_u(&body, "x", 1);
        raw_frame("edge-meta-key-not-utf8", &body);
        proto_buf_free(&body);
        /* A field error in a request without an id. */
        w_map(&body, 2);
        w_kv_s(&body, "op", "attach");
        w_kv_u(&body, "name", 5);
        raw_frame("edge-field-error-no-id", &body);
        proto_buf_free(&body);
        /* A header with a reserved byte set. */
        {
                ProtoMsg ping = request(PROTO_OP_PING, 1);
                ProtoBuf b = { 0 };

                if (proto_frame_encode(&b, &ping, 0) != 0)
                        exit(1);
                b.data[6] = 0x01;
                write_file("frame", "edge-reserved-bytes", b.data, b.len);
                proto_buf_free(&b);
        }
}

/* frame: one function per message family, each writing its own files. */
static void gen_frames(void)
{
        gen_requests_connect_publish();
        gen_requests_buffer();
        gen_requests_listings();
        gen_requests_subscriptions();
        gen_replies();
        gen_reply_list();
        gen_reply_ring_stat();
        gen_events();
        gen_edges_structure();
        gen_edges_values();
        gen_edges_encoding();
}

/* ---- registry programs (fuzz-registry.c's encoding) ---- */

enum {
        OP_ADD, OP_REMOVE, OP_HELLO, OP_PUBLISH, OP_PUBLISH_AGAIN, OP_ATTACH, OP_ATTACH_ID, OP_RELEASE,
        OP_RETIRE, OP_FREE, OP_UNMAP, OP_SUBSCRIBE, OP_UNSUBSCRIBE, OP_JOIN, OP_TIME, OP_RECLAIM,
        OP_RING_CREATE, OP_RING_PART, OP_RING_FILL, OP_RING_JOIN, OP_RING_LEAVE, OP_RING_EVICT, OP_RING_CLOSE,
        OP_RING_ATTACH,
};

/* Names: a, a/b, a/c, b, frames/0, frames/1, c, d. Prefixes: "", a, a/, b, x.
 * Publish flags: kind (0 memfd, 1 cuda-vmm, 2 cuda-legacy), broker-held, retire_after, meta. */
#define K_MEMFD 0
#define K_VMM 1
#define K_LEGACY 2
#define HELD 4
#define RETIRE_AFTER(n) ((n) << 3)
#define META 0x20
#define CLEAR_META 0x40
#define WITH_FD 0x80
/* Hello byte: GPUs (byte % 3 of GPU-a, GPU-b; from GPU-b on with 8), declared pidns (byte >> 2) % 3.
 * Peer creds byte: uid index (0,1: 1000; 2: 1001; 3: 0), pid 0 with 4, pidns index << 3. */
#define UID1000 0
#define UID1001 2
#define UID0 3
#define OUTSIDE 4
#define PIDNS(n) ((n) << 3)
/* Attach timeouts: 0, 1, 50, 1000 ms, infinite. */
#define T_NONE 0
#define T_50 2
#define T_1000 3
/* Group byte: group index (g1, g2), members - 1 << 1. */
#define GROUP(g, members) ((g) | ((members) - 1) << 1)
/* Rings r/0, r/1, a. Create: RING(ring, mode) | RESTORED, then SHAPE(members, slots) (latest
 * rounds slots up to members + 2; stream has cuda-vmm slots on GPU-a), then the declared seats
 * (bit i: seat i, epoch 1 + i with the generation 3). Part: PART(ring, index), a variant (0 right,
 * 4 kind, 5 size, 6 writability, 7 device), an id byte (0: the broker picks). Fill: the ring.
 * Join: ring (| REJOIN: seat y % 4 at the epoch it waits for), y. Evict: ring, seat (| STALE).
 * Attach: ring, part index. Time: 200 ends the restart grace. */
#define RING(r, mode) ((r) | (mode) << 2)
#define BP 0
#define LATEST 1
#define STREAM 2
#define RESTORED 0x10
#define SHAPE(members, slots) (((members) - 1) | ((slots) - 1) << 2)
#define PART(r, index) ((r) | (index) << 2)
#define REJOIN 0x80
#define STALE 4
#define GRACE_END 200

static void program(const char *name, const uint8_t *ops, size_t len)
{
        write_file("registry", name, ops, len);
}

#define PROGRAM(name, ...)                                       \
        do {                                                     \
                static const uint8_t ops_[] = { __VA_ARGS__ };   \
                program(name, ops_, sizeof(ops_));               \
        } while (0)

static void gen_ring_programs(void)
{
        PROGRAM("ring-backpressure", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ADD, 2, UID1001, OP_RING_CREATE, 0,
                RING(0, BP), SHAPE(2, 1), 0, OP_RING_JOIN, 1, 0, 0, OP_RING_FILL, 0, OP_RING_JOIN, 1, 0, 0,
                OP_RING_JOIN, 2, 0, 0, OP_RING_JOIN, 1, 0, 0, OP_RING_ATTACH, 1, 0, 0, OP_RING_ATTACH, 1, 0, 1,
                OP_RING_ATTACH, 1, 0, 2, OP_RING_ATTACH, 1, 0, 3, OP_RING_ATTACH, 2, 0, 3, OP_RELEASE, 1, 0, 0,
                OP_RING_LEAVE, 2, 0, OP_RING_EVICT, 0, 0, 0 | STALE, OP_RING_EVICT, 0, 0, 0, OP_RING_JOIN, 2, 0, 0,
                OP_RING_CLOSE, 1, 0, OP_RING_CLOSE, 0, 0, OP_RING_ATTACH, 2, 0, 0, OP_FREE, 0, 0, 0);
        PROGRAM("ring-latest-producer-dies", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_RING_CREATE, 0,
                RING(1, LATEST), SHAPE(1, 1), 0, OP_RING_FILL, 1, OP_RING_JOIN, 1, 1, 0, OP_RING_ATTACH, 1, 1, 0,
                OP_RING_ATTACH, 1, 1, 2, OP_RING_ATTACH, 1, 1, 4, OP_REMOVE, 0, OP_RING_JOIN, 1, 1, 0);
        PROGRAM("ring-stream-member-dies", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ADD, 2, UID1001, OP_HELLO, 1,
                1, OP_HELLO, 2, 1, OP_RING_CREATE, 0, RING(0, STREAM), SHAPE(2, 1), 0, OP_RING_FILL, 0,
                OP_RING_JOIN, 1, 0, 0, OP_RING_JOIN, 2, 0, 0, OP_RING_ATTACH, 1, 0, 4, OP_RING_ATTACH, 1, 0, 5,
                OP_RING_ATTACH, 2, 0, 5, OP_RING_ATTACH, 2, 0, 3, OP_REMOVE, 1, OP_RING_JOIN, 1, 0, 0);
        PROGRAM("ring-parts", OP_ADD, 0, UID1000, OP_ADD, 3, UID1000, OP_RING_CREATE, 0, RING(2, STREAM),
                SHAPE(1, 2), 0, OP_RING_PART, 0, PART(2, 0), 0, 0, OP_RING_PART, 0, PART(2, 0), 0, 0,
                OP_RING_PART, 0, PART(2, 1), 4, 0, OP_RING_PART, 0, PART(2, 1), 5, 0, OP_RING_PART, 0, PART(2, 1),
                6, 0, OP_RING_PART, 0, PART(2, 1), 7, 0, OP_RING_PART, 3, PART(2, 1), 0, 0, OP_RING_PART, 0,
                PART(2, 4), 5 | 8, 0, OP_RING_PART, 0, PART(2, 4), 5 | 16, 0, OP_RING_PART, 0, PART(2, 5), 0, 0,
                OP_RING_PART, 0, PART(1, 0), 0, 0, OP_RING_FILL, 2, OP_RING_CREATE, 3, RING(0, BP), SHAPE(3, 5),
                0, OP_RING_FILL, 0);
        PROGRAM("ring-restored", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ADD, 2, UID1001, OP_RING_JOIN, 1,
                0 | REJOIN, 0, OP_RING_JOIN, 2, 0 | REJOIN, 1, OP_RING_CREATE, 0, RING(0, BP) | RESTORED,
                SHAPE(3, 1), 1 | 4, OP_RING_FILL, 0 | 0x80, OP_RING_JOIN, 2, 0, 0, OP_RING_JOIN, 3, 0, 0,
                OP_TIME, GRACE_END, OP_RING_JOIN, 2, 0, 0, OP_RING_JOIN, 1, 0 | REJOIN, 2);
        PROGRAM("ring-restored-after-grace", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_TIME, GRACE_END,
                OP_RING_JOIN, 1, 1 | REJOIN, 0, OP_RING_CREATE, 0, RING(1, LATEST) | RESTORED, SHAPE(2, 4), 3,
                OP_RING_JOIN, 1, 1 | REJOIN, 0, OP_RING_FILL, 1, OP_RING_JOIN, 1, 1, 0);
        PROGRAM("ring-evict-reserved", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_RING_CREATE, 0,
                RING(0, BP) | RESTORED, SHAPE(1, 1), 1, OP_RING_FILL, 0, OP_RING_JOIN, 1, 0, 0, OP_RING_EVICT, 0, 0,
                0 | STALE, OP_RING_EVICT, 0, 0, 0, OP_RING_JOIN, 1, 0, 0, OP_RING_EVICT, 0, 0, 0);
        /* A seat whose member left, or was evicted, or died, waits for new parts; the old ones are
         * nobody's (attach flag 4: the part last let go of at that index). */
        PROGRAM("ring-seat-renewed", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ADD, 2, UID1001, OP_RING_CREATE, 0,
                RING(0, BP), SHAPE(1, 1), 0, OP_RING_FILL, 0, OP_RING_JOIN, 1, 0, 0, OP_RING_ATTACH, 1, 0, 2,
                OP_RING_LEAVE, 1, 0, OP_RING_JOIN, 2, 0, 0, OP_RING_ATTACH, 1, 4, 2, OP_RING_ATTACH, 2, 4, 2,
                OP_RING_FILL, 0, OP_RING_JOIN, 2, 0, 0, OP_RING_ATTACH, 2, 4, 2, OP_RING_ATTACH, 2, 0, 2,
                OP_RING_JOIN, 1, 0, 0, OP_RING_EVICT, 0, 0, 0, OP_RING_JOIN, 1, 0, 0, OP_RING_ATTACH, 2, 4, 2,
                OP_RING_FILL, 0, OP_RING_JOIN, 1, 0, 0);
        PROGRAM("ring-stream-seat-renewed", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ADD, 2, UID1001, OP_HELLO,
                1, 1, OP_HELLO, 2, 1, OP_RING_CREATE, 0, RING(0, STREAM), SHAPE(2, 1), 0, OP_RING_FILL, 0,
                OP_RING_JOIN, 1, 0, 0, OP_RING_JOIN, 2, 0, 0, OP_RING_ATTACH, 1, 0, 2, OP_RING_ATTACH, 1, 0, 4,
                OP_REMOVE, 1, OP_ADD, 1, UID1001, OP_HELLO, 1, 1, OP_RING_JOIN, 1, 0, 0, OP_RING_ATTACH, 1, 4, 2,
                OP_RING_ATTACH, 1, 4, 4, OP_RING_FILL, 0, OP_RING_JOIN, 1, 0, 0, OP_RING_ATTACH, 1, 4, 2,
                OP_RING_ATTACH, 1, 0, 2, OP_RING_ATTACH, 1, 0, 4);
        PROGRAM("ring-claims-refused", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_RING_JOIN, 1, 1 | REJOIN, 0,
                OP_RING_JOIN, 1, 2 | REJOIN, 1, OP_RING_JOIN, 1, 0 | REJOIN, 2, OP_RING_JOIN, 1, 0 | REJOIN, 3,
                OP_RECLAIM, 1, 0, 0, OP_RING_CREATE, 0, RING(0, BP) | RESTORED, SHAPE(2, 1), 0, OP_TIME,
                GRACE_END);
}

static void gen_registry(void)
{
        PROGRAM("lifetime", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_PUBLISH, 0, 0, K_MEMFD, 0, OP_ATTACH, 1, 0,
                T_NONE, OP_ATTACH, 1, 0, T_NONE, OP_RELEASE, 1, 0, 0, OP_RETIRE, 0, 0, 0, OP_RELEASE, 1, 0, 0,
                OP_FREE, 0, 0, 0);
        PROGRAM("wait-then-publish", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ATTACH, 1, 0, T_1000, OP_ATTACH,
                1, 0, T_50, OP_TIME, 3, OP_PUBLISH, 0, 0, K_MEMFD, 0, OP_TIME, 200);
        PROGRAM("wait-timeout", OP_ADD, 1, UID1001, OP_ATTACH, 1, 1, T_50, OP_ATTACH, 1, 2, T_1000, OP_TIME, 10,
                OP_TIME, 100);
        PROGRAM("held-orphan-retired-by-uid", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_PUBLISH, 0, 0,
                K_MEMFD | HELD, 0, OP_ATTACH, 1, 0, T_NONE, OP_REMOVE, 0, OP_ATTACH, 1, 0, T_NONE, OP_ADD, 2,
                UID1000, OP_RETIRE, 2, 0, 0, OP_RELEASE, 1, 0, 0, OP_RELEASE, 1, 0, 0);
        PROGRAM("held-orphan-taken-over", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_HELLO, 1, 1, OP_PUBLISH, 0, 4,
                K_VMM | HELD, 0, OP_ATTACH, 1, 4, T_NONE, OP_REMOVE, 0, OP_ADD, 0, UID1000, OP_PUBLISH, 0, 4,
                K_MEMFD, 0, OP_RELEASE, 1, 0, 0);
        PROGRAM("producer-death-revokes", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ADD, 2, UID1001,
                OP_SUBSCRIBE, 2, 0, OP_PUBLISH, 0, 1, K_MEMFD, 0, OP_PUBLISH, 0, 2, K_MEMFD, 0, OP_ATTACH, 1, 1,
                T_NONE, OP_ATTACH, 2, 2, T_NONE, OP_RELEASE, 2, 1, 0, OP_RETIRE, 0, 1, 0, OP_REMOVE, 0);
        PROGRAM("consumer-death-drains", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_PUBLISH, 0, 0, K_MEMFD, 0,
                OP_ATTACH, 1, 0, T_NONE, OP_ATTACH, 1, 1, T_1000, OP_JOIN, 1, GROUP(0, 2), 50, OP_RETIRE, 0, 0,
                0, OP_REMOVE, 1);
        PROGRAM("groups", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ADD, 2, UID0, OP_JOIN, 0, GROUP(0, 3), 100,
                OP_JOIN, 1, GROUP(0, 3), 10, OP_JOIN, 2, GROUP(0, 3), 100, OP_JOIN, 0, GROUP(1, 3), 10, OP_JOIN,
                1, GROUP(1, 2), 10, OP_JOIN, 1, GROUP(1, 3), 10, OP_REMOVE, 0, OP_TIME, 10, OP_JOIN, 2,
                GROUP(0, 1), 5);
        PROGRAM("subscriptions", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_SUBSCRIBE, 1, 0, OP_SUBSCRIBE, 1, 2,
                OP_PUBLISH, 0, 1, K_MEMFD, 0, OP_PUBLISH, 0, 3, K_MEMFD, 0, OP_RETIRE, 0, 0, 0, OP_UNSUBSCRIBE,
                1, 0, OP_PUBLISH, 0, 1, K_MEMFD, 0, OP_UNSUBSCRIBE, 1, 255);
        PROGRAM("legacy-pidns", OP_ADD, 0, UID1000 | PIDNS(1), OP_ADD, 1, UID1001 | PIDNS(2), OP_ADD, 2,
                UID1001 | OUTSIDE | PIDNS(1), OP_ADD, 3, UID0 | PIDNS(1), OP_HELLO, 1, 1, OP_HELLO, 2, 1 | 4,
                OP_HELLO, 3, 1, OP_PUBLISH, 0, 3, K_LEGACY, 0, OP_ATTACH, 1, 3, T_NONE, OP_ATTACH, 2, 3, T_NONE,
                OP_ATTACH, 3, 3, T_NONE, OP_REMOVE, 0);
        PROGRAM("vmm-device", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_HELLO, 1, 10, OP_PUBLISH, 0, 4,
                K_VMM, 0, OP_ATTACH, 1, 4, T_NONE, OP_PUBLISH, 0, 1, K_VMM, 1, OP_ATTACH, 1, 1, T_NONE);
        PROGRAM("publish-again", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_PUBLISH, 0, 0, K_MEMFD | META, 0,
                OP_ATTACH, 1, 0, T_NONE, OP_PUBLISH_AGAIN, 0, 0, 0, 0, OP_RETIRE, 0, 0, 0, OP_RELEASE, 1, 0, 0,
                OP_PUBLISH_AGAIN, 0, 2, CLEAR_META, 0, OP_ATTACH, 1, 2, T_NONE, OP_RELEASE, 1, 0, 0, OP_RETIRE, 0,
                0, 0, OP_PUBLISH_AGAIN, 0, 0, WITH_FD, 0, OP_PUBLISH_AGAIN, 1, 0, 0, 0);
        PROGRAM("fd-cached-unmap", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_PUBLISH, 0, 0, K_MEMFD, 0,
                OP_ATTACH, 1, 0, T_NONE, OP_RELEASE, 1, 0, 0, OP_ATTACH_ID, 1, 0, 0, OP_UNMAP, 1, 0, 0,
                OP_ATTACH, 1, 0, T_NONE, OP_RELEASE, 1, 0, 0, OP_RELEASE, 1, 0, 0, OP_FREE, 0, 0, 0);
        PROGRAM("retire-after-waiters", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ADD, 2, UID1001, OP_ATTACH,
                1, 3, T_1000, OP_ATTACH, 2, 3, T_1000, OP_ATTACH, 1, 3, T_1000, OP_PUBLISH, 0, 3,
                K_MEMFD | RETIRE_AFTER(2), 0, OP_RELEASE, 1, 0, 0, OP_RELEASE, 2, 0, 0, OP_PUBLISH, 0, 3,
                K_MEMFD | RETIRE_AFTER(1), 0);
        PROGRAM("quotas", OP_ADD, 0, UID1000, OP_ADD, 1, UID1000, OP_ADD, 2, UID1000, OP_PUBLISH, 0, 0, K_MEMFD,
                0, OP_PUBLISH, 0, 1, K_MEMFD, 0, OP_PUBLISH, 0, 2, K_MEMFD, 0, OP_PUBLISH, 1, 3, K_MEMFD, 0,
                OP_PUBLISH, 1, 4, K_MEMFD, 0, OP_PUBLISH, 1, 5, K_MEMFD, 0, OP_PUBLISH, 1, 6, K_LEGACY, 0,
                OP_PUBLISH, 1, 7, K_LEGACY, 0,
                OP_SUBSCRIBE, 0, 0, OP_SUBSCRIBE, 0, 1, OP_SUBSCRIBE, 0, 2, OP_ATTACH, 1, 0, T_1000, OP_ATTACH, 1,
                0, T_NONE, OP_ATTACH, 1, 0, T_NONE);
        PROGRAM("free-live-and-admin", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ADD, 2, UID0, OP_PUBLISH, 0, 0,
                K_MEMFD, 0, OP_ATTACH, 1, 0, T_NONE, OP_FREE, 1, 0, 0, OP_FREE, 0, 0, 0, OP_RELEASE, 1, 0, 0,
                OP_PUBLISH, 0, 1, K_MEMFD | HELD, 0, OP_REMOVE, 0, OP_RETIRE, 2, 0, 1);
        PROGRAM("shutdown", OP_ADD, 0, UID1000, OP_ADD, 1, UID1001, OP_ATTACH, 0, 0, T_1000, OP_JOIN, 1,
                GROUP(1, 2), 10, OP_TIME, 255, OP_TIME, 1);
        gen_ring_programs();
}

/* ---- policies ---- */

/* ---- rings: fuzz-ring.c's input ---- */

static void put_u64(ProtoBuf *b, uint64_t v)
{
        for (int i = 0; i < 8; i++) {
                uint8_t byte = (uint8_t)(v >> (8 * i));
                w_raw(b, &byte, 1);
        }
}

/* A member page, the reader's epoch/start/head/frame/slots, a control page, the broker's mode and
 * one selector per seat (fuzz-ring.c says what they mean). */
static void ring_input(const char *name, const RingMember *page, uint64_t head, const RingCtl *ctl, RingMode mode,
                       const uint8_t *seats, size_t n_seats)
{
        ProtoBuf b = { 0 };
        uint8_t m = (uint8_t)mode;

        w_raw(&b, page, sizeof(*page));
        put_u64(&b, page->epoch);
        put_u64(&b, ctl->member[0].start);
        put_u64(&b, head);
        put_u64(&b, head + 1);
        put_u64(&b, ctl->n_slots - 1);
        w_raw(&b, ctl, sizeof(*ctl));
        w_raw(&b, &m, 1);
        w_raw(&b, seats, n_seats);
        write_file("ring", name, b.data, b.len);
        proto_buf_free(&b);
}

static void gen_rings(void)
{
        static RingCtl ctl;
        /* Seat 0: the control page's membership, its page mapped; 1: the same without its page; 2: the
         * member page's epoch; 3: a membership the control page let go; 4: eight bytes of epoch; 5:
         * seated with a start beyond head; 6: free. */
        static const uint8_t seats[] = { 1, 5, 2, 1, 3, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 1, 0 };
        RingMember page = { .epoch = 3, .released = 90, .wake = 7 };

        ctl = (RingCtl){ .magic = RING_MAGIC, .version = RING_LAYOUT_VERSION, .n_slots = 9, .n_members = 7,
                         .mode = RING_BACKPRESSURE, .slot_size = 16384, .head = 100, .head_slot = 3 };
        for (int i = 0; i < 7; i++)
                ctl.member[i] = (RingMemberSlot){ .epoch = 3 + (uint64_t)i, .start = 10, .state = RING_MEMBER_ACTIVE };
        ctl.member[3].state = RING_MEMBER_FREE;
        ctl.member[5].start = 1000; /* a broken producer's: positions stay at most head */
        ring_input("read-backpressure", &page, 100, &ctl, RING_BACKPRESSURE, seats, sizeof(seats));
        ring_input("read-stream", &page, 100, &ctl, RING_STREAM, seats, sizeof(seats));
        page = (RingMember){ .epoch = 3, .released = UINT64_MAX, .held = 1ull << 62, .sleeping = 1,
                            .taken = UINT64_MAX };
        ring_input("read-scribbled", &page, 100, &ctl, RING_BACKPRESSURE, seats, sizeof(seats));
        ctl.mode = RING_LATEST;
        ring_input("read-latest-scribbled", &page, 100, &ctl, RING_LATEST, seats, sizeof(seats));
        page = (RingMember){ .epoch = 3, .held = 97 };
        ring_input("read-latest", &page, 100, &ctl, RING_LATEST, seats, sizeof(seats));
        ctl.magic ^= 1;
        ring_input("read-bad-ctl", &page, 100, &ctl, RING_LATEST, seats, sizeof(seats));
        /* Layouts a hostile producer may hand its members (ring_ctl_check refuses each at join). */
        ctl.magic ^= 1;
        ctl.head_slot = 9;
        ring_input("ctl-head-slot-past-end", &page, 100, &ctl, RING_LATEST, seats, sizeof(seats));
        ctl.head_slot = 3;
        ctl.mode = RING_STREAM;
        ring_input("ctl-mode-not-declared", &page, 100, &ctl, RING_LATEST, seats, sizeof(seats));
        ctl.mode = RING_LATEST;
        ctl.n_slots = 1000;
        ring_input("ctl-slots-past-limit", &page, 100, &ctl, RING_LATEST, seats, sizeof(seats));
        ctl.n_slots = 9;
        ctl.version = RING_LAYOUT_VERSION + 1;
        ring_input("ctl-version", &page, 100, &ctl, RING_LATEST, seats, sizeof(seats));
}

static void policy(const char *name, const char *text)
{
        write_file("policy", name, text, strlen(text));
}

static void gen_policies(void)
{
        policy("documented", "# comment\nallow publish,attach uid=1000 prefix=frames/\n"
                             "allow attach gid=2000 prefix=frames/\ndeny all any\n");
        policy("admin", "allow admin uid=0\nallow all any prefix=scratch/\n");
        policy("crlf-comments", "\t allow attach uid=5 prefix=x/  # trailing\r\n#deny all any\r\n\r\n"
                                "deny publish any\r\nallow publish uid=5");
        policy("empty", "");
        policy("err-too-few", "allow all\n");
        policy("err-who", "allow all uid=root\n");
        policy("err-actions", "allow publish,fly any\n");
        policy("err-line-3", "allow all any\n\nbogus all any\n");
        write_file("policy", "err-nul", "allow all any\nallow\0 all any\n", 29);
        {
                char line[300] = "allow all any prefix=";
                memset(line + strlen(line), 'p', 255);
                policy("prefix-max", line);
        }
}

int main(int argc, char **argv)
{
        if (argc != 2) {
                fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
                return 2;
        }
        outdir = argv[1];
        if (mkdir(outdir, 0755) < 0 && errno != EEXIST) {
                perror(outdir);
                return 1;
        }
        gen_frames();
        gen_registry();
        gen_policies();
        gen_rings();
        return 0;
}
