/* The producer's ring behind gpuipcsink: library calls serialized (the element's streaming thread and
 * an upstream thread allocating from its pool may both make them), the slot lent upstream tracked,
 * and every wait cut into slices so that flushing and state changes interrupt it. */
#include "sink-ring.h"

#include "common.h"

GST_DEBUG_CATEGORY_EXTERN(gst_gpuipc_sink_debug);
#define GST_CAT_DEFAULT gst_gpuipc_sink_debug

struct SinkRing {
        gint refs;               /* the element, its slot pool and each memory lent upstream hold one */
        GWeakRef element;        /* where errors are posted; weak, since a lent memory may outlive
                                  * the element */
        char *name;
        gpuipc_kind_t kind;
        size_t payload;

        GMutex call_lock;        /* held across every call into the library on conn or ring */
        gpuipc_t *conn;
        gpuipc_ring_t *ring;
        gpuipc_buffer_t *slot;   /* the acquired slot, until it is published */

        gint flushing;           /* the element's, atomic */

        GMutex lock;             /* guards what follows; never held while taking call_lock */
        GCond cond;
        gboolean lent;           /* the acquired slot's payload is lent upstream */
        guint8 *lent_data;
        guint64 lends;           /* lends so far: the current one's token */
};

/* Posts err (from a call on r's connection) on the element, if it is still there. */
#define RING_ERROR(r, code, err, ...)                                                                 \
        do {                                                                                          \
                GstElement *el_ = g_weak_ref_get(&(r)->element);                                      \
                if (el_) {                                                                            \
                        GST_GPUIPC_ERROR(el_, RESOURCE, code, gpuipc_errmsg((r)->conn), err, __VA_ARGS__);           \
                        gst_object_unref(el_);                                                        \
                }                                                                                     \
        } while (0)

SinkRing *sink_ring_new(GstElement *element, gpuipc_t *c, const SinkRingConfig *cfg)
{
        gpuipc_ring_options_t opts = {
                .struct_size = sizeof(opts),
                .kind = cfg->kind,
                /* Each slot carries its frame's header in front of the payload: a member reads
                 * both from one slot, and a frame needs no second publication. */
                .slot_size = cfg->payload + FRAME_HEADER_SIZE,
                .slots = cfg->slots,
                .max_members = cfg->max_members,
                .device = cfg->device,
                .mode = cfg->mode,
                .lease_ms = cfg->lease_ms,
        };
        gpuipc_ring_t *ring = NULL;
        SinkRing *r;
        int e;

        e = gpuipc_ring_create(c, cfg->name, &opts, &ring);
        if (e < 0) {
                GST_GPUIPC_ERROR(element, RESOURCE, OPEN_WRITE, gpuipc_errmsg(c), e, "cannot create ring '%s'",
                                 cfg->name);
                return NULL;
        }
        r = g_new0(SinkRing, 1);
        r->refs = 1;
        g_weak_ref_init(&r->element, element);
        r->name = g_strdup(cfg->name);
        r->kind = cfg->kind;
        r->payload = cfg->payload;
        g_mutex_init(&r->call_lock);
        g_mutex_init(&r->lock);
        g_cond_init(&r->cond);
        r->conn = c;
        r->ring = ring;
        GST_INFO_OBJECT(element, "created ring '%s': %u %s slots of %zu bytes, %u seats, %s", cfg->name,
                        cfg->slots, gpuipc_kind_name(cfg->kind), cfg->payload, cfg->max_members,
                        gpuipc_ring_mode_name(cfg->mode));
        return r;
}

SinkRing *sink_ring_ref(SinkRing *r)
{
        g_atomic_int_inc(&r->refs);
        return r;
}

/* Shared by the sink and by every slot memory lent upstream (through the pool): the ring, and the
 * connection that owns it, outlive the element's stop until the last lent buffer comes back. */
void sink_ring_unref(SinkRing *r)
{
        if (!r || !g_atomic_int_dec_and_test(&r->refs))
                return;
        /* The last reference: nobody else can call in any more. */
        gpuipc_ring_close(r->ring);
        gpuipc_close(r->conn);
        g_weak_ref_clear(&r->element);
        g_mutex_clear(&r->call_lock);
        g_mutex_clear(&r->lock);
        g_cond_clear(&r->cond);
        g_free(r->name);
        g_free(r);
}

size_t sink_ring_payload(const SinkRing *r)
{
        return r->payload;
}

gpuipc_kind_t sink_ring_kind(const SinkRing *r)
{
        return r->kind;
}

/* The flag is atomic so the slice loops read it without a lock; the broadcast is taken under lock
 * so a waiter between its check and its wait cannot miss it. */
void sink_ring_set_flushing(SinkRing *r, gboolean flushing)
{
        g_atomic_int_set(&r->flushing, flushing);
        g_mutex_lock(&r->lock);
        g_cond_broadcast(&r->cond);
        g_mutex_unlock(&r->lock);
}

/* With call_lock held: the slot the next frame goes into, in slices of waiting until *cancel. */
static GstFlowReturn acquire_locked(SinkRing *r, gint *cancel)
{
        while (!r->slot) {
                int e;

                if (g_atomic_int_get(cancel))
                        return GST_FLOW_FLUSHING;
                /* A backpressure ring may wait for its slowest member indefinitely: short slices
                 * keep a flush or a state change from waiting behind it. */
                e = gpuipc_ring_acquire(r->ring, GPUIPC_GST_SLICE_MS, &r->slot);
                if (e == GPUIPC_E_TIMEOUT)
                        continue;
                if (e < 0) {
                        r->slot = NULL;
                        RING_ERROR(r, WRITE, e, "ring '%s': no slot for the next frame", r->name);
                        return GST_FLOW_ERROR;
                }
        }
        return GST_FLOW_OK;
}

GstFlowReturn sink_ring_lend(SinkRing *r, gint *cancel, guint8 **ret_data, guint64 *ret_token)
{
        GstFlowReturn ret;

        g_mutex_lock(&r->call_lock);
        ret = acquire_locked(r, cancel);
        if (ret == GST_FLOW_OK) {
                /* The token tells this lend's end from a late end of an earlier one (a memory freed
                 * after its frame was published). */
                g_mutex_lock(&r->lock);
                r->lent = TRUE;
                r->lent_data = (guint8 *)gpuipc_buffer_ptr(r->slot) + FRAME_HEADER_SIZE;
                *ret_data = r->lent_data;
                *ret_token = ++r->lends;
                g_mutex_unlock(&r->lock);
        }
        g_mutex_unlock(&r->call_lock);
        return ret;
}

/* Upstream gave the lent slot's memory back. The token is the lend's number, so a late return of an
 * older lend cannot mark the current one returned. */
void sink_ring_lend_end(SinkRing *r, guint64 token)
{
        g_mutex_lock(&r->lock);
        /* A memory that outlived its frame (published, and lent again since) says nothing. */
        if (token == r->lends) {
                r->lent = FALSE;
                r->lent_data = NULL;
                g_cond_broadcast(&r->cond);
        }
        g_mutex_unlock(&r->lock);
}

/* Under the lock: the lend may end on another thread (upstream's) at any moment. */
gboolean sink_ring_is_lent(SinkRing *r, const guint8 *data)
{
        gboolean lent;

        g_mutex_lock(&r->lock);
        lent = r->lent && data == r->lent_data;
        g_mutex_unlock(&r->lock);
        return lent;
}

/* Waits while the acquired slot is lent upstream: a frame copied now would share it. */
static GstFlowReturn wait_not_lent(SinkRing *r, int timeout_ms)
{
        gint64 deadline = g_get_monotonic_time() + (gint64)timeout_ms * G_TIME_SPAN_MILLISECOND;
        GstFlowReturn ret = GST_FLOW_OK;

        g_mutex_lock(&r->lock);
        while (r->lent && !g_atomic_int_get(&r->flushing))
                if (!g_cond_wait_until(&r->cond, &r->lock, deadline))
                        break;
        if (g_atomic_int_get(&r->flushing))
                ret = GST_FLOW_FLUSHING;
        else if (r->lent)
                ret = GST_FLOW_ERROR;
        g_mutex_unlock(&r->lock);
        /* Posted after the lock is dropped: posting may call into the application's bus handler,
         * which must not run under a lock the streaming thread needs. */
        if (ret == GST_FLOW_ERROR) {
                GstElement *el = g_weak_ref_get(&r->element);

                if (el) {
                        GST_ELEMENT_ERROR(el, STREAM, FAILED,
                                          ("ring '%s': upstream holds the buffer it took from gpuipcsink's pool "
                                           "and sent another one",
                                           r->name),
                                          ("the pool lends the one slot being written; set pool=false"));
                        gst_object_unref(el);
                }
        }
        return ret;
}

GstFlowReturn sink_ring_acquire(SinkRing *r, int lent_timeout_ms, gpuipc_buffer_t **ret_slot)
{
        GstFlowReturn ret = wait_not_lent(r, lent_timeout_ms);

        if (ret != GST_FLOW_OK)
                return ret;
        g_mutex_lock(&r->call_lock);
        ret = acquire_locked(r, &r->flushing);
        *ret_slot = r->slot;
        g_mutex_unlock(&r->call_lock);
        return ret;
}

GstFlowReturn sink_ring_publish(SinkRing *r, const FrameHeader *h)
{
        GstFlowReturn ret = GST_FLOW_OK;
        uint64_t frame = 0;
        int e;

        g_mutex_lock(&r->call_lock);
        if (!r->slot) {
                g_mutex_unlock(&r->call_lock);
                return GST_FLOW_ERROR;
        }
        /* A copy for host slots, a CUDA copy for cuda-vmm ones. */
        /* Header before publish: publishing is what lets members read the slot. */
        e = gpuipc_buffer_write(r->slot, 0, h, frame_header_bytes(h));
        if (e == 0)
                e = gpuipc_ring_publish(r->ring, &frame);
        if (e < 0) {
                RING_ERROR(r, WRITE, e, "ring '%s': cannot publish the next frame", r->name);
                ret = GST_FLOW_ERROR;
        } else {
                r->slot = NULL;
                g_mutex_lock(&r->lock);
                r->lent = FALSE;
                r->lent_data = NULL;
                g_cond_broadcast(&r->cond);
                g_mutex_unlock(&r->lock);
        }
        g_mutex_unlock(&r->call_lock);
        GST_LOG("ring '%s': published frame %" G_GUINT64_FORMAT, r->name, frame);
        return ret;
}

/* With call_lock held: seats the producer has given (those joined are seated by this call) and seats
 * taken at all, from the broker's view of the ring. */
static int count_seats(SinkRing *r, unsigned *ret_seated, unsigned *ret_taken)
{
        gpuipc_ring_member_info_t seats[GPUIPC_RING_MAX_MEMBERS];
        gpuipc_ring_info_t info;
        unsigned seated = 0;
        int n, e;

        /* Reading the broker's news first is what seats members that joined since the last call:
         * without it a waiting producer would count seats that never fill. */
        e = gpuipc_process(r->conn);
        if (e < 0)
                return e;
        n = gpuipc_stat_ring(r->conn, r->name, seats, G_N_ELEMENTS(seats), &info);
        if (n < 0)
                return n;
        for (int i = 0; i < n; i++)
                if (seats[i].state == GPUIPC_SEAT_UNCONFIRMED || seats[i].state == GPUIPC_SEAT_SEATED)
                        seated++;
        *ret_seated = seated;
        *ret_taken = info.taken;
        return 0;
}

GstFlowReturn sink_ring_wait_members(SinkRing *r, unsigned n, int timeout_ms)
{
        gint64 deadline = g_get_monotonic_time() + (gint64)timeout_ms * G_TIME_SPAN_MILLISECOND;
        unsigned seated = 0, taken = 0;

        for (;;) {
                int e;

                if (g_atomic_int_get(&r->flushing))
                        return GST_FLOW_FLUSHING;
                g_mutex_lock(&r->call_lock);
                e = count_seats(r, &seated, &taken);
                if (e < 0)
                        RING_ERROR(r, WRITE, e, "ring '%s': cannot count its members", r->name);
                g_mutex_unlock(&r->call_lock);
                if (e < 0)
                        return GST_FLOW_ERROR;
                if (seated >= n)
                        return GST_FLOW_OK;
                if (timeout_ms >= 0 && g_get_monotonic_time() >= deadline) {
                        GstElement *el = g_weak_ref_get(&r->element);

                        if (el) {
                                GST_ELEMENT_ERROR(el, RESOURCE, WRITE,
                                                  ("ring '%s': %u of the %u members it waits for came within %d ms",
                                                   r->name, seated, n, timeout_ms),
                                                  ("wait-members and wait-timeout"));
                                gst_object_unref(el);
                        }
                        return GST_FLOW_ERROR;
                }
                g_usleep(10 * G_TIME_SPAN_MILLISECOND);
        }
}

/* Polls the seats every 10 ms: it runs once, at stop, for at most the linger time, where a poll's
 * cost does not matter and its simplicity does. */
gboolean sink_ring_wait_empty(SinkRing *r, int timeout_ms)
{
        gint64 deadline = g_get_monotonic_time() + (gint64)timeout_ms * G_TIME_SPAN_MILLISECOND;
        unsigned seated = 0, taken = 0;

        for (;;) {
                int e;

                g_mutex_lock(&r->call_lock);
                e = count_seats(r, &seated, &taken);
                g_mutex_unlock(&r->call_lock);
                if (e < 0 || taken == 0)
                        return e == 0;
                if (g_get_monotonic_time() >= deadline)
                        return FALSE;
                g_usleep(10 * G_TIME_SPAN_MILLISECOND);
        }
}
