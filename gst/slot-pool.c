/* The pool gpuipcsink proposes in the allocation query. A ring has one slot being written at a time,
 * so the pool has one buffer: acquiring it acquires the ring's next slot (waiting while backpressure
 * holds it) and wraps its payload; upstream writes the frame in place and pushes the buffer, and the
 * sink publishes the slot as it is. The memory is lent for one frame: when the buffer comes back to
 * the pool it drops the memory, and the next acquire wraps the next slot. */
#include "slot-pool.h"

#include "frame-header.h"

struct _GstGpuipcSlotPool {
        GstBufferPool parent;
        SinkRing *ring;
        guint size;
        gint flushing; /* atomic */
};

G_DEFINE_TYPE(GstGpuipcSlotPool, gst_gpuipc_slot_pool, GST_TYPE_BUFFER_POOL)

/* No options, video meta included: a slot holds a frame in the caps' default layout, which is what
 * a member expects when the header carries no planes. */
static const gchar **slot_pool_get_options(GstBufferPool *pool)
{
        static const gchar *options[] = { NULL };

        return options;
}

/* One buffer, of at most a slot's payload: anything else is changed, and FALSE says so (upstream
 * then reads the config back and decides whether it can live with it). */
static gboolean slot_pool_set_config(GstBufferPool *pool, GstStructure *config)
{
        GstGpuipcSlotPool *self = GST_GPUIPC_SLOT_POOL(pool);
        guint size, min, max;
        GstCaps *caps;
        gboolean ok = TRUE;

        if (!gst_buffer_pool_config_get_params(config, &caps, &size, &min, &max))
                return FALSE;
        if (size > sink_ring_payload(self->ring)) {
                size = sink_ring_payload(self->ring);
                ok = FALSE;
        }
        if (min > 1 || max != 1) {
                min = MIN(min, 1);
                max = 1;
                ok = FALSE;
        }
        gst_buffer_pool_config_set_params(config, caps, size, min, max);
        self->size = size;
        return GST_BUFFER_POOL_CLASS(gst_gpuipc_slot_pool_parent_class)->set_config(pool, config) && ok;
}

/* The pool's buffer holds no memory while it is in the pool. */
static GstFlowReturn slot_pool_alloc_buffer(GstBufferPool *pool, GstBuffer **ret, GstBufferPoolAcquireParams *params)
{
        *ret = gst_buffer_new();
        return GST_FLOW_OK;
}

typedef struct Lend {
        SinkRing *ring;
        guint64 token;
} Lend;

/* The wrapped memory's destroy notify: runs on whichever thread drops the last reference to the
 * buffer's memory (upstream's, or the sink's), hence the ring's own locking. */
static void lent_memory_gone(gpointer data)
{
        Lend *lend = data;

        sink_ring_lend_end(lend->ring, lend->token);
        sink_ring_unref(lend->ring);
        g_free(lend);
}

static GstFlowReturn slot_pool_acquire_buffer(GstBufferPool *pool, GstBuffer **ret, GstBufferPoolAcquireParams *params)
{
        GstGpuipcSlotPool *self = GST_GPUIPC_SLOT_POOL(pool);
        GstFlowReturn fr;
        GstBuffer *buf = NULL;
        guint8 *data;
        Lend *lend;

        /* Blocks while the one buffer is out (unless params say not to wait). */
        fr = GST_BUFFER_POOL_CLASS(gst_gpuipc_slot_pool_parent_class)->acquire_buffer(pool, &buf, params);
        if (fr != GST_FLOW_OK)
                return fr;
        lend = g_new(Lend, 1);
        fr = sink_ring_lend(self->ring, &self->flushing, &data, &lend->token);
        if (fr != GST_FLOW_OK) {
                g_free(lend);
                GST_BUFFER_POOL_CLASS(gst_gpuipc_slot_pool_parent_class)->release_buffer(pool, buf);
                return fr;
        }
        /* The memory holds a ring reference: a buffer upstream keeps past the element's stop still
         * points into a mapped slot. */
        lend->ring = sink_ring_ref(self->ring);
        gst_buffer_append_memory(buf, gst_memory_new_wrapped(0, data, sink_ring_payload(self->ring), 0, self->size,
                                                             lend, lent_memory_gone));
        *ret = buf;
        return GST_FLOW_OK;
}

/* Drops the lent memory: its slot is published by now, or stays acquired for the next frame. The
 * buffer, left without memory, is then discarded by the pool and a new one made for the next
 * acquire. */
static void slot_pool_release_buffer(GstBufferPool *pool, GstBuffer *buf)
{
        gst_buffer_remove_all_memory(buf);
        GST_BUFFER_POOL_CLASS(gst_gpuipc_slot_pool_parent_class)->release_buffer(pool, buf);
}

/* A flush must interrupt an acquire waiting for a slot (a backpressure ring's slowest member):
 * sink_ring_lend's slices look at this flag. */
static void slot_pool_flush_start(GstBufferPool *pool)
{
        g_atomic_int_set(&GST_GPUIPC_SLOT_POOL(pool)->flushing, TRUE);
}

static void slot_pool_flush_stop(GstBufferPool *pool)
{
        g_atomic_int_set(&GST_GPUIPC_SLOT_POOL(pool)->flushing, FALSE);
}

/* The pool holds a ring reference for its lent slot: dropped only when the pool itself goes. */
static void slot_pool_finalize(GObject *object)
{
        sink_ring_unref(GST_GPUIPC_SLOT_POOL(object)->ring);
        G_OBJECT_CLASS(gst_gpuipc_slot_pool_parent_class)->finalize(object);
}

static void gst_gpuipc_slot_pool_class_init(GstGpuipcSlotPoolClass *klass)
{
        GstBufferPoolClass *pool_class = GST_BUFFER_POOL_CLASS(klass);

        G_OBJECT_CLASS(klass)->finalize = slot_pool_finalize;
        pool_class->get_options = slot_pool_get_options;
        pool_class->set_config = slot_pool_set_config;
        pool_class->alloc_buffer = slot_pool_alloc_buffer;
        pool_class->acquire_buffer = slot_pool_acquire_buffer;
        pool_class->release_buffer = slot_pool_release_buffer;
        pool_class->flush_start = slot_pool_flush_start;
        pool_class->flush_stop = slot_pool_flush_stop;
}

static void gst_gpuipc_slot_pool_init(GstGpuipcSlotPool *self)
{
}

GstBufferPool *gst_gpuipc_slot_pool_new(SinkRing *ring)
{
        GstGpuipcSlotPool *self = g_object_new(GST_TYPE_GPUIPC_SLOT_POOL, NULL);

        gst_object_ref_sink(self);
        self->ring = sink_ring_ref(ring);
        return GST_BUFFER_POOL(self);
}
