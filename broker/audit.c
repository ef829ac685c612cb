/* The audit trail (audit.h): records built from a request and its reply, rate-limited, written as
 * log records. What it must never do: let a peer's bytes break a record (names are copied with
 * anything outside printable ASCII, quotes and backslashes replaced), or let a flood cost more than
 * a bucket check per record it drops. */
#include "audit.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "macro.h"
#include "registry.h"

/* A token bucket in thousandths of a record, full after a second without records. */
typedef struct Bucket {
        uint64_t last_ns;
        uint64_t milli;
} Bucket;

/* Buckets for this many uids; a uid beyond them takes the one used least recently (its owner then
 * starts full again: the broker's bucket still bounds the whole). */
#define AUDIT_UIDS 64

typedef struct UidBucket {
        bool used;
        uint32_t uid;
        Bucket b;
} UidBucket;

/* The open record of the request being handled. */
typedef struct Pending {
        bool open, replied;
        uint64_t peer, id, buffer, bytes, pidns;
        uint32_t uid, pid;
        ProtoOp op;
        ProtoKind kind;
        unsigned status;
        char name[PROTO_MAX_NAME + 1];
} Pending;

/* The broker is one thread: like log.c, the state is the module's, set once by audit_setup. */
static bool audit_on = true;
static uint32_t audit_rate = AUDIT_RATE_DEFAULT;
static Bucket global;
static UidBucket uids[AUDIT_UIDS];
static uint64_t suppressed, suppressed_total;
static Pending cur;

void audit_setup(bool on, uint32_t rate)
{
        audit_on = on;
        audit_rate = rate ? rate : 1;
}

uint64_t audit_suppressed_total(void)
{
        return suppressed_total;
}

static uint64_t now_ns(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Refills b for the time since its last use (at most a second's worth, which is also its size) and
 * takes one record from it if it has one. */
static bool bucket_take(Bucket *b, uint32_t rate, uint64_t now)
{
        uint64_t full = (uint64_t)rate * 1000, elapsed = now - b->last_ns;

        if (b->last_ns == 0 || elapsed >= 1000000000u)
                b->milli = full;
        else
                b->milli += elapsed * rate / 1000000; /* elapsed < 1 s: no overflow below 2^64 / 1e9 */
        if (b->milli > full)
                b->milli = full;
        b->last_ns = now;
        if (b->milli < 1000)
                return false;
        b->milli -= 1000;
        return true;
}

static Bucket *uid_bucket(uint32_t uid)
{
        UidBucket *oldest = &uids[0];

        for (size_t i = 0; i < AUDIT_UIDS; i++) {
                if (uids[i].used && uids[i].uid == uid)
                        return &uids[i].b;
                if (!uids[i].used || (oldest->used && uids[i].b.last_ns < oldest->b.last_ns))
                        oldest = &uids[i];
                if (!oldest->used)
                        break;
        }
        *oldest = (UidBucket){ .used = true, .uid = uid };
        return &oldest->b;
}

/* Whether a record of uid may be written now; reports, first, the records suppressed before it. */
static bool admit(uint32_t uid)
{
        uint64_t now = now_ns();
        uint32_t per_uid = audit_rate / 4 ? audit_rate / 4 : 1;

        if (!audit_on)
                return false;
        if (!bucket_take(uid_bucket(uid), per_uid, now) || !bucket_take(&global, audit_rate, now)) {
                suppressed++;
                suppressed_total++;
                return false;
        }
        if (suppressed) {
                log_audit("event=suppressed count=%llu", (unsigned long long)suppressed);
                suppressed = 0;
        }
        return true;
}

/* Copies a name a peer sent for a record: printable ASCII but quotes and backslashes, which would
 * end or escape the field, and anything else replaced with '?'. */
static void copy_name(char *dst, size_t size, const char *src, size_t len)
{
        size_t n = len < size - 1 ? len : size - 1;

        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)src[i];
                dst[i] = c < 0x20 || c > 0x7e || c == '"' || c == '\\' ? '?' : (char)c;
        }
        dst[n] = '\0';
}

static void write_record(const Pending *r)
{
        char kind[64] = "", name[PROTO_MAX_NAME + 16] = "", buffer[48] = "";

        if (!admit(r->uid))
                return;
        if (r->kind > PROTO_KIND_NONE && r->kind < _PROTO_KIND_MAX)
                snprintf(kind, sizeof(kind), " kind=%s bytes=%llu", proto_kind_name(r->kind),
                         (unsigned long long)r->bytes);
        if (r->name[0])
                snprintf(name, sizeof(name), " name=\"%s\"", r->name);
        if (r->buffer)
                snprintf(buffer, sizeof(buffer), " buffer=%llu", (unsigned long long)r->buffer);
        log_audit("event=%s result=%s peer=%llu uid=%u pid=%u pidns=%llu%s%s%s",
                  r->op == PROTO_OP_NONE ? "wait" : proto_op_name(r->op), proto_status_name(r->status),
                  (unsigned long long)r->peer, r->uid, r->pid, (unsigned long long)r->pidns, name, kind, buffer);
}

/* Operations recorded whatever their result; any other is recorded only when refused. */
static bool kept_op(ProtoOp op)
{
        switch (op) {
        case PROTO_OP_PUBLISH:
        case PROTO_OP_ATTACH:
        case PROTO_OP_RELEASE:
        case PROTO_OP_RETIRE:
        case PROTO_OP_FREE:
        case PROTO_OP_RECLAIM:
        case PROTO_OP_RING_CREATE:
        case PROTO_OP_RING_PART:
        case PROTO_OP_RING_JOIN:
        case PROTO_OP_RING_LEAVE:
        case PROTO_OP_RING_EVICT:
        case PROTO_OP_RING_CLOSE:
                return true;
        default:
                return false;
        }
}

static void who(Pending *r, const RegPeer *p)
{
        const PeerCreds *c = registry_peer_creds(p);

        r->peer = registry_peer_id(p);
        r->uid = c->uid;
        r->pid = c->pid;
        r->pidns = c->pidns;
}

void audit_request_begin(const Registry *reg, const RegPeer *p, const ProtoMsg *m)
{
        const RegBuffer *b = proto_has(m, PF_BUFFER) ? registry_buffer_by_id(reg, m->buffer) : NULL;

        cur = (Pending){ .open = true, .id = m->id, .op = m->op, .buffer = m->buffer };
        if (!audit_on)
                return;
        who(&cur, p);
        if (proto_has(m, PF_NAME))
                copy_name(cur.name, sizeof(cur.name), m->name.ptr, m->name.len);
        if (proto_has(m, PF_KIND)) {
                cur.kind = m->kind;
                cur.bytes = m->size;
        }
        /* A release, retire or free may free the buffer: what it was is read now. */
        if (b) {
                RegBufferView v;

                registry_buffer_view(b, &v);
                copy_name(cur.name, sizeof(cur.name), v.name, strlen(v.name));
                cur.kind = v.info.kind;
                cur.bytes = v.info.size;
        }
}

/* What a reply adds to a record: its status, and the buffer it describes or names. */
static void take_reply(Pending *r, const ProtoMsg *m)
{
        r->replied = true;
        r->status = (unsigned)m->status;
        if (m->status != PROTO_STATUS_OK)
                return;
        if (proto_has(m, PF_BUFFER))
                r->buffer = m->buffer;
        if (proto_has(m, PF_NAME))
                copy_name(r->name, sizeof(r->name), m->name.ptr, m->name.len);
        if (proto_has(m, PF_KIND) && proto_has(m, PF_SIZE)) {
                r->kind = m->kind;
                r->bytes = m->size;
        }
}

void audit_replied(void *ctx, RegPeer *to, const ProtoMsg *m)
{
        Pending late = { 0 };

        (void)ctx;
        if (!audit_on || m->type != PROTO_REPLY)
                return;
        if (cur.open && m->reply == cur.id && to && registry_peer_id(to) == cur.peer) {
                if (!cur.replied)
                        take_reply(&cur, m);
                return;
        }
        /* The answer to a request that waited: an attach (its reply describes the buffer), a group
         * join (it names the group), or, failed, either ("wait"). */
        if (!to)
                return;
        who(&late, to);
        take_reply(&late, m);
        if (proto_has(m, PF_SIZE))
                late.op = PROTO_OP_ATTACH;
        else if (proto_has(m, PF_GROUP))
                late.op = PROTO_OP_GROUP_JOIN;
        if (late.op == PROTO_OP_GROUP_JOIN && late.status == PROTO_STATUS_OK)
                return; /* a group's completion is no sharing: like its join, it is kept only refused */
        write_record(&late);
}

bool audit_request_end(void)
{
        bool kept = cur.open && (kept_op(cur.op) || (cur.replied && cur.status != PROTO_STATUS_OK));

        if (kept && cur.replied)
                write_record(&cur);
        cur.open = false;
        return kept;
}

void audit_peer_gone(uint64_t peer, const PeerCreds *c, AuditGone how, uint32_t refs, uint64_t buffers)
{
        static const char *const hows[] = { "closed", "exited", "dropped", "stopping" };

        if (!admit(c->uid))
                return;
        log_audit("event=peer-gone result=%s peer=%llu uid=%u pid=%u pidns=%llu refs=%u buffers=%llu", hows[how],
                  (unsigned long long)peer, c->uid, c->pid, (unsigned long long)c->pidns, refs,
                  (unsigned long long)buffers);
}

void audit_connection_refused(const PeerCreds *c, unsigned status)
{
        if (!admit(c->uid))
                return;
        log_audit("event=connect result=%s uid=%u pid=%u pidns=%llu", proto_status_name(status), c->uid, c->pid,
                  (unsigned long long)c->pidns);
}
