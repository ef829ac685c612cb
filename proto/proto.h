/* gpuipc wire protocol: frames (a fixed 12-byte header plus a msgpack map body) and the messages
 * inside them, bytes <-> structs. No I/O, no allocation while decoding, every length and count is
 * checked against the protocol limits and against the bytes that remain before it is used.
 * docs/protocol.md is the normative description; this header mirrors it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* ---- limits (docs/protocol.md "Limits") ---- */
#define PROTO_VERSION 1
#define PROTO_MAGIC "GIPC"
#define PROTO_HEADER_SIZE 12
#define PROTO_MAX_BODY (64u * 1024u)
#define PROTO_MAX_FRAME (PROTO_HEADER_SIZE + PROTO_MAX_BODY)
#define PROTO_MAX_FDS 1         /* a frame carries at most one fd: a buffer's memory */
#define PROTO_MAX_NAME 255      /* buffer, prefix and group names, in bytes */
#define PROTO_MAX_LABEL 64      /* a client's self-chosen label */
#define PROTO_MAX_UUID 64       /* "GPU-<uuid>" or "MIG-<uuid>" */
#define PROTO_MAX_GPUS 64       /* GPU UUIDs declared in hello */
#define PROTO_MAX_META 4096     /* opaque metadata map, encoded size */
#define PROTO_MAX_TEXT 1024     /* error messages and reasons */
#define PROTO_MAX_ITEMS 1024    /* records in one listing reply */
#define PROTO_MAX_DEPTH 8       /* nesting inside metadata */
#define PROTO_LEGACY_HANDLE_SIZE 64
#define PROTO_TIMEOUT_INFINITE UINT32_MAX
/* Buffer ids are keys chosen by the producer (docs/protocol.md 6.3): non-zero and at most 2^53 - 1,
 * so that JSON tools (JavaScript, jq) keep them exact. */
#define PROTO_MAX_BUFFER_ID ((UINT64_C(1) << 53) - 1)

/* ---- positive decode outcomes ---- */
enum {
        PROTO_E_LENGTH = 1,    /* the record is shorter than a header, or its body not as long as announced */
        PROTO_E_MAGIC,         /* not a gpuipc frame */
        PROTO_E_VERSION,       /* frame version we do not speak */
        PROTO_E_TOO_BIG,       /* body or fd count over the limits */
        PROTO_E_MALFORMED,     /* not msgpack, not a map, trailing bytes, bad nesting */
        PROTO_E_FIELD,         /* a known key with the wrong type or over its limit */
        PROTO_E_MISSING,       /* a field the operation requires is absent */
        PROTO_E_KIND,          /* neither request, reply nor event */
        PROTO_E_DUPLICATE,     /* a key appears twice */
        PROTO_E_RESERVED,      /* the header's reserved bytes are not zero */
        PROTO_E_UTF8,          /* a string (a field, or one inside meta) is not valid UTF-8 */
        PROTO_E_FDS,           /* the record carries another number of fds than its header announces */
};

typedef struct ProtoHeader {
        uint8_t version;
        uint8_t n_fds;
        uint32_t body_len;
} ProtoHeader;

typedef enum ProtoType {
        PROTO_NONE = 0,
        PROTO_REQUEST, /* has "op" and "id" */
        PROTO_REPLY,   /* has "reply" (the request's id) and "status" */
        PROTO_EVENT,   /* has "event" */
        PROTO_RECORD,  /* one element of a listing's "items" */
} ProtoType;

typedef enum ProtoOp {
        PROTO_OP_NONE = 0,
        PROTO_OP_HELLO,
        PROTO_OP_PING,
        PROTO_OP_PUBLISH,
        PROTO_OP_ATTACH,
        PROTO_OP_RELEASE,
        PROTO_OP_RETIRE,
        PROTO_OP_FREE,
        PROTO_OP_LIST,
        PROTO_OP_STAT,
        PROTO_OP_PEERS,
        PROTO_OP_STATS,
        PROTO_OP_SUBSCRIBE,
        PROTO_OP_UNSUBSCRIBE,
        PROTO_OP_GROUP_JOIN,
        PROTO_OP_UNMAP,   /* the client dropped its cached mapping: send the fd with the next attach */
        PROTO_OP_RECLAIM, /* after a reconnect: references the client still holds, registered again */
        PROTO_OP_RING_CREATE, /* rings (docs/protocol.md 6.16): the producer declares one, */
        PROTO_OP_RING_PART,   /* ... registers its shared memory part by part, */
        PROTO_OP_RING_JOIN,   /* consumers join and leave it, */
        PROTO_OP_RING_LEAVE,
        PROTO_OP_RING_EVICT,  /* the producer drops a member that stalled past the lease, */
        PROTO_OP_RING_CLOSE,  /* and ends it */
        PROTO_OP_RINGS,       /* operators: rings listed, */
        PROTO_OP_RING_STAT,   /* ... and one ring with its seats and how far each lags */
        PROTO_OP_UNKNOWN, /* a string we do not know: answered with status unknown-op */
        _PROTO_OP_MAX,
} ProtoOp;

typedef enum ProtoEvent {
        PROTO_EV_NONE = 0,
        PROTO_EV_PUBLISHED, /* to subscribers */
        PROTO_EV_RETIRED,   /* to subscribers */
        PROTO_EV_REVOKED,   /* to holders and subscribers: the memory is gone */
        PROTO_EV_DRAINED,   /* to the owner (and subscribers): the last reference of a retired buffer went */
        PROTO_EV_FREED,     /* to peers that received the buffer's fd: the broker forgot it, drop any cached mapping */
        PROTO_EV_MEMBER_JOINED, /* to a ring's producer: a member took member slot `index` */
        PROTO_EV_MEMBER_LEFT,   /* to a ring's producer, and to the member: it is no member any more */
        PROTO_EV_UNKNOWN,
        _PROTO_EV_MAX,
} ProtoEvent;

typedef enum ProtoKind {
        PROTO_KIND_NONE = 0,
        PROTO_KIND_MEMFD,
        PROTO_KIND_CUDA_VMM,
        PROTO_KIND_CUDA_LEGACY,
        _PROTO_KIND_MAX,
} ProtoKind;

/* A ring seat as ring-stat shows it (PF_SEAT; docs/protocol.md 6.17). */
typedef enum ProtoSeat {
        PROTO_SEAT_NONE = 0,
        PROTO_SEAT_WAITING,     /* restored after a broker restart: its member has not come back yet */
        PROTO_SEAT_JOINED,      /* a member joined; the control page does not seat it (yet) */
        PROTO_SEAT_UNCONFIRMED, /* the producer seated it; the member's page does not speak for it */
        PROTO_SEAT_SEATED,      /* seated, and its member's page speaks for it */
        _PROTO_SEAT_MAX,
} ProtoSeat;

/* A ring's mode (PF_MODE); proto/ring.h's RingMode is the same minus one. */
typedef enum ProtoMode {
        PROTO_MODE_NONE = 0,
        PROTO_MODE_BACKPRESSURE, /* every member sees every frame; the producer waits for the slowest */
        PROTO_MODE_LATEST,       /* the producer never waits; members take the newest frame */
        PROTO_MODE_STREAM,       /* cuda-vmm slots, GPU doorbells: streams wait, the CPU never does */
        _PROTO_MODE_MAX,
} ProtoMode;

typedef enum ProtoState {
        PROTO_STATE_NONE = 0,
        PROTO_STATE_LIVE,    /* attachable */
        PROTO_STATE_RETIRED, /* no new attaches; waiting for the last release */
        PROTO_STATE_IDLE,    /* retired and drained; the owner may publish it again or free it */
        _PROTO_STATE_MAX,
} ProtoState;

/* A string inside a decoded body (not NUL-terminated) or one given to the encoder. */
typedef struct ProtoStr {
        const char *ptr;
        uint32_t len;
} ProtoStr;

/* Raw msgpack bytes: metadata (a map) or listing items (an array of maps). */
typedef struct ProtoRaw {
        const uint8_t *ptr;
        uint32_t len;
        uint32_t count; /* entries of the map or array */
} ProtoRaw;

/* Every field of every message; `has` says which are present (bit = 1 << ProtoField). */
typedef enum ProtoField {
        PF_OP, PF_ID, PF_REPLY, PF_STATUS, PF_EVENT, PF_ERROR, PF_MESSAGE,
        PF_VERSION, PF_PID, PF_PIDNS, PF_GPUS, PF_LABEL,
        PF_NAME, PF_PREFIX, PF_KIND, PF_SIZE, PF_OFFSET, PF_DEVICE, PF_META, PF_HANDLE,
        PF_BROKER_HELD, PF_WRITABLE, PF_RETIRE_AFTER, PF_TIMEOUT_MS,
        PF_BUFFER, PF_GENERATION, PF_CACHED, PF_STATE, PF_REFS, PF_HOLDERS,
        PF_OWNER, PF_PEER, PF_UID, PF_GID, PF_SUB, PF_REASON,
        PF_GROUP, PF_MEMBERS, PF_EPOCH, PF_AFTER, PF_LIMIT, PF_MORE, PF_ITEMS, PF_VALUE,
        PF_BUFFERS, PF_SUBS, PF_WAITS, PF_FDS, PF_PIDNS_SAME, PF_STARTED_MS,
        PF_RESTORED, PF_PENDING,
        PF_INDEX, PF_SLOTS, PF_MODE,
        PF_LE_US,
        PF_PIDNS_DECLARED,
        PF_HEAD, PF_TAKEN, PF_SEAT, PF_POSITION, PF_LAG,
        PF_SEGMENT, PF_SEGMENT_SIZE,
        PF_SELF_PID, PF_SHM_DEV, PF_SHM_INO,
        _PF_MAX,
} ProtoField;

/* Which fields a message carries: one bit per ProtoField. 64 bits ran out at 64 fields. */
__extension__ typedef unsigned __int128 ProtoFieldMask;

_Static_assert(_PF_MAX <= 128, "field presence is a 128-bit mask");

#define PROTO_BIT(f) ((ProtoFieldMask)1 << (f))

/* How many fields a mask names. */
static inline unsigned proto_mask_count(ProtoFieldMask m)
{
        return (unsigned)__builtin_popcountll((uint64_t)m) + (unsigned)__builtin_popcountll((uint64_t)(m >> 64));
}

typedef struct ProtoMsg {
        ProtoType type;
        ProtoFieldMask has;

        ProtoOp op;
        ProtoEvent event;
        ProtoKind kind;
        ProtoState state;

        uint64_t id, reply, status;
        uint64_t version, pid, pidns, uid, gid;
        uint64_t size, offset, retire_after, timeout_ms;
        uint64_t buffer, generation, refs, holders, owner, peer, sub;
        uint64_t members, epoch, after, limit, value;
        uint64_t buffers, subs, waits, fds, started_ms;
        uint64_t index, slots;
        ProtoMode mode;
        uint64_t le_us; /* stats records: a histogram bucket's upper bound */
        uint64_t head, taken, position, lag; /* ring listings: frames and seats */
        uint64_t segment, segment_size; /* a view: the buffer whose memory it is part of, and that one's size */
        /* A process's PID as it sees itself (hello's pid, or the kernel's where the broker shares its
         * namespace), and the identity of its /dev/shm (st_dev, st_ino): what legacy CUDA IPC needs. */
        uint64_t self_pid, shm_dev, shm_ino;
        ProtoSeat seat;
        bool broker_held, writable, cached, more, pidns_same, restored, pending, pidns_declared;

        ProtoStr error, message, label, name, prefix, device, reason, group;
        ProtoStr handle; /* exactly PROTO_LEGACY_HANDLE_SIZE bytes (msgpack bin) */
        ProtoRaw meta, items;
        uint32_t n_gpus;
        ProtoStr gpus[PROTO_MAX_GPUS];
} ProtoMsg;

static inline bool proto_has(const ProtoMsg *m, ProtoField f)
{
        return m->has & PROTO_BIT(f);
}

static inline void proto_set(ProtoMsg *m, ProtoField f)
{
        m->has |= PROTO_BIT(f);
}

/* Leaves field f out of m (a description that must not say everything it knows). */
static inline void proto_unset(ProtoMsg *m, ProtoField f)
{
        m->has &= ~PROTO_BIT(f);
}

static inline ProtoStr proto_str(const char *s)
{
        return (ProtoStr){ s, s ? (uint32_t)__builtin_strlen(s) : 0 };
}

/* ---- building messages ----
 * A field is sent when it is present, so setting one sets its value and its presence together:
 * proto_set_<field>(m, value) for each field but gpus (proto_set_gpus). A message starts with one
 * of the *_init builders below; nothing else touches `has`. */
#define PROTO_SETTER(FIELD, member, type)                                                                   \
        static inline void proto_set_##member(ProtoMsg *m, type v)                                          \
        {                                                                                                   \
                m->member = v;                                                                              \
                m->has |= PROTO_BIT(PF_##FIELD);                                                            \
        }

PROTO_SETTER(OP, op, ProtoOp)
PROTO_SETTER(ID, id, uint64_t)
PROTO_SETTER(REPLY, reply, uint64_t)
PROTO_SETTER(STATUS, status, uint64_t)
PROTO_SETTER(EVENT, event, ProtoEvent)
PROTO_SETTER(ERROR, error, ProtoStr)
PROTO_SETTER(MESSAGE, message, ProtoStr)
PROTO_SETTER(VERSION, version, uint64_t)
PROTO_SETTER(PID, pid, uint64_t)
PROTO_SETTER(PIDNS, pidns, uint64_t)
PROTO_SETTER(LABEL, label, ProtoStr)
PROTO_SETTER(NAME, name, ProtoStr)
PROTO_SETTER(PREFIX, prefix, ProtoStr)
PROTO_SETTER(KIND, kind, ProtoKind)
PROTO_SETTER(SIZE, size, uint64_t)
PROTO_SETTER(OFFSET, offset, uint64_t)
PROTO_SETTER(DEVICE, device, ProtoStr)
PROTO_SETTER(META, meta, ProtoRaw)
PROTO_SETTER(HANDLE, handle, ProtoStr)
PROTO_SETTER(BROKER_HELD, broker_held, bool)
PROTO_SETTER(WRITABLE, writable, bool)
PROTO_SETTER(RETIRE_AFTER, retire_after, uint64_t)
PROTO_SETTER(TIMEOUT_MS, timeout_ms, uint64_t)
PROTO_SETTER(BUFFER, buffer, uint64_t)
PROTO_SETTER(GENERATION, generation, uint64_t)
PROTO_SETTER(CACHED, cached, bool)
PROTO_SETTER(STATE, state, ProtoState)
PROTO_SETTER(REFS, refs, uint64_t)
PROTO_SETTER(HOLDERS, holders, uint64_t)
PROTO_SETTER(OWNER, owner, uint64_t)
PROTO_SETTER(PEER, peer, uint64_t)
PROTO_SETTER(UID, uid, uint64_t)
PROTO_SETTER(GID, gid, uint64_t)
PROTO_SETTER(SUB, sub, uint64_t)
PROTO_SETTER(REASON, reason, ProtoStr)
PROTO_SETTER(GROUP, group, ProtoStr)
PROTO_SETTER(MEMBERS, members, uint64_t)
PROTO_SETTER(EPOCH, epoch, uint64_t)
PROTO_SETTER(AFTER, after, uint64_t)
PROTO_SETTER(LIMIT, limit, uint64_t)
PROTO_SETTER(MORE, more, bool)
PROTO_SETTER(ITEMS, items, ProtoRaw)
PROTO_SETTER(VALUE, value, uint64_t)
PROTO_SETTER(BUFFERS, buffers, uint64_t)
PROTO_SETTER(SUBS, subs, uint64_t)
PROTO_SETTER(WAITS, waits, uint64_t)
PROTO_SETTER(FDS, fds, uint64_t)
PROTO_SETTER(PIDNS_SAME, pidns_same, bool)
PROTO_SETTER(STARTED_MS, started_ms, uint64_t)
PROTO_SETTER(RESTORED, restored, bool)
PROTO_SETTER(PENDING, pending, bool)
PROTO_SETTER(INDEX, index, uint64_t)
PROTO_SETTER(SLOTS, slots, uint64_t)
PROTO_SETTER(MODE, mode, ProtoMode)
PROTO_SETTER(LE_US, le_us, uint64_t)
PROTO_SETTER(PIDNS_DECLARED, pidns_declared, bool)
PROTO_SETTER(HEAD, head, uint64_t)
PROTO_SETTER(TAKEN, taken, uint64_t)
PROTO_SETTER(POSITION, position, uint64_t)
PROTO_SETTER(LAG, lag, uint64_t)
PROTO_SETTER(SEAT, seat, ProtoSeat)
PROTO_SETTER(SELF_PID, self_pid, uint64_t)
PROTO_SETTER(SHM_DEV, shm_dev, uint64_t)
PROTO_SETTER(SHM_INO, shm_ino, uint64_t)
PROTO_SETTER(SEGMENT, segment, uint64_t)
PROTO_SETTER(SEGMENT_SIZE, segment_size, uint64_t)

/* What a buffer's memory is: announced by publish (and ring-part), told by attach, stat and list,
 * and fixed for the memory's life. The name, metadata and retire_after belong to each publication
 * of it instead, and device, handle and metadata are strings whose owner differs from copy to copy;
 * so they travel beside it. The broker's publish request, its buffers and their descriptions embed
 * one, so that registering a buffer copies it in one assignment. */
typedef struct ProtoBufferInfo {
        ProtoKind kind;
        uint64_t size, offset;
        uint64_t segment; /* a view: the id of the buffer whose bytes [offset, offset + size) it is; else 0 */
        bool writable, broker_held;
} ProtoBufferInfo;

/* Reads a buffer's attributes from m (an absent one reads as 0 or false). */
static inline void proto_buffer_info_read(const ProtoMsg *m, ProtoBufferInfo *ret)
{
        *ret = (ProtoBufferInfo){ .kind = m->kind, .size = m->size, .offset = m->offset, .segment = m->segment,
                                  .writable = m->writable, .broker_held = m->broker_held };
}

/* Sets every attribute of info on m (segment only for a view: its presence is what says so). */
static inline void proto_set_buffer_info(ProtoMsg *m, const ProtoBufferInfo *info)
{
        proto_set_kind(m, info->kind);
        proto_set_size(m, info->size);
        proto_set_offset(m, info->offset);
        if (info->segment)
                proto_set_segment(m, info->segment);
        proto_set_writable(m, info->writable);
        proto_set_broker_held(m, info->broker_held);
}

/* The GPU UUIDs a hello declares or a peer record lists: n strings of gpus (at most PROTO_MAX_GPUS,
 * more are left out), which must outlive m. Present even when n is 0. */
static inline void proto_set_gpus(ProtoMsg *m, const char (*gpus)[PROTO_MAX_UUID + 1], uint32_t n)
{
        m->n_gpus = n < PROTO_MAX_GPUS ? n : PROTO_MAX_GPUS;
        for (uint32_t i = 0; i < m->n_gpus; i++)
                m->gpus[i] = proto_str(gpus[i]);
        m->has |= PROTO_BIT(PF_GPUS);
}

/* An empty message of each kind: a request for op (its id is set when it is sent), a reply to
 * request id with status, an event, a listing record. */
static inline void proto_request_init(ProtoMsg *m, ProtoOp op)
{
        *m = (ProtoMsg){ .type = PROTO_REQUEST };
        proto_set_op(m, op);
}

static inline void proto_reply_init(ProtoMsg *m, uint64_t id, unsigned status)
{
        *m = (ProtoMsg){ .type = PROTO_REPLY };
        proto_set_reply(m, id);
        proto_set_status(m, status);
}

static inline void proto_event_init(ProtoMsg *m, ProtoEvent ev)
{
        *m = (ProtoMsg){ .type = PROTO_EVENT };
        proto_set_event(m, ev);
}

static inline void proto_record_init(ProtoMsg *m)
{
        *m = (ProtoMsg){ .type = PROTO_RECORD };
}

/* The error reply every side sends (the broker's registry, request layer and connections alike):
 * to request id (0: a notice to the connection itself), with status, its stable name, and text
 * saying what happened in this case (the status's default text says how to fix it in general).
 * text must outlive m; it is cut to PROTO_MAX_TEXT bytes, never inside a UTF-8 character. */
void proto_reply_error(ProtoMsg *m, uint64_t id, unsigned status, const char *text);

/* ---- frames ---- */

/* Parses the fixed header at buf. 0, or PROTO_E_LENGTH / _MAGIC / _VERSION / _RESERVED / _TOO_BIG. */
int proto_header_parse(const uint8_t *buf, size_t len, ProtoHeader *ret);

/* What proto_frame_decode found wrong with a received frame. */
typedef struct ProtoFrameError {
        int code;         /* a PROTO_E_* code; 0 when the frame decoded */
        ProtoField field; /* the field at fault (PROTO_E_FIELD, _MISSING, _DUPLICATE, _UTF8), else _PF_MAX */
        /* Non-zero: a request whose fields are wrong but whose id could be read: it is answered
         * (bad-request) and the connection stays. 0: a framing violation, after which frame
         * boundaries cannot be trusted and the connection must close. */
        uint64_t id;
        char text[192];   /* what is wrong, in words: for the reply, the log or an error message */
} ProtoFrameError;

/* Checks and decodes one received record, the one way both sides read frames: the header (magic,
 * version, reserved bytes, limits), the body's length against the record's, the fd count against
 * the n_fds fds that came with it, then the body (proto_msg_decode). truncated: the transport cut
 * the record or its control data (MSG_TRUNC, MSG_CTRUNC, more fds than it takes). expect:
 * PROTO_REQUEST where only requests may arrive (the broker), PROTO_NONE for any message (a client).
 * 0 with *m decoded (pointing into frame, which must outlive it), or the PROTO_E_* code with *err
 * filled. The fds stay the caller's either way. */
int proto_frame_decode(const uint8_t *frame, size_t len, size_t n_fds, bool truncated, ProtoType expect, ProtoMsg *m,
                       ProtoFrameError *err);

/* Writes a header for a body of body_len bytes carrying n_fds fds. */
void proto_header_write(uint8_t out[PROTO_HEADER_SIZE], uint32_t body_len, uint8_t n_fds);

/* ---- messages ---- */

/* Decodes a body into m. Strings and raw parts point into body, which must outlive m.
 * Requests are checked for the fields their op requires. 0 or a PROTO_E_* code; on
 * PROTO_E_FIELD/_MISSING, *ret_field (if not NULL) names the offending field. */
int proto_msg_decode(const uint8_t *body, size_t len, ProtoMsg *m, ProtoField *ret_field);

/* Finds the request id in a body that failed to decode for another reason, so the error reply
 * can still name the request. 0, or a PROTO_E_* code when there is none. */
int proto_peek_id(const uint8_t *body, size_t len, uint64_t *ret);

/* Encoder output: a growable byte buffer owned by the caller (free with proto_buf_free). */
typedef struct ProtoBuf {
        uint8_t *data;
        size_t len, cap;
} ProtoBuf;

void proto_buf_free(ProtoBuf *b);

/* Appends raw bytes. 0 or -ENOMEM. */
int proto_buf_append(ProtoBuf *b, const void *data, size_t len);

/* Appends one whole frame (header + body) for m announcing n_fds fds. 0, -ENOMEM, or
 * PROTO_E_TOO_BIG when the body would exceed PROTO_MAX_BODY (nothing is appended then). */
int proto_frame_encode(ProtoBuf *out, const ProtoMsg *m, uint8_t n_fds);

/* Appends the body of m alone: used to build listing items (records) into a separate buffer. */
int proto_record_encode(ProtoBuf *out, const ProtoMsg *m);

/* Builds an items array (records appended one by one, the array's header written at the end). At
 * most `budget` encoded bytes; proto_items_add returns false once a record does not fit. */
typedef struct ProtoItems {
        ProtoBuf buf;
        uint32_t count;
        size_t budget;
        bool full, failed; /* failed: out of memory */
} ProtoItems;

void proto_items_init(ProtoItems *it, size_t budget);
bool proto_items_add(ProtoItems *it, const ProtoMsg *rec);
/* The array, valid until proto_items_free; NULL ptr when building failed. */
ProtoRaw proto_items_finish(ProtoItems *it);
void proto_items_free(ProtoItems *it);

/* Iterates the records of a decoded listing. Returns 1 with *rec filled, 0 at the end, or PROTO_E_*. */
typedef struct ProtoIter {
        const uint8_t *p, *end;
        uint32_t left;
} ProtoIter;

void proto_iter_init(ProtoIter *it, const ProtoRaw *items);
int proto_iter_next(ProtoIter *it, ProtoMsg *rec);

/* Names for logs, the CLI and error texts. */
const char *proto_op_name(ProtoOp op);
const char *proto_event_name(ProtoEvent ev);
const char *proto_kind_name(ProtoKind kind);
const char *proto_state_name(ProtoState state);
const char *proto_mode_name(ProtoMode mode);
const char *proto_seat_name(ProtoSeat seat);
const char *proto_field_name(ProtoField f);
const char *proto_strerror(int proto_e);

ProtoKind proto_kind_from_name(const char *s);

/* Checks that raw is one well-formed msgpack map within the depth and size limits, whose strings are
 * all valid UTF-8 (metadata). */
bool proto_meta_valid(const uint8_t *raw, size_t len);

/* True when s holds valid UTF-8 (RFC 3629: no overlong forms, surrogates or code points above
 * U+10FFFF). */
bool proto_utf8_valid(const char *s, size_t len);

/* The length of s without an incomplete UTF-8 sequence at its end (what cutting text to a buffer
 * may leave), so that a truncated message stays valid UTF-8. */
size_t proto_utf8_trim(const char *s, size_t len);

/* Names of buffers, groups and rings: 1-255 bytes of [A-Za-z0-9._:/@+=-], not starting with '/',
 * without "..". A prefix (subscriptions, listings) may also be empty: every name. The client checks
 * before it sends, the broker when a request arrives. */
bool proto_name_valid(const char *s, size_t len);
bool proto_prefix_valid(const char *s, size_t len);

/* A ProtoStr compared with a C string. */
bool proto_str_eq(ProtoStr s, const char *c);

/* Copies s into buf as a NUL-terminated string, cut to cap - 1 bytes. Returns buf. An absent
 * string ({NULL, 0}) gives "". */
char *proto_str_copy(ProtoStr s, char *buf, size_t cap);
