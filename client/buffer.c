/* Buffers: publishing and retiring on the producer side, attaching and releasing on the consumer
 * side, the consumer's mapping cache, what broker events mean for both, and registering all of it
 * again after a reconnect.
 *
 * Buffer ids are keys this process draws when it allocates memory, not numbers a broker hands out:
 * after a broker restart the same id names the same memory, so nothing a caller holds goes stale. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "cuda.h"
#include "internal.h"
#include "macro.h"

/* ---- ids ---- */

uint64_t client_new_buffer_id(void)
{
        uint64_t v = 0;

        /* getrandom blocks only before the kernel's pool is initialized, long before any of this. */
        while ((v & PROTO_MAX_BUFFER_ID) == 0)
                if (getrandom(&v, sizeof(v), 0) != sizeof(v))
                        v = monotonic_ms() ^ (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&v;
        return v & PROTO_MAX_BUFFER_ID;
}

/* ---- mapping cache ---- */

static Mapping *map_by_id(gpuipc_t *c, uint64_t id)
{
        return HMAP_FIND(&c->maps_by_id, hash_u64(id), Mapping, by_id, m, m->id == id);
}

/* Takes m out of the lookup tables; it lives on while referenced. */
static void map_uncache(gpuipc_t *c, Mapping *m)
{
        if (!m->in_cache)
                return;
        hmap_remove(&c->maps_by_id, &m->by_id);
        m->in_cache = false;
}

static void request_nowait(gpuipc_t *c, ProtoOp op, uint64_t buffer);

static void map_destroy(gpuipc_t *c, Mapping *m)
{
        /* The broker would skip the fd on our next attach of this buffer: tell it we let go. */
        if (m->broker_mapped && !c->broken)
                request_nowait(c, PROTO_OP_UNMAP, m->id);
        map_uncache(c, m);
        if (m->refs == 0 && list_linked(&m->idle_link)) {
                list_unlink(&m->idle_link);
                c->n_idle--;
        }
        kind_ops(m->kind)->unmap(c, m);
        free(m);
}

static void map_ref(gpuipc_t *c, Mapping *m)
{
        if (m->refs++ == 0 && list_linked(&m->idle_link)) {
                list_unlink(&m->idle_link);
                c->n_idle--;
        }
}

/* Drops a reference; an unreferenced mapping is kept for the next attach when its kind allows
 * it (memfd and cuda-vmm mappings keep their memory alive by themselves; a legacy open must be
 * closed before its producer frees the memory, so it is never kept). */
static void map_unref(gpuipc_t *c, Mapping *m)
{
        if (--m->refs > 0)
                return;
        if (!m->in_cache || m->revoked || m->kind == GPUIPC_KIND_CUDA_LEGACY || c->max_idle == 0) {
                map_destroy(c, m);
                return;
        }
        list_append(&c->idle, &m->idle_link);
        c->n_idle++;
        while (c->n_idle > c->max_idle)
                map_destroy(c, list_entry(c->idle.next, Mapping, idle_link));
}

_public_ void gpuipc_cache_trim(gpuipc_t *c)
{
        CLIENT_LOCKED(c);
        while (!list_empty(&c->idle))
                map_destroy(c, list_entry(c->idle.next, Mapping, idle_link));
}

/* ---- helpers ---- */

static int copy_meta(gpuipc_buffer_t *b, const void *meta, size_t len)
{
        int r = bytes_replace(&b->meta, meta, len);

        if (r == 0)
                b->meta_len = b->meta ? len : 0;
        return r;
}

static void buffer_destroy(gpuipc_buffer_t *b)
{
        list_unlink(&b->own_link);
        list_unlink(&b->attached_link);
        free(b->meta);
        free(b);
}

static gpuipc_buffer_t *own_by_id(gpuipc_t *c, uint64_t id)
{
        list_for_each(pos, &c->own) {
                gpuipc_buffer_t *b = list_entry(pos, gpuipc_buffer_t, own_link);
                if (b->id == id)
                        return b;
        }
        return NULL;
}



/* ---- producer ---- */

gpuipc_buffer_t *buffer_new_own(gpuipc_t *c, gpuipc_kind_t kind)
{
        gpuipc_buffer_t *b = calloc(1, sizeof(*b));

        if (!b)
                return NULL;
        b->conn = c;
        b->own = true;
        b->kind = kind;
        b->id = client_new_buffer_id(); /* the key it keeps for its whole life, across brokers */
        b->ka.fd = -1;
        b->ordinal = -1;
        return b;
}

_public_ int gpuipc_buffer_alloc(gpuipc_t *c, gpuipc_kind_t kind, size_t size, int device, gpuipc_buffer_t **ret)
{
        CLIENT_LOCKED(c);
        const KindOps *ops = kind_ops(kind);
        gpuipc_buffer_t *b;
        int r;

        if (!c || !ret)
                return GPUIPC_E_INVALID;
        if (!ops) {
                client_errmsg(c, "unknown buffer kind %d", (int)kind);
                return GPUIPC_E_INVALID;
        }
        r = size_limit_check(c, kind, size);
        if (r < 0)
                return r;
        b = buffer_new_own(c, kind);
        if (!b)
                return client_fail(c, -ENOMEM, "out of memory");
        r = ops->alloc(c, b, size, device);
        if (r < 0) {
                free(b);
                return r;
        }
        list_append(&c->own, &b->own_link);
        *ret = b;
        return 0;
}

/* What travels with the first publish of b: its memory's fd (for a view: its segment's, the first
 * time this broker hears of the segment) or its legacy handle. */
static int publish_export(gpuipc_t *c, gpuipc_buffer_t *b, int *ret_fd)
{
        gpuipc_buffer_t *s = b->segment;

        *ret_fd = -1;
        if (!s)
                return kind_ops(b->kind)->export(c, b, b->writable, ret_fd);
        if (s->registered)
                return 0;
        return kind_ops(s->kind)->export(c, s, s->writable, ret_fd);
}

_public_ int gpuipc_buffer_view(gpuipc_t *c, gpuipc_buffer_t *segment, size_t offset, size_t size,
                                gpuipc_buffer_t **ret)
{
        CLIENT_LOCKED(c);
        gpuipc_buffer_t *b;

        if (!c || !segment || !ret)
                return GPUIPC_E_INVALID;
        if (size == 0)
                return client_fail(c, GPUIPC_E_INVALID, "a view needs at least 1 byte");
        if (!segment->own || segment->conn != c || segment->segment || segment->ring_part ||
            (segment->kind != GPUIPC_KIND_MEMFD && segment->kind != GPUIPC_KIND_CUDA_VMM)) {
                client_errmsg(c, "views are of this connection's own memfd or cuda-vmm buffers (not of views, ring "
                              "slots or cuda-legacy memory)");
                return GPUIPC_E_INVALID;
        }
        if (offset > segment->size || size > segment->size - offset) {
                client_errmsg(c, "the view [%zu, +%zu) lies outside the %zu-byte buffer", offset, size, segment->size);
                return GPUIPC_E_INVALID;
        }
        b = buffer_new_own(c, segment->kind);
        if (!b)
                return -ENOMEM;
        b->segment = segment;
        b->view_offset = offset;
        b->size = size;
        b->ptr = (char *)segment->ptr + offset;
        b->ordinal = segment->ordinal;
        memcpy(b->device, segment->device, sizeof(b->device));
        segment->n_views++;
        list_append(&c->own, &b->own_link);
        *ret = b;
        return 0;
}

/* Registers b with the broker (the memory's fd or handle travels). restore: b was registered with a
 * broker we lost, as b->state says (live or retired), and consumers may still hold it. */
static int publish_new(gpuipc_t *c, gpuipc_buffer_t *b, const char *name, bool restore, Frame *f)
{
        ProtoMsg req;
        int fd = -1, r;

        r = publish_export(c, b, &fd);
        if (r < 0)
                return r;
        proto_request_init(&req, PROTO_OP_PUBLISH);
        proto_set_name(&req, proto_str(name));
        proto_set_buffer(&req, b->id);
        if (restore) {
                proto_set_restored(&req, true);
                proto_set_generation(&req, b->generation);
                proto_set_state(&req, b->state);
        }
        proto_set_kind(&req, (ProtoKind)b->kind);
        proto_set_size(&req, b->size);
        proto_set_writable(&req, b->writable);
        proto_set_broker_held(&req, b->broker_held);
        proto_set_retire_after(&req, b->retire_after);
        if (b->device[0])
                proto_set_device(&req, proto_str(b->device));
        if (b->kind == GPUIPC_KIND_CUDA_LEGACY) {
                proto_set_offset(&req, b->ka.dptr - b->ka.base);
                proto_set_handle(&req, (ProtoStr){ (const char *)b->ka.ipc_handle, PROTO_LEGACY_HANDLE_SIZE });
        }
        if (b->segment) {
                proto_set_segment(&req, b->segment->id);
                proto_set_offset(&req, b->view_offset);
                if (fd >= 0)
                        proto_set_segment_size(&req, b->segment->size);
        }
        if (b->meta_len)
                proto_set_meta(&req, (ProtoRaw){ b->meta, (uint32_t)b->meta_len, 1 });
        r = client_request(c, &req, fd, CLIENT_REQUEST_TIMEOUT_MS, f);
        /* (After a failure the fd travels again: the broker closes it if it registered the segment.) */
        if (b->segment && r == 0 && fd >= 0)
                b->segment->registered = true;
        return r;
}

/* Publishes an idle, registered buffer again: one round trip, nothing travels. */
static int publish_again(gpuipc_t *c, gpuipc_buffer_t *b, const char *name, bool new_meta, Frame *f)
{
        ProtoMsg req;

        proto_request_init(&req, PROTO_OP_PUBLISH);
        proto_set_name(&req, proto_str(name));
        proto_set_buffer(&req, b->id);
        proto_set_retire_after(&req, b->retire_after);
        if (new_meta)
                proto_set_meta(&req, (ProtoRaw){ b->meta, (uint32_t)b->meta_len, b->meta_len ? 1 : 0 });
        return client_request(c, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, f);
}

/* The caller never saw b published (buffer_on_late_publish withdrew it), so it need not wait for
 * drained: we do, for as long as a request may take. */
static int wait_withdrawn(gpuipc_t *c, gpuipc_buffer_t *b)
{
        int r = gpuipc_wait_drained(c, b, CLIENT_REQUEST_TIMEOUT_MS);

        if (r == GPUIPC_E_TIMEOUT) {
                client_errmsg(c, "an earlier publish of this buffer that timed out went through after all, and a "
                              "consumer attached it before it was withdrawn; wait for its drained event");
                return GPUIPC_E_STATE;
        }
        return r;
}

_public_ int gpuipc_publish(gpuipc_t *c, gpuipc_buffer_t *b, const char *name, const gpuipc_publish_options_t *opts)
{
        CLIENT_LOCKED(c);
        gpuipc_publish_options_t o;
        Frame f = { .fd = -1 };
        bool first;
        int r;

        if (!c || !b || !name)
                return GPUIPC_E_INVALID;
        if (!b->own)
                return client_fail(c, GPUIPC_E_INVALID, "'%s' is attached, not this connection's own: only its "
                                   "producer publishes it", b->name);
        r = client_check_name(c, name, "buffer name", false, 0);
        if (r < 0)
                return r;
        if (client_copy_options(&o, sizeof(o), opts) < 0) {
                client_errmsg(c, "gpuipc_publish_options_t.struct_size is 0: set it to "
                              "sizeof(gpuipc_publish_options_t)");
                return GPUIPC_E_INVALID;
        }
        if (o.meta_len > PROTO_MAX_META || (o.meta_len && !proto_meta_valid(o.meta, o.meta_len))) {
                client_errmsg(c, "metadata must be one msgpack map of at most %d bytes", PROTO_MAX_META);
                return GPUIPC_E_INVALID;
        }
        if (b->state == PROTO_STATE_RETIRED && b->withdrawn && (r = wait_withdrawn(c, b)) < 0)
                return r;
        if (b->state == PROTO_STATE_LIVE || b->state == PROTO_STATE_RETIRED) {
                client_errmsg(c, "'%s' is still %s; retire it and wait for drained before publishing it again",
                              b->name, b->state == PROTO_STATE_LIVE ? "published" : "referenced");
                return GPUIPC_E_STATE;
        }
        first = !b->registered;
        if (b->state == PROTO_STATE_NONE)
                b->writable = o.writable;
        b->broker_held = o.broker_held;
        if (b->segment) {
                /* The memory is the segment's: the first view published of it sets what consumers may
                 * do with it (unless its pool did), and every view shares that. */
                if (!b->segment->registered && !b->segment->attrs_fixed) {
                        b->segment->writable = o.writable;
                        b->segment->broker_held = o.broker_held;
                }
                b->writable = b->segment->writable;
                b->broker_held = b->segment->broker_held;
        }
        b->retire_after = o.retire_after;
        if ((o.meta_len || b->state == PROTO_STATE_NONE) && copy_meta(b, o.meta, o.meta_len) < 0)
                return -ENOMEM;
        if (b->segment && b->segment->pool_seg && (r = pool_view_publishing(b)) < 0)
                return r;
        if (!o.no_sync && kind_ops(b->kind)->sync) {
                r = kind_ops(b->kind)->sync(c, b);
                if (r < 0)
                        return r;
        }
        r = first ? publish_new(c, b, name, false, &f) : publish_again(c, b, name, o.meta_len > 0, &f);
        /* A reconnect on the way re-registered nothing idle: the memory travels once more. */
        if (r == GPUIPC_E_NOT_FOUND && !first && !b->registered)
                r = publish_new(c, b, name, false, &f);
        /* An earlier publish of b that timed out went through after all: its late reply, read while
         * this one waited, withdrew it (buffer_on_late_publish) and b is registered now. */
        if (r == GPUIPC_E_KEY_TAKEN && first && b->registered)
                r = publish_again(c, b, name, b->meta_len > 0, &f);
        /* The broker forgot the segment we thought it knew (a connection it dropped): it travels again. */
        if (r == GPUIPC_E_NOT_FOUND && first && b->segment && b->segment->registered) {
                b->segment->registered = false;
                r = publish_new(c, b, name, false, &f);
        }
        if (r < 0)
                return r;
        b->registered = true;
        b->withdrawn = false;
        b->generation = f.msg.generation;
        b->state = PROTO_STATE_LIVE;
        snprintf(b->name, sizeof(b->name), "%s", name);
        frame_free(&f);
        return 0;
}

static int simple_request(gpuipc_t *c, ProtoOp op, uint64_t buffer)
{
        Frame f = { .fd = -1 };
        ProtoMsg req;
        int r;

        proto_request_init(&req, op);
        proto_set_buffer(&req, buffer);
        r = client_request(c, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, &f);

        if (r == 0)
                frame_free(&f);
        return r;
}

_public_ int gpuipc_retire(gpuipc_t *c, gpuipc_buffer_t *b)
{
        CLIENT_LOCKED(c);
        int r;

        if (!c || !b)
                return GPUIPC_E_INVALID;
        if (!b->own)
                return client_fail(c, GPUIPC_E_INVALID, "'%s' is attached, not this connection's own: only its "
                                   "producer retires it", b->name);
        if (b->state != PROTO_STATE_LIVE)
                return 0; /* retiring twice, or what was never published: nothing to do */
        r = simple_request(c, PROTO_OP_RETIRE, b->id);
        if (r < 0)
                return r;
        /* The drained event may already have been handled while we waited for this reply. */
        if (b->state == PROTO_STATE_LIVE)
                b->state = PROTO_STATE_RETIRED;
        return 0;
}

_public_ int gpuipc_wait_drained(gpuipc_t *c, gpuipc_buffer_t *b, int timeout_ms)
{
        CLIENT_LOCKED(c);
        uint64_t deadline = client_deadline(timeout_ms);

        if (!c || !b)
                return GPUIPC_E_INVALID;
        if (!b->own)
                return client_fail(c, GPUIPC_E_INVALID, "'%s' is attached, not this connection's own: only its "
                                   "producer waits for it to drain", b->name);
        /* A live buffer without retire_after can never drain: waiting would only run out the
         * timeout (or hang with -1), so it is refused at once. retire_after retires it by itself. */
        if (b->state == PROTO_STATE_LIVE && b->retire_after == 0) {
                client_errmsg(c, "'%s' is still published: retire it first", b->name);
                return GPUIPC_E_STATE;
        }
        while (b->state == PROTO_STATE_LIVE || b->state == PROTO_STATE_RETIRED) {
                int left = client_remaining_ms(deadline), r;

                if (left == 0) {
                        client_errmsg(c, "'%s' still has references", b->name);
                        return GPUIPC_E_TIMEOUT;
                }
                r = client_pump(c, left);
                if (r < 0)
                        return r;
        }
        /* The drained event this wait consumed is dropped from the queue: the caller learnt it
         * from the return value, and would otherwise see it a second time. */
        client_drop_events(c, GPUIPC_EVENT_DRAINED, b->id);
        return 0;
}

/* ---- consumer ---- */

/* map_for_reply()'s answer when the broker counted on a cached mapping we do not hold: it sent the
 * fd with a reply we had stopped waiting for (attach() asks again). */
#define MAP_NOT_CACHED 1

/* The id of the mapping an attach reply stands for: a view's memory is its segment's. */
static uint64_t mapping_id(const ProtoMsg *m)
{
        return proto_has(m, PF_SEGMENT) ? m->segment : m->buffer;
}

/* The mapping an attach reply stands for, with a reference taken: the cached one, or a new import
 * of the fd that came with the reply (which f gives up either way). 0, MAP_NOT_CACHED, or an error. */
static int map_for_reply(gpuipc_t *c, Frame *f, Mapping **ret)
{
        const ProtoMsg *m = &f->msg;
        bool view = proto_has(m, PF_SEGMENT);
        /* A view's memory is its segment's: one mapping serves every view of it. */
        uint64_t id = mapping_id(m);
        size_t size = view ? m->segment_size : m->size;
        Mapping *map = map_by_id(c, id);
        _cleanup_free_ Mapping *fresh = NULL;
        int r;

        /* Checked without overflow (offset + size could wrap): a view reaching past its segment
         * would hand the caller a pointer beyond the mapping. */
        if (view && (m->offset > size || m->size > size - m->offset || (map && map->size != size))) {
                client_errmsg(c, "the broker described view %llu as [%llu, +%llu) of a %zu-byte segment %llu",
                              (unsigned long long)m->buffer, (unsigned long long)m->offset,
                              (unsigned long long)m->size, size, (unsigned long long)id);
                return GPUIPC_E_BAD_REPLY;
        }
        if (m->cached && !map)
                return MAP_NOT_CACHED;
        if (!map) {
                fresh = calloc(1, sizeof(*fresh));
                if (!fresh)
                        return -ENOMEM;
                fresh->id = id;
                fresh->kind = (gpuipc_kind_t)m->kind;
                fresh->size = size;
                fresh->writable = m->writable;
                fresh->ordinal = -1;
                fresh->broker_mapped = f->fd >= 0;
                r = kind_ops(fresh->kind)->import(c, fresh, m, steal_fd(f->fd));
                if (r < 0)
                        return r;
                map = steal_ptr(fresh);
                /* Not cached if the insert fails (out of memory): the mapping still serves this
                 * attach, and the next one imports again. */
                if (hmap_insert(&c->maps_by_id, &map->by_id, hash_u64(map->id)) == 0)
                        map->in_cache = true;
        }
        if (f->fd >= 0)
                map->broker_mapped = true;
        f->fd = safe_close(f->fd); /* an fd we did not need: the mapping already exists */
        map_ref(c, map);
        *ret = map;
        return 0;
}

/* Builds the caller's handle for an attach reply, importing the memory unless cached. */
static int attach_finish(gpuipc_t *c, Frame *f, gpuipc_buffer_t **ret)
{
        const ProtoMsg *m = &f->msg;
        _cleanup_free_ gpuipc_buffer_t *b = NULL;
        Mapping *map;
        int r;

        if (!kind_ops((gpuipc_kind_t)m->kind)) {
                client_errmsg(c, "the broker attached a buffer of an unknown kind");
                return GPUIPC_E_BAD_REPLY;
        }
        b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        r = map_for_reply(c, f, &map);
        if (r != 0)
                return r;
        b->conn = c;
        b->kind = map->kind;
        b->size = map->size;
        b->ptr = map->ptr;
        if (proto_has(m, PF_SEGMENT)) {
                b->segment_id = m->segment;
                b->view_offset = m->offset;
                b->size = m->size;
                b->ptr = (char *)map->ptr + m->offset;
        }
        b->ordinal = map->ordinal;
        b->writable = map->writable;
        b->id = m->buffer;
        b->generation = m->generation;
        b->owner_uid = (uint32_t)m->uid;
        b->map = map;
        proto_str_copy(m->name, b->name, sizeof(b->name));
        proto_str_copy(m->device, b->device, sizeof(b->device));
        if (m->meta.len && copy_meta(b, m->meta.ptr, m->meta.len) < 0) {
                map_unref(c, map);
                return -ENOMEM;
        }
        list_append(&c->attached, &b->attached_link);
        *ret = steal_ptr(b);
        return 0;
}

static int attach_once(gpuipc_t *c, ProtoMsg *req, int timeout_ms, gpuipc_buffer_t **ret);

static int attach(gpuipc_t *c, const char *name, uint64_t id, int timeout_ms, gpuipc_buffer_t **ret)
{
        ProtoMsg req;
        int r;

        if (!c || !ret)
                return GPUIPC_E_INVALID;
        if (name && (r = client_check_name(c, name, "buffer name", false, 0)) < 0)
                return r;
        proto_request_init(&req, PROTO_OP_ATTACH);
        if (name) {
                proto_set_name(&req, proto_str(name));
                proto_set_timeout_ms(&req, timeout_ms < 0 ? PROTO_TIMEOUT_INFINITE : (uint64_t)timeout_ms);
        } else {
                proto_set_buffer(&req, id);
        }
        for (int tries = 0;; tries++) {
                r = attach_once(c, &req, timeout_ms, ret);
                if (r != MAP_NOT_CACHED)
                        return r;
                if (tries > 0) {
                        if (name)
                                client_errmsg(c, "the broker said twice that our cached mapping of '%s' serves, "
                                              "but we hold none", name);
                        else
                                client_errmsg(c, "the broker said twice that our cached mapping of buffer %llu "
                                              "serves, but we hold none", (unsigned long long)id);
                        return GPUIPC_E_BAD_REPLY;
                }
        }
}

/* One attach request and its reply made into a buffer; MAP_NOT_CACHED when the broker counted on a
 * mapping we do not hold: the reference is given back and the broker told, so that asking again
 * brings the fd. */
static int attach_once(gpuipc_t *c, ProtoMsg *req, int timeout_ms, gpuipc_buffer_t **ret)
{
        Frame f = { .fd = -1 };
        int r;

        r = client_request(c, req, -1, client_reply_deadline_ms(timeout_ms), &f);
        if (r == GPUIPC_E_DEVICE && cuda_load() < 0) {
                /* We declared no GPU because CUDA does not work in this process: say that, it is
                 * the cause the broker cannot see. */
                char *msg = client_errbuf(c);
                size_t n = strlen(msg);

                snprintf(msg + n, sizeof(c->errmsg) - n, " (CUDA is unusable in this process: %s)",
                         cuda_load_error());
        }
        if (r < 0)
                return r;
        r = attach_finish(c, &f, ret);
        if (r != 0) {
                /* We hold a reference we cannot use: give it back. */
                uint64_t buffer = f.msg.buffer, map_id = mapping_id(&f.msg);
                char why[sizeof(c->errmsg)];

                frame_free(&f);
                memcpy(why, client_errbuf(c), sizeof(why));
                simple_request(c, PROTO_OP_RELEASE, buffer);
                if (r == MAP_NOT_CACHED)
                        request_nowait(c, PROTO_OP_UNMAP, map_id); /* taken before our next request */
                memcpy(client_errbuf(c), why, sizeof(why));
                return r;
        }
        frame_free(&f);
        return 0;
}

_public_ int gpuipc_attach(gpuipc_t *c, const char *name, int timeout_ms, gpuipc_buffer_t **ret)
{
        CLIENT_LOCKED(c);
        if (!name)
                return GPUIPC_E_INVALID;
        return attach(c, name, 0, timeout_ms, ret);
}

_public_ int gpuipc_attach_id(gpuipc_t *c, uint64_t buffer_id, gpuipc_buffer_t **ret)
{
        CLIENT_LOCKED(c);
        return attach(c, NULL, buffer_id, 0, ret);
}

_public_ int gpuipc_release(gpuipc_t *c, gpuipc_buffer_t *b)
{
        CLIENT_LOCKED(c);
        int r = 0;

        if (!c || !b)
                return GPUIPC_E_INVALID;
        if (b->own)
                return client_fail(c, GPUIPC_E_INVALID, "this buffer is this connection's own: drop it with "
                                   "gpuipc_buffer_free");
        /* After a revoke the broker holds no reference for us any more. The revoked event may also
         * arrive while the release is on its way (it comes before the reply): that is no error. */
        if (!b->revoked) {
                r = simple_request(c, PROTO_OP_RELEASE, b->id);
                if ((r == GPUIPC_E_NOT_ATTACHED && b->revoked) || (r == GPUIPC_E_DISCONNECTED && !c->reconnect))
                        r = 0; /* without reconnecting, the broker dropped our references with the connection */
        }
        map_unref(c, b->map);
        buffer_destroy(b);
        return r;
}

/* ---- either side ---- */

int buffer_unregister(gpuipc_t *c, gpuipc_buffer_t *b)
{
        int r;

        if (!b->registered || c->broken)
                return 0;
        r = simple_request(c, PROTO_OP_FREE, b->id);
        b->registered = false;
        return r == GPUIPC_E_NOT_FOUND || r == GPUIPC_E_DISCONNECTED ? 0 : r;
}

void buffer_free_local(gpuipc_t *c, gpuipc_buffer_t *b)
{
        if (b->segment) {
                /* The memory is the segment's, which may now hand the range out again. */
                b->segment->n_views--;
                if (b->segment->pool_seg)
                        pool_view_gone(b);
        } else {
                kind_ops(b->kind)->free(c, b);
        }
        buffer_destroy(b);
}

_public_ int gpuipc_buffer_free(gpuipc_t *c, gpuipc_buffer_t *b)
{
        CLIENT_LOCKED(c);
        int r = 0;

        if (!c || !b)
                return GPUIPC_E_INVALID;
        if (!b->own) {
                client_errmsg(c, "'%s' is attached, not this connection's own: drop it with gpuipc_release", b->name);
                return GPUIPC_E_INVALID;
        }
        if (b->n_views) {
                client_errmsg(c, "%u views of this buffer are not freed yet: free them first", b->n_views);
                return GPUIPC_E_BUSY;
        }
        /* Legacy memory must outlive every consumer's open handle: that is what drained says. */
        if (b->kind == GPUIPC_KIND_CUDA_LEGACY && (b->state == PROTO_STATE_LIVE || b->state == PROTO_STATE_RETIRED)) {
                client_errmsg(c, "'%s' may still be open in a consumer: retire it and wait for drained first", b->name);
                return GPUIPC_E_BUSY;
        }
        r = buffer_unregister(c, b);
        buffer_free_local(c, b);
        return r;
}

_public_ int gpuipc_set_device(gpuipc_t *c, int ordinal)
{
        CLIENT_LOCKED(c);
        if (!c)
                return GPUIPC_E_INVALID;
        if (ordinal < -1)
                return client_fail(c, GPUIPC_E_INVALID, "device %d: a device is an ordinal from 0, or -1 (the "
                                   "buffer's own)", ordinal);
        c->device_pref = ordinal;
        return 0;
}

static int buffer_copy(const gpuipc_buffer_t *b, size_t offset, void *host, size_t len, bool to_host)
{
        if (!b || !b->ptr || offset > b->size || len > b->size - offset)
                return GPUIPC_E_INVALID;
        if (to_host && b->revoked)
                return GPUIPC_E_REVOKED;
        if (!to_host && !b->own && !b->writable)
                return -EACCES;
        return kind_ops(b->kind)->copy((char *)b->ptr + offset, b->ordinal, host, len, to_host);
}

_public_ int gpuipc_buffer_copy_in(gpuipc_buffer_t *b, const gpuipc_copy_t *items, size_t n, void *cu_stream)
{
        CLIENT_LOCKED(b ? b->conn : NULL);
        if (!b || !b->ptr || (n && !items))
                return GPUIPC_E_INVALID;
        if (!b->own && !b->writable)
                return client_fail(b->conn, -EACCES, "'%s' was published read-only", b->name);
        if (b->revoked)
                return client_fail(b->conn, GPUIPC_E_REVOKED, "'%s' was revoked: its memory is gone", b->name);
        for (size_t i = 0; i < n; i++) {
                if (items[i].offset > b->size || items[i].len > b->size - items[i].offset) {
                        client_errmsg(b->conn, "copy %zu: [%zu, +%zu) lies outside the %zu-byte buffer", i,
                                      items[i].offset, items[i].len, b->size);
                        return GPUIPC_E_INVALID;
                }
        }
        if (b->kind == GPUIPC_KIND_MEMFD) {
                for (size_t i = 0; i < n; i++)
                        memcpy((char *)b->ptr + items[i].offset, (const void *)(uintptr_t)items[i].src, items[i].len);
                return 0;
        }
        return cuda_copy_batch(b->conn, b->ptr, b->ordinal, items, n, cu_stream);
}

_public_ int gpuipc_buffer_read(const gpuipc_buffer_t *b, size_t offset, void *dst, size_t len)
{
        CLIENT_LOCKED(b ? b->conn : NULL);
        return buffer_copy(b, offset, dst, len, true);
}

_public_ int gpuipc_buffer_write(gpuipc_buffer_t *b, size_t offset, const void *src, size_t len)
{
        CLIENT_LOCKED(b ? b->conn : NULL);
        return buffer_copy(b, offset, (void *)src, len, false);
}

_public_ void *gpuipc_buffer_ptr(const gpuipc_buffer_t *b)
{
        return b ? b->ptr : NULL;
}

_public_ size_t gpuipc_buffer_size(const gpuipc_buffer_t *b)
{
        return b ? b->size : 0;
}

_public_ gpuipc_kind_t gpuipc_buffer_kind(const gpuipc_buffer_t *b)
{
        return b ? b->kind : 0;
}

_public_ uint64_t gpuipc_buffer_id(const gpuipc_buffer_t *b)
{
        return b ? b->id : 0;
}

_public_ uint64_t gpuipc_buffer_generation(const gpuipc_buffer_t *b)
{
        CLIENT_LOCKED(b ? b->conn : NULL);
        return b ? b->generation : 0;
}

_public_ const char *gpuipc_buffer_name(const gpuipc_buffer_t *b)
{
        CLIENT_LOCKED(b ? b->conn : NULL);
        return b ? b->name : "";
}

_public_ const char *gpuipc_buffer_device(const gpuipc_buffer_t *b)
{
        return b ? b->device : "";
}

_public_ int gpuipc_buffer_device_ordinal(const gpuipc_buffer_t *b)
{
        return b ? b->ordinal : -1;
}

_public_ int gpuipc_buffer_writable(const gpuipc_buffer_t *b)
{
        return b ? b->writable : 0;
}

_public_ const void *gpuipc_buffer_meta(const gpuipc_buffer_t *b, size_t *ret_len)
{
        CLIENT_LOCKED(b ? b->conn : NULL);
        if (ret_len)
                *ret_len = b ? b->meta_len : 0;
        return b && b->meta_len ? b->meta : NULL;
}

_public_ int gpuipc_buffer_revoked(const gpuipc_buffer_t *b)
{
        CLIENT_LOCKED(b ? b->conn : NULL);
        return b ? b->revoked : 0;
}

_public_ uint64_t gpuipc_buffer_segment(const gpuipc_buffer_t *b)
{
        if (!b)
                return 0;
        return b->own ? (b->segment ? b->segment->id : 0) : b->segment_id;
}

/* ---- broker events ---- */

/* Tells the broker something it only needs to hear (unmap, release), without waiting: this runs
 * inside event handling too, where no request may wait for its reply. */
static void request_nowait(gpuipc_t *c, ProtoOp op, uint64_t buffer)
{
        ProtoMsg req;

        proto_request_init(&req, op);
        proto_set_buffer(&req, buffer);
        (void)client_send_nowait(c, &req);
}

void buffer_on_late_attach(gpuipc_t *c, const ProtoMsg *reply, bool with_fd)
{
        Mapping *map;

        if (!proto_has(reply, PF_BUFFER))
                return;
        request_nowait(c, PROTO_OP_RELEASE, reply->buffer);
        if (!with_fd)
                return; /* "your cached mapping serves": the broker's belief is ours already */
        /* The broker sent the fd, so it counts on our cache to hold a mapping from now on and would
         * send none with the next attach; the fd is gone with the reply. */
        map = map_by_id(c, mapping_id(reply));
        if (map)
                map->broker_mapped = true;
        else
                request_nowait(c, PROTO_OP_UNMAP, mapping_id(reply));
}

void buffer_on_late_publish(gpuipc_t *c, const ProtoMsg *reply)
{
        gpuipc_buffer_t *b;

        if (!proto_has(reply, PF_BUFFER))
                return;
        b = own_by_id(c, reply->buffer);
        if (!b) {
                /* Freed by the caller since: the broker forgets it once whoever attached it is done. */
                request_nowait(c, PROTO_OP_FREE, reply->buffer);
                return;
        }
        if (b->state == PROTO_STATE_LIVE)
                return; /* cannot happen (a later publish of b would have been refused): nothing to undo */
        /* The broker knows the memory now (a view's segment too); retired, it drains, and the
         * drained event makes b idle, ready to be published again. */
        b->registered = true;
        if (b->segment)
                b->segment->registered = true;
        b->generation = reply->generation;
        b->state = PROTO_STATE_RETIRED;
        b->withdrawn = true;
        request_nowait(c, PROTO_OP_RETIRE, b->id);
}

void buffer_on_event(gpuipc_t *c, const ProtoMsg *m)
{
        gpuipc_event_t ev = { 0 };
        Mapping *map;

        switch (m->event) {
        case PROTO_EV_FREED:
                /* Internal: the broker forgot the buffer, so our idle mapping can never serve again. */
                map = map_by_id(c, m->buffer);
                if (map) {
                        map->broker_mapped = false;
                        if (map->refs == 0)
                                map_destroy(c, map);
                        else
                                map_uncache(c, map);
                }
                return;
        case PROTO_EV_DRAINED:
                if (!proto_has(m, PF_SUB)) {
                        gpuipc_buffer_t *b = own_by_id(c, m->buffer);
                        /* A buffer the caller already freed: nobody will ever ask about it. */
                        if (!b)
                                return;
                        if (b->generation == m->generation) {
                                b->state = PROTO_STATE_IDLE;
                                if (b->segment && b->segment->pool_seg)
                                        pool_view_drained(b); /* its range may be handed out again */
                                /* The caller never saw that publication: nor does it see it drain. */
                                if (b->withdrawn) {
                                        b->withdrawn = false;
                                        return;
                                }
                        }
                }
                ev.type = GPUIPC_EVENT_DRAINED;
                break;
        case PROTO_EV_REVOKED:
                if (!proto_has(m, PF_SUB)) {
                        list_for_each(pos, &c->attached) {
                                gpuipc_buffer_t *b = list_entry(pos, gpuipc_buffer_t, attached_link);
                                if (b->id == m->buffer)
                                        b->revoked = true;
                        }
                        map = map_by_id(c, m->buffer);
                        if (map) {
                                map->revoked = true;
                                map->broker_mapped = false;
                                map_uncache(c, map);
                        }
                }
                ev.type = GPUIPC_EVENT_REVOKED;
                break;
        case PROTO_EV_PUBLISHED:
                ev.type = GPUIPC_EVENT_PUBLISHED;
                break;
        case PROTO_EV_RETIRED:
                ev.type = GPUIPC_EVENT_RETIRED;
                break;
        default:
                return; /* from a newer broker: nothing we can act on */
        }
        ev.subscription = proto_has(m, PF_SUB) ? client_subscription_id(c, m->sub) : 0;
        if (proto_has(m, PF_SUB) && ev.subscription == 0)
                return; /* a subscription we already cancelled */
        ev.buffer = m->buffer;
        ev.generation = m->generation;
        ev.kind = (gpuipc_kind_t)m->kind;
        proto_str_copy(m->name, ev.name, sizeof(ev.name));
        proto_str_copy(m->reason, ev.reason, sizeof(ev.reason));
        client_queue_event(c, &ev);
}

/* ---- reconnect and close ---- */

/* Queues an event about one of this connection's own buffers. */
static void queue_own_event(gpuipc_t *c, gpuipc_event_type_t type, const gpuipc_buffer_t *b, const char *reason)
{
        gpuipc_event_t ev = { .type = type, .buffer = b->id, .generation = b->generation, .kind = b->kind };

        snprintf(ev.name, sizeof(ev.name), "%s", b->name);
        snprintf(ev.reason, sizeof(ev.reason), "%s", reason);
        client_queue_event(c, &ev);
}

/* Registers a live or retired own buffer with the broker we reconnected to. */
static int restore_own(gpuipc_t *c, gpuipc_buffer_t *b)
{
        char why[sizeof(((gpuipc_event_t *)0)->reason)];
        Frame f = { .fd = -1 };
        ProtoState was = b->state;
        int r = publish_new(c, b, b->name, true, &f);

        if (r == GPUIPC_E_DISCONNECTED)
                return r; /* lost again: the next reconnect starts over */
        if (r < 0) {
                /* Not registered: consumers that still hold it are told when the broker's restart
                 * grace ends. Until then they may read it, so it is not ours to reuse: it stays
                 * retired, without a drained event, and freeing it is the way out. */
                snprintf(why, sizeof(why), "could not be registered again after the broker restarted: %.180s",
                         client_errbuf(c));
                b->state = PROTO_STATE_RETIRED;
                queue_own_event(c, GPUIPC_EVENT_REVOKED, b, why);
                return 0;
        }
        b->registered = true;
        b->state = proto_has(&f.msg, PF_STATE) ? f.msg.state : was;
        frame_free(&f);
        if (was == PROTO_STATE_LIVE && b->state == PROTO_STATE_RETIRED)
                queue_own_event(c, GPUIPC_EVENT_RETIRED, b, "another producer published under its name while the "
                                "broker was away; it is retired, and drains once its holders let go");
        return 0;
}

/* Marks every handle of b's buffer revoked: the broker could not give the references back. Its
 * mapping serves no new attach, unless it is a segment's that other views still use. */
static void revoke_handles(gpuipc_t *c, const gpuipc_buffer_t *b, const char *why)
{
        gpuipc_event_t ev = { .type = GPUIPC_EVENT_REVOKED, .buffer = b->id, .generation = b->generation,
                              .kind = b->kind };
        Mapping *m = b->map;

        snprintf(ev.name, sizeof(ev.name), "%s", b->name);
        list_for_each(pos, &c->attached) {
                gpuipc_buffer_t *x = list_entry(pos, gpuipc_buffer_t, attached_link);
                if (x->id == ev.buffer)
                        x->revoked = true;
        }
        if (m->id == ev.buffer) {
                m->revoked = true;
                m->broker_mapped = false;
                map_uncache(c, m);
        }
        snprintf(ev.reason, sizeof(ev.reason), "%.*s", (int)sizeof(ev.reason) - 1, why);
        client_queue_event(c, &ev);
}

/* Registers again the references this connection holds on b's buffer (all its handles at once;
 * round marks them done). */
static int reclaim(gpuipc_t *c, gpuipc_buffer_t *b, uint64_t round)
{
        Mapping *m = b->map;
        Frame f = { .fd = -1 };
        uint32_t refs = 0;
        ProtoMsg req;
        int r;

        list_for_each(pos, &c->attached) {
                gpuipc_buffer_t *x = list_entry(pos, gpuipc_buffer_t, attached_link);
                if (x->id == b->id && !x->revoked) {
                        x->restore_round = round;
                        refs++;
                }
        }
        proto_request_init(&req, PROTO_OP_RECLAIM);
        proto_set_buffer(&req, b->id);
        proto_set_generation(&req, b->generation);
        proto_set_refs(&req, refs);
        proto_set_uid(&req, b->owner_uid);
        proto_set_name(&req, proto_str(b->name));
        proto_set_kind(&req, (ProtoKind)b->kind);
        r = client_request(c, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, &f);
        if (r == GPUIPC_E_DISCONNECTED)
                return r;
        if (r < 0) {
                revoke_handles(c, b, client_errbuf(c));
                return 0;
        }
        /* The broker now counts our references again, and knows we hold the memory (for a view:
         * the segment's) mapped. */
        m->broker_mapped = m->kind != GPUIPC_KIND_CUDA_LEGACY;
        if (!m->in_cache && hmap_insert(&c->maps_by_id, &m->by_id, hash_u64(m->id)) == 0)
                m->in_cache = true;
        frame_free(&f);
        return 0;
}

int buffer_after_reconnect(gpuipc_t *c)
{
        uint64_t round = ++c->restore_round;
        int r;

        /* Nobody at the broker knows our idle mappings any more (a new broker never sent their fds,
         * and an old one forgot them with our connection): drop them without a word. */
        list_for_each(pos, &c->idle)
                list_entry(pos, Mapping, idle_link)->broker_mapped = false;
        gpuipc_cache_trim(c);
        list_for_each(pos, &c->attached) {
                Mapping *m = list_entry(pos, gpuipc_buffer_t, attached_link)->map;
                m->broker_mapped = false;
                map_uncache(c, m); /* until reclaimed: an attach meanwhile must not count on it */
        }
        /* Producers first, so that reclaims of our own consumers find the buffers registered. */
        list_for_each(pos, &c->own)
                list_entry(pos, gpuipc_buffer_t, own_link)->registered = false;
        pool_after_reconnect(c);
        list_for_each(pos, &c->own) {
                gpuipc_buffer_t *b = list_entry(pos, gpuipc_buffer_t, own_link);

                if (b->ring_part || (b->state != PROTO_STATE_LIVE && b->state != PROTO_STATE_RETIRED))
                        continue; /* idle or never published: registered by the next publish */
                r = restore_own(c, b);
                if (r < 0)
                        return r;
        }
        list_for_each(pos, &c->attached) {
                gpuipc_buffer_t *b = list_entry(pos, gpuipc_buffer_t, attached_link);

                if (b->revoked || b->ring_part || b->restore_round == round)
                        continue;
                r = reclaim(c, b, round);
                if (r < 0)
                        return r;
        }
        return 0;
}

int buffer_drop(gpuipc_t *c, gpuipc_buffer_t *b)
{
        return b->own ? gpuipc_buffer_free(c, b) : gpuipc_release(c, b);
}

void buffer_close_all(gpuipc_t *c)
{
        /* The broker drops our references and mapped marks when the socket closes; only local
         * state remains, so nothing is said to it. */
        list_for_each(pos, &c->idle)
                list_entry(pos, Mapping, idle_link)->broker_mapped = false;
        while (!list_empty(&c->attached)) {
                gpuipc_buffer_t *b = list_entry(c->attached.next, gpuipc_buffer_t, attached_link);
                b->map->broker_mapped = false;
                map_unref(c, b->map);
                buffer_destroy(b);
        }
        gpuipc_cache_trim(c);
        /* Views first: they point at their segments. */
        list_for_each_safe(pos, &c->own) {
                gpuipc_buffer_t *b = list_entry(pos, gpuipc_buffer_t, own_link);
                if (b->segment)
                        buffer_free_local(c, b);
        }
        while (!list_empty(&c->own))
                buffer_free_local(c, list_entry(c->own.next, gpuipc_buffer_t, own_link));
}

/* Takes m out of every table and frees its record, leaving its memory mapped. */
static void map_abandon(gpuipc_t *c, Mapping *m)
{
        map_uncache(c, m);
        if (list_linked(&m->idle_link)) {
                list_unlink(&m->idle_link);
                c->n_idle--;
        }
        free(m);
}

void buffer_abandon(gpuipc_buffer_t *b)
{
        /* A view has no fd (its memory is its segment's); a mapping or a CUDA allocation lives on
         * without the fd it was made from. */
        if (b->own && !b->segment)
                b->ka.fd = safe_close(b->ka.fd);
        buffer_destroy(b);
}

void buffer_abandon_all(gpuipc_t *c)
{
        while (!list_empty(&c->attached)) {
                gpuipc_buffer_t *b = list_entry(c->attached.next, gpuipc_buffer_t, attached_link);
                if (--b->map->refs == 0)
                        map_abandon(c, b->map);
                buffer_destroy(b);
        }
        while (!list_empty(&c->idle))
                map_abandon(c, list_entry(c->idle.next, Mapping, idle_link));
        while (!list_empty(&c->own))
                buffer_abandon(list_entry(c->own.next, gpuipc_buffer_t, own_link));
}
