/* gpuipcsink: the producer end. Creates a ring when the first caps arrive (slots sized for their
 * frames unless slot-size says more), and publishes every buffer into its next slot: written in
 * place when upstream allocated it from the pool this element proposes, copied otherwise. The slot's
 * header (frame-header.h) carries the buffer's caps, timestamps, flags and video meta, the stream's
 * segment and its flushes; the end of the stream is a frame of its own. */
#include "gpuipcsink.h"

#include <gst/video/video.h>

#include "common.h"
#include "config.h"
#include "frame-meta.h"
#include "sink-ring.h"
#include "slot-pool.h"
#if GPUIPC_GST_CUDA
#include "cuda-frames.h"
#endif

GST_DEBUG_CATEGORY(gst_gpuipc_sink_debug);
#define GST_CAT_DEFAULT gst_gpuipc_sink_debug

/* How long a frame that must be copied waits for the slot upstream still holds from the pool: an
 * upstream that keeps the pool's buffer and sends another is a pipeline bug, and two seconds is
 * long past any real frame time, short enough to say so before anyone gives up on the stream. */
#define LENT_TIMEOUT_MS 2000

enum {
        PROP_0,
        PROP_RING,
        PROP_SOCKET,
        PROP_MODE,
        PROP_SLOTS,
        PROP_MAX_MEMBERS,
        PROP_SLOT_SIZE,
        PROP_LEASE_MS,
        PROP_WAIT_MEMBERS,
        PROP_WAIT_TIMEOUT,
        PROP_LINGER,
        PROP_POOL,
        PROP_DEVICE,
        PROP_FRAMES,
        PROP_COPIES,
};

struct _GstGpuipcSink {
        GstBaseSink parent;

        /* Properties, under the object lock. */
        char *ring_name;
        char *socket_path;
        gpuipc_ring_mode_t mode;
        guint slots, max_members, lease_ms, wait_members, linger_ms;
        gint wait_timeout_ms;
        guint64 slot_size;
        gboolean pool_enabled;
        gint device;

        /* Streaming state: the streaming thread's, and start/stop's. */
        gpuipc_t *conn;       /* from start until the ring takes it over */
        SinkRing *ring;
        GstBufferPool *pool;
        gboolean cuda;        /* the caps are video/x-raw(memory:CUDAMemory) */
        GstVideoInfo info;
        FrameHeader hdr;      /* caps, segment and flushes so far; each frame fills in the rest */
        gboolean members_came; /* wait-members is behind us */
        gboolean eos_published;
        guint64 frames, copies; /* published so far, and of them copied; under the object lock */
#if GPUIPC_GST_CUDA
        CudaFrames *cu;
#endif
};

G_DEFINE_TYPE(GstGpuipcSink, gst_gpuipc_sink, GST_TYPE_BASE_SINK)
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(gpuipcsink, "gpuipcsink", GST_RANK_NONE, GST_TYPE_GPUIPC_SINK,
                                      GST_DEBUG_CATEGORY_INIT(gst_gpuipc_sink_debug, "gpuipcsink", 0,
                                                              "gpuipc ring sink"));

static GstStaticPadTemplate sink_template =
        GST_STATIC_PAD_TEMPLATE("sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS(GPUIPC_GST_CAPS));

static void gst_gpuipc_sink_init(GstGpuipcSink *self)
{
        self->mode = GPUIPC_RING_BACKPRESSURE;
        self->slots = 4;
        self->max_members = 4;
        self->wait_timeout_ms = -1;
        self->linger_ms = 2000;
        self->pool_enabled = TRUE;
        self->device = -1;
        /* A kept last sample would hold the pool's one buffer until the next frame, which upstream can
         * only write once it has that buffer back. */
        gst_base_sink_set_last_sample_enabled(GST_BASE_SINK(self), FALSE);
}

/* Properties are set from the application's thread and read by the streaming thread: every access
 * holds the object lock, and the streaming side copies what it needs before using it. They are
 * mutable in READY only (GST_PARAM_MUTABLE_READY): the ring's shape is fixed once it exists. */
static void sink_set_property(GObject *object, guint id, const GValue *value, GParamSpec *pspec)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(object);

        GST_OBJECT_LOCK(self);
        switch (id) {
        case PROP_RING:
                g_free(self->ring_name);
                self->ring_name = g_value_dup_string(value);
                break;
        case PROP_SOCKET:
                g_free(self->socket_path);
                self->socket_path = g_value_dup_string(value);
                break;
        case PROP_MODE: self->mode = g_value_get_enum(value); break;
        case PROP_SLOTS: self->slots = g_value_get_uint(value); break;
        case PROP_MAX_MEMBERS: self->max_members = g_value_get_uint(value); break;
        case PROP_SLOT_SIZE: self->slot_size = g_value_get_uint64(value); break;
        case PROP_LEASE_MS: self->lease_ms = g_value_get_uint(value); break;
        case PROP_WAIT_MEMBERS: self->wait_members = g_value_get_uint(value); break;
        case PROP_WAIT_TIMEOUT: self->wait_timeout_ms = g_value_get_int(value); break;
        case PROP_LINGER: self->linger_ms = g_value_get_uint(value); break;
        case PROP_POOL: self->pool_enabled = g_value_get_boolean(value); break;
        case PROP_DEVICE: self->device = g_value_get_int(value); break;
        default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
        }
        GST_OBJECT_UNLOCK(self);
}

static void sink_get_property(GObject *object, guint id, GValue *value, GParamSpec *pspec)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(object);

        GST_OBJECT_LOCK(self);
        switch (id) {
        case PROP_RING: g_value_set_string(value, self->ring_name); break;
        case PROP_SOCKET: g_value_set_string(value, self->socket_path); break;
        case PROP_MODE: g_value_set_enum(value, self->mode); break;
        case PROP_SLOTS: g_value_set_uint(value, self->slots); break;
        case PROP_MAX_MEMBERS: g_value_set_uint(value, self->max_members); break;
        case PROP_SLOT_SIZE: g_value_set_uint64(value, self->slot_size); break;
        case PROP_LEASE_MS: g_value_set_uint(value, self->lease_ms); break;
        case PROP_WAIT_MEMBERS: g_value_set_uint(value, self->wait_members); break;
        case PROP_WAIT_TIMEOUT: g_value_set_int(value, self->wait_timeout_ms); break;
        case PROP_LINGER: g_value_set_uint(value, self->linger_ms); break;
        case PROP_POOL: g_value_set_boolean(value, self->pool_enabled); break;
        case PROP_DEVICE: g_value_set_int(value, self->device); break;
        case PROP_FRAMES: g_value_set_uint64(value, self->frames); break;
        case PROP_COPIES: g_value_set_uint64(value, self->copies); break;
        default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
        }
        GST_OBJECT_UNLOCK(self);
}

static void sink_finalize(GObject *object)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(object);

        g_free(self->ring_name);
        g_free(self->socket_path);
        G_OBJECT_CLASS(gst_gpuipc_sink_parent_class)->finalize(object);
}

/* READY -> PAUSED: connects to the broker, but makes no ring yet: its slot size comes from the caps,
 * which only the stream brings (sink_set_caps). A missing ring name fails here, before anything. */
static gboolean sink_start(GstBaseSink *bs)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(bs);
        g_autofree char *socket_path = NULL;
        gboolean named;

        GST_OBJECT_LOCK(self);
        named = self->ring_name && *self->ring_name;
        socket_path = g_strdup(self->socket_path);
        GST_OBJECT_UNLOCK(self);
        if (!named) {
                GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("no ring name: set the ring property"), (NULL));
                return FALSE;
        }
        memset(&self->hdr, 0, offsetof(FrameHeader, caps));
        self->hdr.magic = FRAME_MAGIC;
        self->hdr.version = FRAME_VERSION;
        self->members_came = FALSE;
        self->eos_published = FALSE;
        self->conn = gst_gpuipc_connect(GST_ELEMENT(self), socket_path);
        return self->conn != NULL;
}

/* PAUSED -> READY: lingers for members still reading the end of the stream, then lets the ring go;
 * what upstream still holds of the pool keeps the ring alive until it comes back. */
static gboolean sink_stop(GstBaseSink *bs)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(bs);
        guint linger_ms;

        GST_OBJECT_LOCK(self);
        linger_ms = self->linger_ms;
        GST_OBJECT_UNLOCK(self);
        /* Members read the end of the stream and leave; closing the ring before they did would tell
         * them that it ended without one. */
        if (self->ring && self->eos_published && !sink_ring_wait_empty(self->ring, linger_ms))
                GST_WARNING_OBJECT(self, "members were still in the ring %u ms after the end of the stream",
                                   linger_ms);
        gst_clear_object(&self->pool);
        /* A slot lent upstream keeps the ring (and its connection) until it comes back. The pool
         * goes first: it holds a ring reference too. */
        g_clear_pointer(&self->ring, sink_ring_unref);
        g_clear_pointer(&self->conn, gpuipc_close);
#if GPUIPC_GST_CUDA
        g_clear_pointer(&self->cu, cuda_frames_free);
#endif
        GST_OBJECT_LOCK(self);
        GST_INFO_OBJECT(self, "ring '%s': %" G_GUINT64_FORMAT " frames published, %" G_GUINT64_FORMAT
                        " copied into their slot", self->ring_name, self->frames, self->copies);
        GST_OBJECT_UNLOCK(self);
        return TRUE;
}

/* Only the first structure's features: fixed caps (what set_caps gets) have exactly one. */
static gboolean caps_are_cuda(GstCaps *caps)
{
        GstCapsFeatures *f = gst_caps_get_features(caps, 0);

        return f && gst_caps_features_contains(f, "memory:CUDAMemory");
}

/* The ring, made to fit frames of info (unless it exists: then the frames must fit it). */
static gboolean ensure_ring(GstGpuipcSink *self, const GstVideoInfo *info, gboolean cuda)
{
        SinkRingConfig cfg = { .kind = cuda ? GPUIPC_KIND_CUDA_VMM : GPUIPC_KIND_MEMFD };
        gsize need = GST_VIDEO_INFO_SIZE(info);
        g_autofree char *name = NULL;
        guint64 slot_size;

        /* A ring exists for the life of the element's run: members are seated in it, so new caps
         * must fit it rather than replace it (which would end the stream for every member). */
        if (self->ring) {
                if (sink_ring_kind(self->ring) != cfg.kind) {
                        GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                                          ("ring '%s' has %s slots, the new caps want %s memory", self->ring_name,
                                           gpuipc_kind_name(sink_ring_kind(self->ring)), cuda ? "CUDA" : "system"),
                                          (NULL));
                        return FALSE;
                }
                if (need > sink_ring_payload(self->ring)) {
                        GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                                          ("ring '%s': frames of the new caps take %zu bytes, its slots hold %zu",
                                           self->ring_name, need, sink_ring_payload(self->ring)),
                                          ("set slot-size to the largest frame the stream will carry"));
                        return FALSE;
                }
                return TRUE;
        }
        /* Properties copied under the object lock, then used without it: creating the ring talks to
         * the broker, which must not happen with the lock held against the application. */
        GST_OBJECT_LOCK(self);
        name = g_strdup(self->ring_name);
        cfg.mode = self->mode;
        cfg.slots = self->slots;
        cfg.max_members = self->max_members;
        cfg.lease_ms = self->lease_ms;
        cfg.device = self->device;
        slot_size = self->slot_size;
        GST_OBJECT_UNLOCK(self);
        cfg.name = name;
        if (slot_size && slot_size < need) {
                GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                                  ("slot-size %" G_GUINT64_FORMAT " is smaller than a frame of the caps (%zu bytes)",
                                   slot_size, need),
                                  (NULL));
                return FALSE;
        }
        cfg.payload = slot_size ? slot_size : need;
        if (cfg.mode == GPUIPC_RING_LATEST && cfg.slots < cfg.max_members + 2) {
                GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                                  ("mode=latest needs slots >= max-members + 2 (%u slots, %u members)", cfg.slots,
                                   cfg.max_members),
                                  ("a member may hold one slot, and the sink needs one free to write"));
                return FALSE;
        }
#if GPUIPC_GST_CUDA
        if (cuda) {
                if (!cuda_frames_ensure(GST_ELEMENT(self), &self->cu, cfg.device))
                        return FALSE;
                cfg.device = cuda_frames_device(self->cu);
        }
#endif
        self->ring = sink_ring_new(GST_ELEMENT(self), self->conn, &cfg);
        if (!self->ring)
                return FALSE;
        self->conn = NULL; /* the ring's now */
        return TRUE;
}

/* Caps decide the ring's kind (CUDA or host memory) and its slot size; they are checked against
 * the frame header's room and an existing ring before anything changes, so refused caps leave the
 * stream as it was. */
static gboolean sink_set_caps(GstBaseSink *bs, GstCaps *caps)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(bs);
        g_autofree char *text = gst_caps_to_string(caps);
        gboolean cuda = caps_are_cuda(caps);
        GstVideoInfo info;
        size_t len = strlen(text);

        if (!gst_video_info_from_caps(&info, caps)) {
                GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("caps %s describe no raw video", text), (NULL));
                return FALSE;
        }
        /* The caps travel in every frame's header, which has a fixed size: caps that do not fit are
         * refused here, once, rather than cut in every frame. */
        if (len > FRAME_CAPS_MAX) {
                GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                                  ("caps of %zu bytes do not fit a frame header (at most %zu)", len,
                                   (size_t)FRAME_CAPS_MAX),
                                  ("%s", text));
                return FALSE;
        }
        if (!ensure_ring(self, &info, cuda))
                return FALSE;
        GST_DEBUG_OBJECT(self, "caps %s", text);
        self->cuda = cuda;
        self->info = info;
        memcpy(self->hdr.caps, text, len + 1);
        self->hdr.caps_len = (uint32_t)len;
        return TRUE;
}

/* Offers upstream a pool whose buffers are the ring's slots, so a producer writes each frame straight
 * into shared memory and render publishes it without a copy. Declining (returning TRUE without a
 * pool) is always safe: render then copies. */
static gboolean sink_propose_allocation(GstBaseSink *bs, GstQuery *query)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(bs);
        GstStructure *config;
        GstVideoInfo info;
        gboolean need_pool, enabled;
        GstCaps *caps;

        gst_query_parse_allocation(query, &caps, &need_pool);
        GST_OBJECT_LOCK(self);
        enabled = self->pool_enabled;
        GST_OBJECT_UNLOCK(self);
#if GPUIPC_GST_CUDA
        if (caps && caps_are_cuda(caps))
                return self->cu ? cuda_frames_propose_allocation(self->cu, query) : TRUE;
#endif
        /* Only for frames that fit the ring's slots, and only for host memory. */
        if (!enabled || !self->ring || sink_ring_kind(self->ring) != GPUIPC_KIND_MEMFD || !caps ||
            !gst_video_info_from_caps(&info, caps) || GST_VIDEO_INFO_SIZE(&info) > sink_ring_payload(self->ring))
                return TRUE;
        if (!self->pool)
                self->pool = gst_gpuipc_slot_pool_new(self->ring);
        if (gst_buffer_pool_is_active(self->pool)) {
                /* Upstream asks again (new caps): a pool in use cannot be configured anew. */
                gst_object_unref(self->pool);
                self->pool = gst_gpuipc_slot_pool_new(self->ring);
        }
        /* Exactly one buffer: it is the slot being written, and the ring has one such slot at a time
         * (acquired, written, published). */
        config = gst_buffer_pool_get_config(self->pool);
        gst_buffer_pool_config_set_params(config, caps, GST_VIDEO_INFO_SIZE(&info), 1, 1);
        if (!gst_buffer_pool_set_config(self->pool, config))
                return TRUE;
        gst_query_add_allocation_pool(query, self->pool, GST_VIDEO_INFO_SIZE(&info), 1, 1);
        return TRUE;
}

/* wait-members: holds the first frame until that many members sit in the ring (or wait-timeout
 * passes), so a pipeline started together with its readers loses no frame to them. Once only. */
static GstFlowReturn wait_for_members(GstGpuipcSink *self)
{
        guint n;
        gint timeout_ms;
        GstFlowReturn ret;

        if (self->members_came)
                return GST_FLOW_OK;
        GST_OBJECT_LOCK(self);
        n = self->wait_members;
        timeout_ms = self->wait_timeout_ms;
        GST_OBJECT_UNLOCK(self);
        if (n) {
                GST_INFO_OBJECT(self, "waiting for %u members", n);
                ret = sink_ring_wait_members(self->ring, n, timeout_ms);
                if (ret != GST_FLOW_OK)
                        return ret;
        }
        self->members_came = TRUE;
        return GST_FLOW_OK;
}

/* The buffer's data into the acquired slot: a copy (host memory), or a CUDA copy. */
static GstFlowReturn copy_into_slot(GstGpuipcSink *self, GstBuffer *buf, gpuipc_buffer_t *slot, gsize size)
{
#if GPUIPC_GST_CUDA
        if (self->cuda)
                return cuda_frames_to_slot(self->cu, buf, &self->info,
                                           (guint8 *)gpuipc_buffer_ptr(slot) + FRAME_HEADER_SIZE);
#endif
        gst_buffer_extract(buf, 0, (guint8 *)gpuipc_buffer_ptr(slot) + FRAME_HEADER_SIZE, size);
        return GST_FLOW_OK;
}

/* Whether buf is the pool's buffer wrapping the slot the next frame goes into. */
static gboolean is_lent_slot(GstGpuipcSink *self, GstBuffer *buf)
{
        GstMapInfo map;
        gboolean lent;

        /* Compared by address: a buffer that merely came from some pool, or was copied from ours,
         * points elsewhere and is copied into the slot like any other. */
        if (gst_buffer_n_memory(buf) != 1 || !gst_memory_map(gst_buffer_peek_memory(buf, 0), &map, GST_MAP_READ))
                return FALSE;
        lent = sink_ring_is_lent(self->ring, map.data);
        gst_memory_unmap(gst_buffer_peek_memory(buf, 0), &map);
        return lent;
}

/* One frame: into a slot (already there if upstream wrote into the lent slot, else copied), its
 * header filled from the buffer's timestamps and metadata, then published to the ring. A frame that
 * does not fit the slots is an error, never cut: a member would read a broken frame. */
static GstFlowReturn sink_render(GstBaseSink *bs, GstBuffer *buf)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(bs);
        gsize size = gst_buffer_get_size(buf), payload;
        gpuipc_buffer_t *slot;
        gboolean copy;
        GstFlowReturn ret;

        if (!self->ring) {
                GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("a buffer came before caps"), (NULL));
                return GST_FLOW_NOT_NEGOTIATED;
        }
        /* A CUDA frame lands in the caps' default layout, whatever upstream's pitch: a GstCudaMemory's
         * rows are padded (320 RGBA pixels, 1280 bytes, take 1536), so its size says nothing. */
        payload = self->cuda ? GST_VIDEO_INFO_SIZE(&self->info) : size;
        if (payload > sink_ring_payload(self->ring)) {
                GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                                  ("ring '%s': a buffer of %zu bytes does not fit its slots of %zu", self->ring_name,
                                   payload, sink_ring_payload(self->ring)),
                                  ("set slot-size to the largest frame the stream will carry"));
                return GST_FLOW_ERROR;
        }
        /* Before the first frame, not at start: a member must be seated to see the stream from its
         * first frame, and caps (hence the ring) exist only once the stream began. */
        ret = wait_for_members(self);
        if (ret != GST_FLOW_OK)
                return ret;
        /* CUDA buffers always copy: the slot pool lends host memory only. */
        copy = self->cuda || !is_lent_slot(self, buf);
        if (copy) {
                ret = sink_ring_acquire(self->ring, LENT_TIMEOUT_MS, &slot);
                if (ret == GST_FLOW_OK)
                        ret = copy_into_slot(self, buf, slot, size);
                if (ret != GST_FLOW_OK)
                        return ret;
        }
        self->hdr.type = FRAME_DATA;
        self->hdr.payload = payload;
        frame_meta_from_buffer(&self->hdr, buf);
        if (self->cuda)
                memset(&self->hdr.video, 0, sizeof(self->hdr.video)); /* the slot has the default layout */
        ret = sink_ring_publish(self->ring, &self->hdr);
        /* Counters under the object lock: the frames and copies properties read them from any
         * thread. */
        if (ret == GST_FLOW_OK) {
                GST_OBJECT_LOCK(self);
                self->frames++;
                self->copies += copy;
                GST_OBJECT_UNLOCK(self);
        }
        return ret;
}

/* The end of the stream, published as a frame of its own: members see it in order, after the last
 * frame, and leave; stop then lingers for them (linger property) before closing the ring. */
static GstFlowReturn publish_eos(GstGpuipcSink *self)
{
        gpuipc_buffer_t *slot;
        GstFlowReturn ret;

        if (!self->ring)
                return GST_FLOW_OK; /* nobody can have joined a ring that never was */
        ret = sink_ring_acquire(self->ring, LENT_TIMEOUT_MS, &slot);
        if (ret != GST_FLOW_OK)
                return ret;
        /* The end of the stream is a frame in a slot like the others, so a member sees it in order,
         * after every frame before it; its caps and segment stay those of the stream. */
        self->hdr.type = FRAME_EOS;
        self->hdr.payload = 0;
        self->hdr.pts = self->hdr.dts = self->hdr.duration = GST_CLOCK_TIME_NONE;
        self->hdr.offset = self->hdr.offset_end = GST_BUFFER_OFFSET_NONE;
        self->hdr.buffer_flags = 0;
        memset(&self->hdr.video, 0, sizeof(self->hdr.video));
        ret = sink_ring_publish(self->ring, &self->hdr);
        self->eos_published = ret == GST_FLOW_OK;
        return ret;
}

/* No GStreamer event crosses the ring: what members need of one (segment, flush, end of stream)
 * travels in the next frame's header or as a frame of its own. */
static gboolean sink_event(GstBaseSink *bs, GstEvent *event)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(bs);

        switch (GST_EVENT_TYPE(event)) {
        case GST_EVENT_SEGMENT: {
                const GstSegment *segment;

                gst_event_parse_segment(event, &segment);
                frame_segment_from_gst(&self->hdr.segment, segment);
                break;
        }
        case GST_EVENT_FLUSH_STOP: {
                gboolean reset;

                /* Carried in the next frame's header: members compare flush_seq with the last one
                 * they saw and flush downstream themselves, since no event crosses the ring. */
                gst_event_parse_flush_stop(event, &reset);
                self->hdr.flush_seq++;
                self->hdr.flush_reset = reset;
                break;
        }
        case GST_EVENT_EOS:
                /* Members end their stream when they take it; a failure was posted already. */
                (void)publish_eos(self);
                break;
        default:
                break;
        }
        return GST_BASE_SINK_CLASS(gst_gpuipc_sink_parent_class)->event(bs, event);
}

/* basesink's unlock: every wait of the ring is a loop of short slices that looks at this flag, so
 * a state change or a flush never waits for a slow member. */
static gboolean sink_unlock(GstBaseSink *bs)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(bs);

        if (self->ring)
                sink_ring_set_flushing(self->ring, TRUE);
        return TRUE;
}

/* The flush is over: the ring's waits may block again. */
static gboolean sink_unlock_stop(GstBaseSink *bs)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(bs);

        if (self->ring)
                sink_ring_set_flushing(self->ring, FALSE);
        return TRUE;
}

#if GPUIPC_GST_CUDA
static void sink_set_context(GstElement *element, GstContext *context)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(element);

        cuda_frames_set_context(element, &self->cu, context, self->device);
        GST_ELEMENT_CLASS(gst_gpuipc_sink_parent_class)->set_context(element, context);
}

/* Neighbours asking for a CUDA context get ours: one context for the pipeline keeps upstream's
 * frames and the ring's slots on one device, and the copies between them on the GPU. */
static gboolean sink_query(GstBaseSink *bs, GstQuery *query)
{
        GstGpuipcSink *self = GST_GPUIPC_SINK(bs);

        if (GST_QUERY_TYPE(query) == GST_QUERY_CONTEXT && self->cu && cuda_frames_context_query(self->cu, query))
                return TRUE;
        return GST_BASE_SINK_CLASS(gst_gpuipc_sink_parent_class)->query(bs, query);
}
#endif

static void gst_gpuipc_sink_class_init(GstGpuipcSinkClass *klass)
{
        GObjectClass *object_class = G_OBJECT_CLASS(klass);
        GstElementClass *element_class = GST_ELEMENT_CLASS(klass);
        GstBaseSinkClass *bs_class = GST_BASE_SINK_CLASS(klass);
        const GParamFlags rw = G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY;

        object_class->set_property = sink_set_property;
        object_class->get_property = sink_get_property;
        object_class->finalize = sink_finalize;

        g_object_class_install_property(object_class, PROP_RING,
                g_param_spec_string("ring", "Ring", "Name of the ring to create (members join it by this name)",
                                    NULL, rw));
        g_object_class_install_property(object_class, PROP_SOCKET,
                g_param_spec_string("socket", "Socket",
                                    "The broker's socket (default: $GPUIPC_SOCKET, else " GPUIPC_DEFAULT_SOCKET ")",
                                    NULL, rw));
        g_object_class_install_property(object_class, PROP_MODE,
                g_param_spec_enum("mode", "Mode",
                                  "backpressure: every member gets every frame and the sink waits for the slowest "
                                  "(evicting one that holds it up past lease-ms); latest: the sink never waits and "
                                  "slow members skip frames",
                                  GST_TYPE_GPUIPC_RING_MODE, GPUIPC_RING_BACKPRESSURE, rw));
        g_object_class_install_property(object_class, PROP_SLOTS,
                g_param_spec_uint("slots", "Slots",
                                  "Frames the ring holds (latest mode: at least max-members + 2)", 1,
                                  GPUIPC_RING_MAX_SLOTS, 4, rw));
        g_object_class_install_property(object_class, PROP_MAX_MEMBERS,
                g_param_spec_uint("max-members", "Max members", "Member seats: how many gpuipcsrc may join", 1,
                                  GPUIPC_RING_MAX_MEMBERS, 4, rw));
        g_object_class_install_property(object_class, PROP_SLOT_SIZE,
                g_param_spec_uint64("slot-size", "Slot size",
                                    "Bytes of frame data a slot holds (0: a frame of the first caps); caps changes "
                                    "to larger frames need it set",
                                    0, G_MAXUINT64 - 4096, 0, rw));
        g_object_class_install_property(object_class, PROP_LEASE_MS,
                g_param_spec_uint("lease-ms", "Lease",
                                  "Backpressure: evict a member that holds the sink up this long, in ms (0: the "
                                  "library's default, 2000)",
                                  0, G_MAXINT, 0, rw));
        g_object_class_install_property(object_class, PROP_WAIT_MEMBERS,
                g_param_spec_uint("wait-members", "Wait for members",
                                  "Publish the first frame only once this many members have joined (0: do not "
                                  "wait; frames nobody has joined for are dropped)",
                                  0, GPUIPC_RING_MAX_MEMBERS, 0, rw));
        g_object_class_install_property(object_class, PROP_WAIT_TIMEOUT,
                g_param_spec_int("wait-timeout", "Wait timeout",
                                 "How long the first frame waits for wait-members, in ms (-1: as long as it takes); "
                                 "then an error",
                                 -1, G_MAXINT, -1, rw));
        g_object_class_install_property(object_class, PROP_LINGER,
                g_param_spec_uint("linger", "Linger",
                                  "After the end of the stream, how long stopping waits for members to take it and "
                                  "leave, in ms, before the ring is closed",
                                  0, G_MAXINT, 2000, rw));
        g_object_class_install_property(object_class, PROP_POOL,
                g_param_spec_boolean("pool", "Pool",
                                     "Offer upstream a buffer pool whose buffer is the ring's next slot, so that "
                                     "frames are written in place (system memory); otherwise every frame is copied",
                                     TRUE, rw));
        g_object_class_install_property(object_class, PROP_DEVICE,
                g_param_spec_int("device", "Device",
                                 "CUDA memory: the device of the ring's slots (-1: the CUDA context's device, "
                                 "else 0)",
                                 -1, G_MAXINT, -1, rw));
        g_object_class_install_property(object_class, PROP_FRAMES,
                g_param_spec_uint64("frames", "Frames", "Frames published so far", 0, G_MAXUINT64, 0,
                                    G_PARAM_READABLE | G_PARAM_STATIC_STRINGS));
        g_object_class_install_property(object_class, PROP_COPIES,
                g_param_spec_uint64("copies", "Copies",
                                    "Frames copied into their slot (the others were written there in place, "
                                    "through the pool)",
                                    0, G_MAXUINT64, 0, G_PARAM_READABLE | G_PARAM_STATIC_STRINGS));

        gst_element_class_add_static_pad_template(element_class, &sink_template);
        gst_element_class_set_static_metadata(element_class, "gpuipc ring sink", "Sink/Video",
                                              "Publishes buffers into a gpuipc ring for other processes and "
                                              "containers (see docs/gstreamer.md)",
                                              "gpuipc");
#if GPUIPC_GST_CUDA
        element_class->set_context = sink_set_context;
        bs_class->query = sink_query;
#endif
        bs_class->start = sink_start;
        bs_class->stop = sink_stop;
        bs_class->set_caps = sink_set_caps;
        bs_class->propose_allocation = sink_propose_allocation;
        bs_class->render = sink_render;
        bs_class->event = sink_event;
        bs_class->unlock = sink_unlock;
        bs_class->unlock_stop = sink_unlock_stop;
        gst_type_mark_as_plugin_api(GST_TYPE_GPUIPC_RING_MODE, 0);
}
