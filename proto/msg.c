/* Message codec: one table describes every field (key, type, limit, where it lives in ProtoMsg), and
 * both directions are driven by it, so the decoder and encoder cannot disagree about a field.
 * Bodies only: msg.c knows nothing of the frame header, and frame.c builds on it (frame.c ->
 * msg.c, never the other way); listing records (proto_items_*) are such bodies without a frame. */
#include <errno.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "mpread.h"
#include "proto.h"

typedef enum FieldType {
        T_U64,
        T_BOOL,
        T_STR,     /* UTF-8 text without NUL bytes, at most `max` bytes */
        T_HANDLE,  /* bin of exactly PROTO_LEGACY_HANDLE_SIZE bytes */
        T_ENUM,    /* a string from `names`, stored as its index */
        T_STRLIST, /* array of T_STR, at most PROTO_MAX_GPUS */
        T_META,    /* one msgpack map, kept as raw bytes */
        T_ITEMS,   /* array of maps (records), kept as raw bytes */
} FieldType;

typedef struct FieldDesc {
        const char *key;
        FieldType type;
        uint32_t max;
        size_t off;
        const char *const *names; /* T_ENUM: index 0 is "none" and never on the wire */
        unsigned n_names;
} FieldDesc;

static const char *const op_names[_PROTO_OP_MAX] = {
        [PROTO_OP_HELLO] = "hello",         [PROTO_OP_PING] = "ping",
        [PROTO_OP_PUBLISH] = "publish",     [PROTO_OP_ATTACH] = "attach",
        [PROTO_OP_RELEASE] = "release",     [PROTO_OP_RETIRE] = "retire",
        [PROTO_OP_FREE] = "free",           [PROTO_OP_LIST] = "list",
        [PROTO_OP_STAT] = "stat",           [PROTO_OP_PEERS] = "peers",
        [PROTO_OP_STATS] = "stats",         [PROTO_OP_SUBSCRIBE] = "subscribe",
        [PROTO_OP_UNSUBSCRIBE] = "unsubscribe", [PROTO_OP_GROUP_JOIN] = "group-join",
        [PROTO_OP_UNMAP] = "unmap",         [PROTO_OP_RECLAIM] = "reclaim",
        [PROTO_OP_RING_CREATE] = "ring-create", [PROTO_OP_RING_PART] = "ring-part",
        [PROTO_OP_RING_JOIN] = "ring-join", [PROTO_OP_RING_LEAVE] = "ring-leave",
        [PROTO_OP_RING_EVICT] = "ring-evict", [PROTO_OP_RING_CLOSE] = "ring-close",
        [PROTO_OP_RINGS] = "rings",         [PROTO_OP_RING_STAT] = "ring-stat",
};

static const char *const event_names[_PROTO_EV_MAX] = {
        [PROTO_EV_PUBLISHED] = "published", [PROTO_EV_RETIRED] = "retired",
        [PROTO_EV_REVOKED] = "revoked",     [PROTO_EV_DRAINED] = "drained",
        [PROTO_EV_FREED] = "freed",
        [PROTO_EV_MEMBER_JOINED] = "member-joined", [PROTO_EV_MEMBER_LEFT] = "member-left",
};

static const char *const mode_names[_PROTO_MODE_MAX] = {
        [PROTO_MODE_BACKPRESSURE] = "backpressure",
        [PROTO_MODE_LATEST] = "latest",
        [PROTO_MODE_STREAM] = "stream",
};

static const char *const seat_names[_PROTO_SEAT_MAX] = {
        [PROTO_SEAT_WAITING] = "waiting",
        [PROTO_SEAT_JOINED] = "joined",
        [PROTO_SEAT_UNCONFIRMED] = "unconfirmed",
        [PROTO_SEAT_SEATED] = "seated",
};

static const char *const kind_names[_PROTO_KIND_MAX] = {
        [PROTO_KIND_MEMFD] = "memfd",
        [PROTO_KIND_CUDA_VMM] = "cuda-vmm",
        [PROTO_KIND_CUDA_LEGACY] = "cuda-legacy",
};

static const char *const state_names[_PROTO_STATE_MAX] = {
        [PROTO_STATE_LIVE] = "live",
        [PROTO_STATE_RETIRED] = "retired",
        [PROTO_STATE_IDLE] = "idle",
};

#define F(k, t, m, member) { k, t, m, offsetof(ProtoMsg, member), NULL, 0 }
#define E(k, member, tbl) { k, T_ENUM, 0, offsetof(ProtoMsg, member), tbl, ARRAY_SIZE_(tbl) }
#define ARRAY_SIZE_(a) (sizeof(a) / sizeof((a)[0]))

/* Wire order of an encoded message is the order of this table. */
static const FieldDesc fields[_PF_MAX] = {
        [PF_OP] = E("op", op, op_names),
        [PF_ID] = F("id", T_U64, 0, id),
        [PF_REPLY] = F("reply", T_U64, 0, reply),
        [PF_STATUS] = F("status", T_U64, 0, status),
        [PF_EVENT] = E("event", event, event_names),
        [PF_ERROR] = F("error", T_STR, 64, error),
        [PF_MESSAGE] = F("message", T_STR, PROTO_MAX_TEXT, message),
        [PF_VERSION] = F("version", T_U64, 0, version),
        [PF_PID] = F("pid", T_U64, 0, pid),
        [PF_PIDNS] = F("pidns", T_U64, 0, pidns),
        [PF_GPUS] = F("gpus", T_STRLIST, PROTO_MAX_UUID, gpus),
        [PF_LABEL] = F("label", T_STR, PROTO_MAX_LABEL, label),
        [PF_NAME] = F("name", T_STR, PROTO_MAX_NAME, name),
        [PF_PREFIX] = F("prefix", T_STR, PROTO_MAX_NAME, prefix),
        [PF_KIND] = E("kind", kind, kind_names),
        [PF_SIZE] = F("size", T_U64, 0, size),
        [PF_OFFSET] = F("offset", T_U64, 0, offset),
        [PF_DEVICE] = F("device", T_STR, PROTO_MAX_UUID, device),
        [PF_META] = F("meta", T_META, PROTO_MAX_META, meta),
        [PF_HANDLE] = F("handle", T_HANDLE, PROTO_LEGACY_HANDLE_SIZE, handle),
        [PF_BROKER_HELD] = F("broker_held", T_BOOL, 0, broker_held),
        [PF_WRITABLE] = F("writable", T_BOOL, 0, writable),
        [PF_RETIRE_AFTER] = F("retire_after", T_U64, 0, retire_after),
        [PF_TIMEOUT_MS] = F("timeout_ms", T_U64, 0, timeout_ms),
        [PF_BUFFER] = F("buffer", T_U64, 0, buffer),
        [PF_GENERATION] = F("generation", T_U64, 0, generation),
        [PF_CACHED] = F("cached", T_BOOL, 0, cached),
        [PF_STATE] = E("state", state, state_names),
        [PF_REFS] = F("refs", T_U64, 0, refs),
        [PF_HOLDERS] = F("holders", T_U64, 0, holders),
        [PF_OWNER] = F("owner", T_U64, 0, owner),
        [PF_PEER] = F("peer", T_U64, 0, peer),
        [PF_UID] = F("uid", T_U64, 0, uid),
        [PF_GID] = F("gid", T_U64, 0, gid),
        [PF_SUB] = F("sub", T_U64, 0, sub),
        [PF_REASON] = F("reason", T_STR, PROTO_MAX_TEXT, reason),
        [PF_GROUP] = F("group", T_STR, PROTO_MAX_NAME, group),
        [PF_MEMBERS] = F("members", T_U64, 0, members),
        [PF_EPOCH] = F("epoch", T_U64, 0, epoch),
        [PF_AFTER] = F("after", T_U64, 0, after),
        [PF_LIMIT] = F("limit", T_U64, 0, limit),
        [PF_MORE] = F("more", T_BOOL, 0, more),
        [PF_ITEMS] = F("items", T_ITEMS, PROTO_MAX_ITEMS, items),
        [PF_VALUE] = F("value", T_U64, 0, value),
        [PF_BUFFERS] = F("buffers", T_U64, 0, buffers),
        [PF_SUBS] = F("subs", T_U64, 0, subs),
        [PF_WAITS] = F("waits", T_U64, 0, waits),
        [PF_FDS] = F("fds", T_U64, 0, fds),
        [PF_PIDNS_SAME] = F("pidns_same", T_BOOL, 0, pidns_same),
        [PF_STARTED_MS] = F("started_ms", T_U64, 0, started_ms),
        [PF_RESTORED] = F("restored", T_BOOL, 0, restored),
        [PF_PENDING] = F("pending", T_BOOL, 0, pending),
        [PF_INDEX] = F("index", T_U64, 0, index),
        [PF_SLOTS] = F("slots", T_U64, 0, slots),
        [PF_MODE] = E("mode", mode, mode_names),
        [PF_LE_US] = F("le_us", T_U64, 0, le_us),
        [PF_PIDNS_DECLARED] = F("pidns_declared", T_BOOL, 0, pidns_declared),
        [PF_HEAD] = F("head", T_U64, 0, head),
        [PF_TAKEN] = F("taken", T_U64, 0, taken),
        [PF_SEAT] = E("seat", seat, seat_names),
        [PF_POSITION] = F("position", T_U64, 0, position),
        [PF_LAG] = F("lag", T_U64, 0, lag),
        [PF_SEGMENT] = F("segment", T_U64, 0, segment),
        [PF_SEGMENT_SIZE] = F("segment_size", T_U64, 0, segment_size),
        [PF_SELF_PID] = F("self_pid", T_U64, 0, self_pid),
        [PF_SHM_DEV] = F("shm_dev", T_U64, 0, shm_dev),
        [PF_SHM_INO] = F("shm_ino", T_U64, 0, shm_ino),
};

/* Fields each request must carry besides "op" and "id"; finer rules (name or buffer) are the
 * broker's, since they depend on the combination. */
static const ProtoFieldMask op_required[_PROTO_OP_MAX] = {
        [PROTO_OP_HELLO] = PROTO_BIT(PF_VERSION),
        [PROTO_OP_PUBLISH] = PROTO_BIT(PF_NAME),
        [PROTO_OP_RELEASE] = PROTO_BIT(PF_BUFFER),
        [PROTO_OP_RETIRE] = PROTO_BIT(PF_BUFFER),
        [PROTO_OP_FREE] = PROTO_BIT(PF_BUFFER),
        [PROTO_OP_UNMAP] = PROTO_BIT(PF_BUFFER),
        [PROTO_OP_RECLAIM] = PROTO_BIT(PF_BUFFER) | PROTO_BIT(PF_GENERATION) | PROTO_BIT(PF_REFS) |
                             PROTO_BIT(PF_UID) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND),
        [PROTO_OP_RING_CREATE] = PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE) | PROTO_BIT(PF_SLOTS) |
                                 PROTO_BIT(PF_MEMBERS) | PROTO_BIT(PF_MODE),
        [PROTO_OP_RING_PART] = PROTO_BIT(PF_NAME) | PROTO_BIT(PF_INDEX) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE),
        [PROTO_OP_RING_JOIN] = PROTO_BIT(PF_NAME),
        [PROTO_OP_RING_LEAVE] = PROTO_BIT(PF_NAME),
        [PROTO_OP_RING_EVICT] = PROTO_BIT(PF_NAME) | PROTO_BIT(PF_INDEX) | PROTO_BIT(PF_GENERATION),
        [PROTO_OP_RING_CLOSE] = PROTO_BIT(PF_NAME),
        [PROTO_OP_RING_STAT] = PROTO_BIT(PF_NAME),
        [PROTO_OP_SUBSCRIBE] = PROTO_BIT(PF_PREFIX),
        [PROTO_OP_UNSUBSCRIBE] = PROTO_BIT(PF_SUB),
        [PROTO_OP_GROUP_JOIN] = PROTO_BIT(PF_GROUP) | PROTO_BIT(PF_MEMBERS),
};

#define MEMBER(m, d, type) ((type *)((char *)(m) + (d)->off))

static const FieldDesc *field_lookup(const char *key, uint32_t len, ProtoField *ret_f)
{
        for (unsigned f = 0; f < _PF_MAX; f++) {
                if (strlen(fields[f].key) == len && memcmp(fields[f].key, key, len) == 0) {
                        *ret_f = f;
                        return &fields[f];
                }
        }
        return NULL;
}

static int decode_str(MpReader *r, uint32_t max, ProtoStr *ret)
{
        const char *s;
        uint32_t len;
        int e = mp_read_str(r, &s, &len);

        if (e)
                return e;
        if (len > max || memchr(s, 0, len))
                return PROTO_E_FIELD;
        if (!proto_utf8_valid(s, len))
                return PROTO_E_UTF8;
        *ret = (ProtoStr){ s, len };
        return 0;
}

static int decode_enum(MpReader *r, const FieldDesc *d, int *ret)
{
        ProtoStr s;
        int e = decode_str(r, 64, &s);

        if (e)
                return e;
        for (unsigned i = 1; i < d->n_names; i++) {
                if (d->names[i] && proto_str_eq(s, d->names[i])) {
                        *ret = (int)i;
                        return 0;
                }
        }
        /* An op or event from a newer peer is answered or ignored, not treated as garbage. */
        if (d->names == op_names) {
                *ret = PROTO_OP_UNKNOWN;
                return 0;
        }
        if (d->names == event_names) {
                *ret = PROTO_EV_UNKNOWN;
                return 0;
        }
        return PROTO_E_FIELD;
}

static int decode_raw(MpReader *r, const FieldDesc *d, ProtoRaw *ret)
{
        const uint8_t *start = r->p;
        MpReader probe = *r;
        uint32_t n;
        int e;

        e = d->type == T_META ? mp_read_map(&probe, &n) : mp_read_array(&probe, &n);
        if (e)
                return e;
        if (d->type == T_ITEMS && n > d->max)
                return PROTO_E_FIELD;
        /* Items are an array of records, each of which may carry a meta nested to the limit. */
        e = mp_skip(r, d->type == T_ITEMS ? PROTO_MAX_DEPTH + 2 : PROTO_MAX_DEPTH);
        if (e == PROTO_E_MALFORMED && d->type == T_META) {
                /* Well-formed but nested too deep is the field's fault, not the frame's. */
                MpReader again = probe;
                again.p = start;
                if (mp_skip(&again, 64) == 0)
                        return PROTO_E_FIELD;
        }
        if (e)
                return e;
        if (d->type == T_META && (size_t)(r->p - start) > d->max)
                return PROTO_E_FIELD;
        /* Metadata is echoed to every peer that attaches or lists: its strings must be text too. */
        if (d->type == T_META) {
                MpReader text = { start, r->p };

                if (mp_skip_utf8(&text, PROTO_MAX_DEPTH))
                        return PROTO_E_UTF8;
        }
        *ret = (ProtoRaw){ start, (uint32_t)(r->p - start), n };
        return 0;
}

static int decode_field(MpReader *r, const FieldDesc *d, ProtoMsg *m)
{
        uint32_t n;
        int e;

        switch (d->type) {
        case T_U64:
                return mp_read_uint(r, MEMBER(m, d, uint64_t));
        case T_BOOL:
                return mp_read_bool(r, MEMBER(m, d, bool));
        case T_STR:
                return decode_str(r, d->max, MEMBER(m, d, ProtoStr));
        case T_HANDLE: {
                const uint8_t *b;
                e = mp_read_bin(r, &b, &n);
                if (e)
                        return e;
                if (n != PROTO_LEGACY_HANDLE_SIZE)
                        return PROTO_E_FIELD;
                *MEMBER(m, d, ProtoStr) = (ProtoStr){ (const char *)b, n };
                return 0;
        }
        case T_ENUM:
                return decode_enum(r, d, MEMBER(m, d, int));
        case T_STRLIST:
                e = mp_read_array(r, &n);
                if (e)
                        return e;
                if (n > PROTO_MAX_GPUS)
                        return PROTO_E_FIELD;
                for (uint32_t i = 0; i < n; i++)
                        if ((e = decode_str(r, d->max, &m->gpus[i])))
                                return e;
                m->n_gpus = n;
                return 0;
        case T_META:
        case T_ITEMS:
                return decode_raw(r, d, MEMBER(m, d, ProtoRaw));
        }
        return PROTO_E_FIELD;
}

/* Decodes one map into m; shared by whole messages and listing records. */
static int decode_map(MpReader *r, ProtoMsg *m, ProtoField *ret_field)
{
        uint32_t n;
        int e;

        memset(m, 0, sizeof(*m));
        e = mp_read_map(r, &n);
        if (e)
                return PROTO_E_MALFORMED;
        for (uint32_t i = 0; i < n; i++) {
                const FieldDesc *d;
                const char *key;
                uint32_t klen;
                ProtoField f;

                e = mp_read_str(r, &key, &klen);
                if (e)
                        return PROTO_E_MALFORMED;
                d = field_lookup(key, klen, &f);
                if (!d) {
                        /* Unknown keys are skipped: newer peers may add fields. */
                        e = mp_skip(r, PROTO_MAX_DEPTH);
                        if (e)
                                return PROTO_E_MALFORMED;
                        continue;
                }
                if (m->has & PROTO_BIT(f)) {
                        if (ret_field)
                                *ret_field = f;
                        return PROTO_E_DUPLICATE; /* which of the two would we believe? */
                }
                e = decode_field(r, d, m);
                if (e) {
                        if (ret_field)
                                *ret_field = f;
                        return e;
                }
                m->has |= PROTO_BIT(f);
        }
        return 0;
}

int proto_msg_decode(const uint8_t *body, size_t len, ProtoMsg *m, ProtoField *ret_field)
{
        MpReader r = { body, body + len };
        ProtoFieldMask need;
        int e;

        if (len > PROTO_MAX_BODY)
                return PROTO_E_TOO_BIG;
        e = decode_map(&r, m, ret_field);
        if (e)
                return e;
        if (!mp_at_end(&r))
                return PROTO_E_MALFORMED;

        if (proto_has(m, PF_OP)) {
                m->type = PROTO_REQUEST;
                need = PROTO_BIT(PF_ID) | op_required[m->op];
        } else if (proto_has(m, PF_REPLY)) {
                m->type = PROTO_REPLY;
                need = PROTO_BIT(PF_STATUS);
        } else if (proto_has(m, PF_EVENT)) {
                m->type = PROTO_EVENT;
                need = 0;
        } else {
                return PROTO_E_KIND;
        }
        for (unsigned f = 0; f < _PF_MAX; f++) {
                if ((need & PROTO_BIT(f)) && !proto_has(m, f)) {
                        if (ret_field)
                                *ret_field = f;
                        return PROTO_E_MISSING;
                }
        }
        return 0;
}

int proto_peek_id(const uint8_t *body, size_t len, uint64_t *ret)
{
        MpReader r = { body, body + len };
        uint32_t n;

        if (mp_read_map(&r, &n))
                return PROTO_E_MALFORMED;
        for (uint32_t i = 0; i < n; i++) {
                const char *key;
                uint32_t klen;

                if (mp_read_str(&r, &key, &klen))
                        return PROTO_E_MALFORMED;
                if (klen == 2 && memcmp(key, "id", 2) == 0)
                        return mp_read_uint(&r, ret);
                if (mp_skip(&r, PROTO_MAX_DEPTH + 2)) /* as deep as items may go */
                        return PROTO_E_MALFORMED;
        }
        return PROTO_E_MISSING;
}

void proto_iter_init(ProtoIter *it, const ProtoRaw *items)
{
        MpReader r = { items->ptr, items->ptr + items->len };
        uint32_t n = 0;

        /* items were validated by the decoder; an empty iterator is the safe answer otherwise. */
        if (!items->ptr || mp_read_array(&r, &n))
                n = 0;
        *it = (ProtoIter){ r.p, r.end, n };
}

int proto_iter_next(ProtoIter *it, ProtoMsg *rec)
{
        MpReader r = { it->p, it->end };
        int e;

        if (it->left == 0)
                return 0;
        e = decode_map(&r, rec, NULL);
        if (e)
                return e;
        rec->type = PROTO_RECORD;
        it->p = r.p;
        it->left--;
        return 1;
}

/* ---- encoding ---- */

void proto_buf_free(ProtoBuf *b)
{
        free(b->data);
        *b = (ProtoBuf){ 0 };
}

static int buf_reserve(ProtoBuf *b, size_t more)
{
        size_t cap;
        uint8_t *d;

        if (b->len + more <= b->cap)
                return 0;
        cap = b->cap ? b->cap : 256;
        while (cap < b->len + more)
                cap *= 2;
        d = realloc(b->data, cap);
        if (!d)
                return -ENOMEM;
        b->data = d;
        b->cap = cap;
        return 0;
}

int proto_buf_append(ProtoBuf *b, const void *data, size_t len)
{
        if (buf_reserve(b, len) < 0)
                return -ENOMEM;
        memcpy(b->data + b->len, data, len);
        b->len += len;
        return 0;
}

/* msgpack-c's packer writes through this; a failed allocation is remembered in the context,
 * since the packer's own calls do not all report their writer's result. */
typedef struct PackCtx {
        ProtoBuf *b;
        bool failed;
} PackCtx;

static int buf_write(void *data, const char *p, size_t n)
{
        PackCtx *c = data;

        if (c->failed || buf_reserve(c->b, n) < 0) {
                c->failed = true;
                return -1;
        }
        memcpy(c->b->data + c->b->len, p, n);
        c->b->len += n;
        return 0;
}

static void pack_str(msgpack_packer *pk, const char *s, size_t len)
{
        msgpack_pack_str(pk, len);
        msgpack_pack_str_body(pk, s, len);
}

static int encode_field(msgpack_packer *pk, const FieldDesc *d, const ProtoMsg *m)
{
        const ProtoStr *s;
        const ProtoRaw *raw;
        int idx;

        pack_str(pk, d->key, strlen(d->key));
        switch (d->type) {
        case T_U64:
                return msgpack_pack_uint64(pk, *MEMBER(m, d, const uint64_t));
        case T_BOOL:
                return *MEMBER(m, d, const bool) ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
        case T_STR:
                s = MEMBER(m, d, const ProtoStr);
                if (s->len > d->max)
                        return -EINVAL;
                pack_str(pk, s->ptr, s->len);
                return 0;
        case T_HANDLE:
                s = MEMBER(m, d, const ProtoStr);
                if (s->len != PROTO_LEGACY_HANDLE_SIZE)
                        return -EINVAL;
                msgpack_pack_bin(pk, s->len);
                return msgpack_pack_bin_body(pk, s->ptr, s->len);
        case T_ENUM:
                idx = *MEMBER(m, d, const int);
                if (idx <= 0 || (unsigned)idx >= d->n_names || !d->names[idx])
                        return -EINVAL;
                pack_str(pk, d->names[idx], strlen(d->names[idx]));
                return 0;
        case T_STRLIST:
                if (m->n_gpus > PROTO_MAX_GPUS)
                        return -EINVAL;
                msgpack_pack_array(pk, m->n_gpus);
                for (uint32_t i = 0; i < m->n_gpus; i++)
                        pack_str(pk, m->gpus[i].ptr, m->gpus[i].len);
                return 0;
        case T_META:
        case T_ITEMS:
                /* Already msgpack: copied verbatim. An absent one is written empty. */
                raw = MEMBER(m, d, const ProtoRaw);
                if (!raw->len)
                        return d->type == T_META ? msgpack_pack_map(pk, 0) : msgpack_pack_array(pk, 0);
                return buf_write(pk->data, (const char *)raw->ptr, raw->len);
        }
        return -EINVAL;
}

/* Appends m's body to out; on failure out is restored to its previous length. */
static int encode_body(ProtoBuf *out, const ProtoMsg *m)
{
        PackCtx ctx = { out, false };
        size_t start = out->len;
        msgpack_packer pk;

        msgpack_packer_init(&pk, &ctx, buf_write);
        msgpack_pack_map(&pk, proto_mask_count(m->has));
        for (unsigned f = 0; f < _PF_MAX; f++) {
                if (!(m->has & PROTO_BIT(f)))
                        continue;
                if (encode_field(&pk, &fields[f], m) < 0 && !ctx.failed) {
                        out->len = start;
                        return -EINVAL;
                }
        }
        if (ctx.failed) {
                out->len = start;
                return -ENOMEM;
        }
        return 0;
}

int proto_record_encode(ProtoBuf *out, const ProtoMsg *m)
{
        return encode_body(out, m);
}

void proto_items_init(ProtoItems *it, size_t budget)
{
        static const uint8_t array32_placeholder[5];

        /* Room for an array32 header, written once the count is known. */
        *it = (ProtoItems){ .budget = budget };
        if (proto_buf_append(&it->buf, array32_placeholder, sizeof(array32_placeholder)) < 0)
                it->failed = true;
}

bool proto_items_add(ProtoItems *it, const ProtoMsg *rec)
{
        size_t before = it->buf.len;

        if (it->full || it->failed)
                return false;
        if (proto_record_encode(&it->buf, rec) < 0) {
                it->failed = true;
                return false;
        }
        if (it->buf.len > it->budget) {
                it->buf.len = before;
                it->full = true;
                return false;
        }
        it->count++;
        return true;
}

ProtoRaw proto_items_finish(ProtoItems *it)
{
        if (it->failed)
                return (ProtoRaw){ 0 };
        it->buf.data[0] = 0xdd;
        it->buf.data[1] = (uint8_t)(it->count >> 24);
        it->buf.data[2] = (uint8_t)(it->count >> 16);
        it->buf.data[3] = (uint8_t)(it->count >> 8);
        it->buf.data[4] = (uint8_t)it->count;
        return (ProtoRaw){ it->buf.data, (uint32_t)it->buf.len, it->count };
}

void proto_items_free(ProtoItems *it)
{
        proto_buf_free(&it->buf);
}

void proto_reply_error(ProtoMsg *m, uint64_t id, unsigned status, const char *text)
{
        size_t len = text ? strnlen(text, PROTO_MAX_TEXT) : 0;

        proto_reply_init(m, id, status);
        proto_set_error(m, proto_str(proto_status_name(status)));
        proto_set_message(m, (ProtoStr){ text, (uint32_t)proto_utf8_trim(text ? text : "", len) });
}

/* ---- names ---- */

static const char *name_or(const char *const *tbl, unsigned n, unsigned i, const char *fallback)
{
        return i < n && tbl[i] ? tbl[i] : fallback;
}

const char *proto_op_name(ProtoOp op)
{
        return name_or(op_names, _PROTO_OP_MAX, op, "unknown");
}

const char *proto_event_name(ProtoEvent ev)
{
        return name_or(event_names, _PROTO_EV_MAX, ev, "unknown");
}

const char *proto_kind_name(ProtoKind kind)
{
        return name_or(kind_names, _PROTO_KIND_MAX, kind, "none");
}

const char *proto_mode_name(ProtoMode mode)
{
        return name_or(mode_names, _PROTO_MODE_MAX, mode, "none");
}

const char *proto_seat_name(ProtoSeat seat)
{
        return name_or(seat_names, _PROTO_SEAT_MAX, seat, "none");
}

const char *proto_state_name(ProtoState state)
{
        return name_or(state_names, _PROTO_STATE_MAX, state, "none");
}

const char *proto_field_name(ProtoField f)
{
        return f < _PF_MAX ? fields[f].key : "?";
}

ProtoKind proto_kind_from_name(const char *s)
{
        for (unsigned i = 1; s && i < _PROTO_KIND_MAX; i++)
                if (strcmp(kind_names[i], s) == 0)
                        return i;
        return PROTO_KIND_NONE;
}

bool proto_str_eq(ProtoStr s, const char *c)
{
        /* An absent string is {NULL, 0}: memcmp must not see its NULL, even for 0 bytes. */
        return strlen(c) == s.len && (s.len == 0 || memcmp(s.ptr, c, s.len) == 0);
}

char *proto_str_copy(ProtoStr s, char *buf, size_t cap)
{
        size_t n = s.len < cap - 1 ? s.len : cap - 1;

        if (n) /* memcpy must not see the NULL of an absent string, even for 0 bytes */
                memcpy(buf, s.ptr, n);
        buf[n] = 0;
        return buf;
}

bool proto_meta_valid(const uint8_t *raw, size_t len)
{
        MpReader r = { raw, raw + len };
        MpReader probe = r;
        uint32_t n;

        if (len > PROTO_MAX_META || mp_read_map(&probe, &n))
                return false;
        return mp_skip_utf8(&r, PROTO_MAX_DEPTH) == 0 && mp_at_end(&r);
}

const char *proto_strerror(int e)
{
        switch (e) {
        case 0: return "ok";
        case PROTO_E_LENGTH: return "the header's body length differs from the frame's";
        case PROTO_E_MAGIC: return "not a gpuipc frame (bad magic)";
        case PROTO_E_VERSION: return "unsupported frame version";
        case PROTO_E_TOO_BIG: return "frame exceeds the size or fd limits";
        case PROTO_E_MALFORMED: return "body is not a well-formed msgpack map";
        case PROTO_E_FIELD: return "a field has the wrong type or exceeds its limit";
        case PROTO_E_MISSING: return "a required field is missing";
        case PROTO_E_KIND: return "message is neither a request, a reply nor an event";
        case PROTO_E_DUPLICATE: return "a key appears twice in the message";
        case PROTO_E_RESERVED: return "the header's reserved bytes are not zero";
        case PROTO_E_UTF8: return "a string is not valid UTF-8";
        case PROTO_E_FDS: return "the frame carries another number of fds than its header announces";
        default: return "unknown protocol error";
        }
}
