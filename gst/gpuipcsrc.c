/* gpuipcsrc: the member end. Joins the ring (waiting for it to appear) from its streaming thread,
 * takes frames one at a time and pushes each as a buffer whose memory is the slot itself; before it
 * takes the next frame it releases this one, copying it out first if downstream still holds it
 * (slot-memory.c). The slot's header (frame-header.h) is checked before anything in it is believed;
 * its caps become the pad's caps before the first buffer of them, and its segment, flushes and end
 * of stream are replayed downstream. A ring that ends without an end of stream (its producer died
 * or closed it, or evicted this member) is an error, or, with reconnect=true, a wait for the next
 * producer of that name (after a pause, growing, while memberships end before their first frame).
 *
 * Every wait is a loop of bounded slices that looks at the unlock flag between them (a flush, a
 * state change, or an end of stream sent to the pipeline, as gst-launch-1.0 -e does on SIGINT): the
 * library's take returns within its timeout whatever the producer's control page says. */
#include "gpuipcsrc.h"

#include <gst/video/video.h>

#include "common.h"
#include "config.h"
#include "frame-meta.h"
#include "slot-memory.h"
#if GPUIPC_GST_CUDA
#include "cuda-frames.h"
#endif

GST_DEBUG_CATEGORY_STATIC(gst_gpuipc_src_debug);
#define GST_CAT_DEFAULT gst_gpuipc_src_debug

/* A join waits this long per try before it looks whether the element is stopping: longer than the
 * take slices (a join is rare, and each try is a round trip to the broker), short enough that a
 * state change while waiting for the producer feels immediate. */
#define JOIN_SLICE_MS 200

/* reconnect=true: a membership that ends before its first frame (a producer that dies at once, or
 * one whose control page ends every membership as hostile) makes the next join wait first, twice as
 * long each time up to this, rather than rejoin and end again in a loop. */
#define REJOIN_PAUSE_MAX_MS 5000
/* The usual fix when a membership ends: the ring's, not the library's text for a revoked buffer
 * (whose "publish broker-held" no ring can do). */
#define RING_ENDED_HINT                                                                                  \
        "the ring ended for this source (its producer closed it, died, or evicted this member): no frame " \
        "comes from it any more; with reconnect=true the source waits for the ring's next producer"

enum {
        PROP_0,
        PROP_RING,
        PROP_SOCKET,
        PROP_TIMEOUT,
        PROP_RECONNECT,
        PROP_IS_LIVE,
        PROP_FRAMES,
        PROP_COPIES,
        PROP_SKIPPED,
};

/* A membership: its own connection and the ring, closed with the last reference (frames lent
 * downstream hold one, so the slots stay mapped while an element reads them). */
typedef struct Member {
        gint refs;
        gpuipc_t *conn;
        gpuipc_ring_t *ring;
        char producer[160]; /* who produces, for messages: "gpuipcsink:NAME, pid N" */
} Member;

struct _GstGpuipcSrc {
        GstPushSrc parent;

        /* Properties, under the object lock; the counters too. */
        char *ring_name;
        char *socket_path;
        gint timeout_ms;
        gboolean reconnect;
        guint64 frames, copies, skipped;

        /* Streaming state: the streaming thread's, and start/stop's. */
        gint flushing;          /* atomic: unlock() was called */
        Member *member;
        gint rejoin_pause_ms;   /* how long the next join waits before it tries (reconnect=true) */
        SlotHold *held;         /* the frame lent downstream, not yet released to the ring */
        guint64 last_frame;     /* number of the last frame taken in this membership */
        gboolean discont;       /* the next buffer follows a gap */
        char *caps_text;        /* the caps of the frames so far */
        GstVideoInfo info;
        gboolean have_segment;
        FrameSegment segment;
        gboolean have_flush_seq;
        guint32 flush_seq;
        FrameHeader hdr;        /* the taken frame's header, copied out of the slot */
#if GPUIPC_GST_CUDA
        CudaFrames *cu;
#endif
};

G_DEFINE_TYPE(GstGpuipcSrc, gst_gpuipc_src, GST_TYPE_PUSH_SRC)
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(gpuipcsrc, "gpuipcsrc", GST_RANK_NONE, GST_TYPE_GPUIPC_SRC,
                                      GST_DEBUG_CATEGORY_INIT(gst_gpuipc_src_debug, "gpuipcsrc", 0,
                                                              "gpuipc ring source"));

static GstStaticPadTemplate src_template =
        GST_STATIC_PAD_TEMPLATE("src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS(GPUIPC_GST_CAPS));

/* ---- memberships ---- */

/* A membership is reference-counted: a frame lent downstream (SlotHold) keeps the ring mapped and
 * the connection open after the element left or stopped, until downstream lets the frame go. */
static Member *member_ref(Member *m)
{
        g_atomic_int_inc(&m->refs);
        return m;
}

static void member_unref(gpointer data)
{
        Member *m = data;

        if (!m || !g_atomic_int_dec_and_test(&m->refs))
                return;
        /* The last reference: nothing else uses the connection any more. */
        gpuipc_ring_close(m->ring);
        gpuipc_close(m->conn);
        g_free(m);
}

/* Who produces ring `name`, for the messages that name it when it ends. */
static void describe_producer(Member *m, const char *name)
{
        /* A page of 32 on the stack: the producer is usually found in the first page, and this is
         * only for messages. */
        gpuipc_peer_info_t peers[32];
        gpuipc_ring_info_t info;
        uint64_t cursor = 0;
        const char *label = "";

        /* Best effort: the description only improves messages, so any failure leaves it empty. The
         * label is the producer's connection label (gpuipcsink's "program:element"), found in peers. */
        if (gpuipc_stat_ring(m->conn, name, NULL, 0, &info) < 0)
                return;
        do {
                int n = gpuipc_list_peers(m->conn, &cursor, peers, G_N_ELEMENTS(peers));

                for (int i = 0; i < n && !*label; i++)
                        if (peers[i].peer == info.owner)
                                label = peers[i].label;
                if (n < 0 || *label)
                        break;
        } while (cursor);
        /* pid 0: the broker cannot see the producer's PID (another namespace); saying so beats "pid 0". */
        if (info.pid)
                g_snprintf(m->producer, sizeof(m->producer), "%s%spid %" G_GUINT64_FORMAT, label, *label ? ", " : "",
                           (guint64)info.pid);
        else
                g_snprintf(m->producer, sizeof(m->producer), "%s%soutside the broker's PID namespace", label,
                           *label ? ", " : "");
}

/* Sleeps ms, in slices: FALSE when the element is flushing or stopping. */
static gboolean pause_unless_flushing(GstGpuipcSrc *self, gint ms)
{
        gint64 until = g_get_monotonic_time() + (gint64)ms * G_TIME_SPAN_MILLISECOND;

        for (;;) {
                gint64 left = until - g_get_monotonic_time();

                if (g_atomic_int_get(&self->flushing))
                        return FALSE;
                if (left <= 0)
                        return TRUE;
                g_usleep(MIN(left, GPUIPC_GST_SLICE_MS * G_TIME_SPAN_MILLISECOND));
        }
}

/* Joins the ring through a new connection, waiting for it to appear (timeout property) in slices,
 * after the rejoin pause if the last membership ended before its first frame. Posts an error on
 * failure. */
static GstFlowReturn join(GstGpuipcSrc *self)
{
        g_autofree char *name = NULL, *socket_path = NULL;
        gint64 deadline;
        gint timeout_ms;
        gpuipc_ring_t *ring = NULL;
        gpuipc_t *c;
        Member *m;

        GST_OBJECT_LOCK(self);
        name = g_strdup(self->ring_name);
        socket_path = g_strdup(self->socket_path);
        timeout_ms = self->timeout_ms;
        GST_OBJECT_UNLOCK(self);
        deadline = g_get_monotonic_time() + (gint64)timeout_ms * G_TIME_SPAN_MILLISECOND;
        if (self->rejoin_pause_ms) {
                GST_DEBUG_OBJECT(self, "the last membership ended before its first frame: joining in %d ms",
                                 self->rejoin_pause_ms);
                /* Part of the timeout: a pause longer than what is left still ends in one try. */
                if (!pause_unless_flushing(self, timeout_ms < 0 ? self->rejoin_pause_ms
                                                                : MIN(self->rejoin_pause_ms, timeout_ms)))
                        return GST_FLOW_FLUSHING;
        }
        /* A connection per membership: a membership that ended (the producer died) leaves nothing
         * behind on the next one, and member_unref can close both together. */
        c = gst_gpuipc_connect(GST_ELEMENT(self), socket_path);
        if (!c)
                return GST_FLOW_ERROR;
        for (;;) {
                int e;

                if (g_atomic_int_get(&self->flushing)) {
                        gpuipc_close(c);
                        return GST_FLOW_FLUSHING;
                }
                /* Short joins, not one long one: flushing (a state change) is looked at between them. */
                e = gpuipc_ring_join(c, name, JOIN_SLICE_MS, &ring);
                if (e == 0)
                        break;
                /* Not found yet is the usual case (members often start before the producer): it
                 * is waited through like a timeout. */
                if (e != GPUIPC_E_TIMEOUT && e != GPUIPC_E_NOT_FOUND) {
                        GST_GPUIPC_ERROR(self, RESOURCE, OPEN_READ, gpuipc_errmsg(c), e, "cannot join ring '%s'",
                                         name);
                        gpuipc_close(c);
                        return GST_FLOW_ERROR;
                }
                if (timeout_ms >= 0 && g_get_monotonic_time() >= deadline) {
                        GST_GPUIPC_ERROR(self, RESOURCE, NOT_FOUND, gpuipc_errmsg(c), e,
                                         "ring '%s' did not let this member in within %d ms", name, timeout_ms);
                        gpuipc_close(c);
                        return GST_FLOW_ERROR;
                }
        }
        /* A new membership has taken no frame yet: its first frame counts as no skip, whatever its
         * number. */
        m = g_new0(Member, 1);
        m->refs = 1;
        m->conn = c;
        m->ring = ring;
        describe_producer(m, name);
        GST_INFO_OBJECT(self, "joined ring '%s' (producer: %s)", name, m->producer);
        self->member = m;
        self->last_frame = 0;
        return GST_FLOW_OK;
}

/* Drops the element's reference: the ring is left once no lent frame holds the membership too. */
static void leave(GstGpuipcSrc *self)
{
        g_clear_pointer(&self->member, member_unref);
}

/* ---- frames ---- */

/* Hands the frame lent downstream back to the ring, copying it out first if downstream still has it. */
static GstFlowReturn let_go_of_held(GstGpuipcSrc *self)
{
        gboolean copied;
        int e;

        if (!self->held)
                return GST_FLOW_OK;
        if (!slot_hold_let_go(self->held, &self->flushing, &copied))
                return GST_FLOW_FLUSHING;
        g_clear_pointer(&self->held, slot_hold_unref);
        if (copied) {
                GST_LOG_OBJECT(self, "downstream still held frame %" G_GUINT64_FORMAT ": copied it", self->last_frame);
                GST_OBJECT_LOCK(self);
                self->copies++;
                GST_OBJECT_UNLOCK(self);
        }
        e = gpuipc_ring_release(self->member->ring);
        if (e < 0)
                /* Evicted while downstream read it: the next take says so and decides. */
                GST_WARNING_OBJECT(self, "frame %" G_GUINT64_FORMAT ": %s", self->last_frame,
                                   gpuipc_errmsg(self->member->conn));
        return GST_FLOW_OK;
}

/* The membership ended without an end of stream: an error, or a wait for the next producer. */
static GstFlowReturn ring_ended(GstGpuipcSrc *self, int err)
{
        const char *why = gpuipc_errmsg(self->member->conn);
        gboolean reconnect;

        GST_OBJECT_LOCK(self);
        reconnect = self->reconnect;
        GST_OBJECT_UNLOCK(self);
        if (!reconnect) {
                GST_GPUIPC_ERROR_HINT(self, RESOURCE, READ, why, err, RING_ENDED_HINT, "ring '%s' ended (producer: %s)",
                                      self->ring_name, self->member->producer);
                return GST_FLOW_ERROR;
        }
        GST_ELEMENT_WARNING(self, RESOURCE, READ,
                            ("ring '%s' ended (producer: %s): %s; waiting for a new producer", self->ring_name,
                             self->member->producer, why),
                            ("reconnect=true"));
        /* last_frame is 0 until this membership's first frame. */
        /* A membership that ended before its first frame backs off (doubling up to a cap), so a
         * producer that dies at once does not make this member spin on joins; one that carried frames
         * is followed at once. */
        if (self->last_frame)
                self->rejoin_pause_ms = 0;
        else
                self->rejoin_pause_ms = self->rejoin_pause_ms ? MIN(2 * self->rejoin_pause_ms, REJOIN_PAUSE_MAX_MS)
                                                              : JOIN_SLICE_MS;
        leave(self);
        /* The next producer's first frame follows a gap: downstream must not take it for the next
         * frame of this stream. */
        self->discont = TRUE;
        return GST_FLOW_OK;
}

/* Takes the next frame into self->hdr (checked) and *ret_slot: GST_FLOW_OK, or GST_FLOW_CUSTOM_SUCCESS
 * when the membership ended and a new one must be joined. */
static GstFlowReturn take(GstGpuipcSrc *self, gpuipc_buffer_t **ret_slot)
{
        gpuipc_buffer_t *slot;
        const char *why = NULL;
        uint64_t n = 0;
        int e;

        /* In slices, so that a flush or a state change is noticed within GPUIPC_GST_SLICE_MS while no
         * frame comes (a live source may wait for its producer indefinitely). */
        do {
                if (g_atomic_int_get(&self->flushing))
                        return GST_FLOW_FLUSHING;
                e = gpuipc_ring_take(self->member->ring, GPUIPC_GST_SLICE_MS, &slot, &n);
        } while (e == GPUIPC_E_TIMEOUT);
        /* Revoked: the membership is over (ring closed, producer gone, evicted); with reconnect the
         * element waits for the next producer instead of failing. */
        if (e == GPUIPC_E_REVOKED) {
                GstFlowReturn fr = ring_ended(self, e);

                return fr == GST_FLOW_OK ? GST_FLOW_CUSTOM_SUCCESS : fr;
        }
        if (e < 0) {
                GST_GPUIPC_ERROR(self, RESOURCE, READ, gpuipc_errmsg(self->member->conn), e,
                                 "cannot take a frame from ring '%s'", self->ring_name);
                return GST_FLOW_ERROR;
        }
        /* The header is copied out before it is checked: the producer may still write the shared
         * slot, and checking one copy and using another would let it change in between. */
        /* A CUDA slot is device memory: its header is read through the library, not from a pointer. */
        if (gpuipc_buffer_kind(slot) == GPUIPC_KIND_MEMFD)
                memcpy(&self->hdr, gpuipc_buffer_ptr(slot), sizeof(self->hdr));
        else
                e = gpuipc_buffer_read(slot, 0, &self->hdr, sizeof(self->hdr));
        if (e == 0 && frame_header_check(&self->hdr, gpuipc_buffer_size(slot), &why) < 0)
                e = -EBADMSG;
        if (e < 0) {
                GST_ELEMENT_ERROR(self, STREAM, DECODE,
                                  ("ring '%s', frame %" G_GUINT64_FORMAT ": %s", self->ring_name, (guint64)n,
                                   why ? why : gpuipc_errmsg(self->member->conn)),
                                  ("producer: %s", self->member->producer));
                /* Released before failing: a member that kept a bad frame would stall a backpressure
                 * ring for every other member until its lease ran out. */
                (void)gpuipc_ring_release(self->member->ring);
                return GST_FLOW_ERROR;
        }
        /* Frame numbers are consecutive per membership: a jump is frames a latest-mode ring skipped
         * for this member, counted and marked DISCONT for downstream. */
        if (self->last_frame && n > self->last_frame + 1) {
                GST_OBJECT_LOCK(self);
                self->skipped += n - self->last_frame - 1;
                GST_OBJECT_UNLOCK(self);
                self->discont = TRUE;
        }
        self->last_frame = n;
        *ret_slot = slot;
        return GST_FLOW_OK;
}

/* The frame's caps, segment and flushes downstream, before its buffer. */
static GstFlowReturn replay_stream_state(GstGpuipcSrc *self)
{
        GstBaseSrc *bs = GST_BASE_SRC(self);
        FrameHeader *h = &self->hdr;
        GstSegment segment;

        /* Caps are compared as text: set_caps (a renegotiation downstream) only when the producer's
         * caps really changed, not for every frame. */
        if (!self->caps_text || strcmp(self->caps_text, h->caps) != 0) {
                GstCaps *caps = gst_caps_from_string(h->caps);
                GstVideoInfo info;
                gboolean ok;

                if (!caps || !gst_caps_is_fixed(caps) || !gst_video_info_from_caps(&info, caps)) {
                        GST_ELEMENT_ERROR(self, STREAM, DECODE,
                                          ("ring '%s': the frame's caps are no raw video: %s", self->ring_name,
                                           h->caps),
                                          (NULL));
                        gst_clear_caps(&caps);
                        return GST_FLOW_ERROR;
                }
                GST_DEBUG_OBJECT(self, "caps %s", h->caps);
                ok = gst_base_src_set_caps(bs, caps);
                gst_caps_unref(caps);
                if (!ok) {
                        GST_ELEMENT_ERROR(self, CORE, NEGOTIATION,
                                          ("downstream refuses the ring's caps %s", h->caps), (NULL));
                        return GST_FLOW_NOT_NEGOTIATED;
                }
                g_free(self->caps_text);
                self->caps_text = g_strdup(h->caps);
                self->info = info;
        }
        if (self->have_flush_seq && h->flush_seq != self->flush_seq) {
                GST_DEBUG_OBJECT(self, "the producer flushed");
                gst_pad_push_event(GST_BASE_SRC_PAD(self), gst_event_new_flush_start());
                gst_pad_push_event(GST_BASE_SRC_PAD(self), gst_event_new_flush_stop(h->flush_reset));
                self->have_segment = FALSE; /* a flush drops the sticky segment */
        }
        self->flush_seq = h->flush_seq;
        self->have_flush_seq = TRUE;
        if ((!self->have_segment || memcmp(&self->segment, &h->segment, sizeof(h->segment)) != 0) &&
            frame_segment_to_gst(&h->segment, &segment)) {
                if (!gst_base_src_new_segment(bs, &segment))
                        GST_WARNING_OBJECT(self, "could not replay the producer's segment");
                self->segment = h->segment;
                self->have_segment = TRUE;
        }
        return GST_FLOW_OK;
}

/* The frame in slot as a buffer: its payload lent (host memory), or copied (CUDA memory). */
static GstFlowReturn frame_buffer(GstGpuipcSrc *self, gpuipc_buffer_t *slot, GstBuffer **ret)
{
        const guint8 *payload = (const guint8 *)gpuipc_buffer_ptr(slot) + FRAME_HEADER_SIZE;
        const char *why;
        GstBuffer *buf;

        if (!frame_meta_layout_ok(&self->hdr, &self->info, &why)) {
                GST_ELEMENT_ERROR(self, STREAM, DECODE, ("ring '%s', frame %" G_GUINT64_FORMAT ": %s",
                                                         self->ring_name, self->last_frame, why),
                                  ("producer: %s", self->member->producer));
                return GST_FLOW_ERROR;
        }
        if (gpuipc_buffer_kind(slot) != GPUIPC_KIND_MEMFD) {
#if GPUIPC_GST_CUDA
                GstFlowReturn fr;

                if (!cuda_frames_ensure(GST_ELEMENT(self), &self->cu, gpuipc_buffer_device_ordinal(slot)))
                        return GST_FLOW_ERROR;
                fr = cuda_frames_from_slot(self->cu, payload, &self->info, &buf);
                (void)gpuipc_ring_release(self->member->ring); /* copied: the slot is free */
                if (fr != GST_FLOW_OK)
                        return fr;
#else
                GST_ELEMENT_ERROR(self, STREAM, WRONG_TYPE,
                                  ("ring '%s' has %s slots: this gpuipcsrc was built without GStreamer's CUDA "
                                   "library",
                                   self->ring_name, gpuipc_kind_name(gpuipc_buffer_kind(slot))),
                                  (NULL));
                return GST_FLOW_ERROR;
#endif
        } else {
                /* The memory holds a membership reference: the slot stays mapped while downstream
                 * reads it, even after this element left the ring. */
                self->held = slot_hold_new(payload, self->hdr.payload, member_ref(self->member), member_unref);
                buf = gst_buffer_new();
                gst_buffer_append_memory(buf, slot_hold_memory(self->held));
        }
        frame_meta_to_buffer(&self->hdr, buf);
        if (self->discont) {
                GST_BUFFER_FLAG_SET(buf, GST_BUFFER_FLAG_DISCONT);
                self->discont = FALSE;
        }
        *ret = buf;
        return GST_FLOW_OK;
}

/* One buffer per frame: the previous frame goes back to the ring first (a member holds one frame at
 * a time, which is what lets the producer reuse slots), then the next is taken, joining (or rejoining,
 * with reconnect) whenever there is no membership. The ring's end of stream ends the stream here. */
static GstFlowReturn src_create(GstPushSrc *ps, GstBuffer **ret)
{
        GstGpuipcSrc *self = GST_GPUIPC_SRC(ps);
        gpuipc_buffer_t *slot;
        GstFlowReturn fr;

        fr = let_go_of_held(self);
        if (fr != GST_FLOW_OK)
                return fr;
        for (;;) {
                if (!self->member && (fr = join(self)) != GST_FLOW_OK)
                        return fr;
                fr = take(self, &slot);
                if (fr == GST_FLOW_OK)
                        break;
                if (fr != GST_FLOW_CUSTOM_SUCCESS)
                        return fr;
        }
        if (self->hdr.type == FRAME_EOS) {
                /* Leaving tells the sink, which lingers for its members before it closes the ring. */
                GST_INFO_OBJECT(self, "end of stream after frame %" G_GUINT64_FORMAT, self->last_frame);
                (void)gpuipc_ring_release(self->member->ring);
                leave(self);
                return GST_FLOW_EOS;
        }
        fr = replay_stream_state(self);
        if (fr == GST_FLOW_OK)
                fr = frame_buffer(self, slot, ret);
        if (fr != GST_FLOW_OK) {
                if (!self->held)
                        (void)gpuipc_ring_release(self->member->ring);
                return fr;
        }
        GST_OBJECT_LOCK(self);
        self->frames++;
        GST_OBJECT_UNLOCK(self);
        return GST_FLOW_OK;
}

/* ---- the element ---- */

/* Caps come with the first frame (replay_stream_state); before it there is nothing to negotiate. */
static gboolean src_negotiate(GstBaseSrc *bs)
{
        GstGpuipcSrc *self = GST_GPUIPC_SRC(bs);
        GstCaps *caps;
        gboolean ok;

        if (!self->caps_text)
                return TRUE;
        caps = gst_caps_from_string(self->caps_text);
        ok = caps && gst_base_src_set_caps(bs, caps);
        gst_clear_caps(&caps);
        return ok;
}

static gboolean src_start(GstBaseSrc *bs)
{
        GstGpuipcSrc *self = GST_GPUIPC_SRC(bs);
        gboolean named;

        GST_OBJECT_LOCK(self);
        named = self->ring_name && *self->ring_name;
        self->frames = self->copies = self->skipped = 0;
        GST_OBJECT_UNLOCK(self);
        /* Checked at start, not at the first frame: a pipeline missing its ring name fails when it
         * is set to PLAYING, with a message, instead of waiting for a ring named "". */
        if (!named) {
                GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("no ring name: set the ring property"), (NULL));
                return FALSE;
        }
        /* A restart is a new stream: the first frame's caps, segment and flush count are replayed
         * as new, whatever the last run saw. */
        g_clear_pointer(&self->caps_text, g_free);
        self->have_segment = FALSE;
        self->have_flush_seq = FALSE;
        self->discont = FALSE;
        self->rejoin_pause_ms = 0;
        return TRUE;
}

/* PAUSED -> READY: gives back what can be given back now and leaves; a frame downstream still maps
 * keeps the membership alive through its SlotHold rather than being pulled from under it. */
static gboolean src_stop(GstBaseSrc *bs)
{
        GstGpuipcSrc *self = GST_GPUIPC_SRC(bs);
        gint stopping = TRUE; /* as the cancel flag: let go without waiting for downstream's maps */
        gboolean copied;

        /* Give the held frame back now if downstream lets it go or leaves it unmapped; otherwise it
         * keeps its membership (and the slot mapped) until downstream lets go of it. */
        if (self->held && slot_hold_let_go(self->held, &stopping, &copied))
                (void)gpuipc_ring_release(self->member->ring);
        g_clear_pointer(&self->held, slot_hold_unref);
        leave(self);
#if GPUIPC_GST_CUDA
        g_clear_pointer(&self->cu, cuda_frames_free);
#endif
        GST_OBJECT_LOCK(self);
        GST_INFO_OBJECT(self, "ring '%s': %" G_GUINT64_FORMAT " frames pushed, %" G_GUINT64_FORMAT
                        " copied out of their slot, %" G_GUINT64_FORMAT " skipped",
                        self->ring_name, self->frames, self->copies, self->skipped);
        GST_OBJECT_UNLOCK(self);
        return TRUE;
}

/* The flag every slice loop (join and its pause, take, let go) looks at: a flush or a state change
 * ends the wait within one slice, even when no producer ever comes. */
static gboolean src_unlock(GstBaseSrc *bs)
{
        g_atomic_int_set(&GST_GPUIPC_SRC(bs)->flushing, TRUE);
        return TRUE;
}

/* The flush is over: takes may block again (flushing is read by the take loop's slices). */
static gboolean src_unlock_stop(GstBaseSrc *bs)
{
        g_atomic_int_set(&GST_GPUIPC_SRC(bs)->flushing, FALSE);
        return TRUE;
}

#if GPUIPC_GST_CUDA
static void src_set_context(GstElement *element, GstContext *context)
{
        GstGpuipcSrc *self = GST_GPUIPC_SRC(element);

        cuda_frames_set_context(element, &self->cu, context, -1);
        GST_ELEMENT_CLASS(gst_gpuipc_src_parent_class)->set_context(element, context);
}

static gboolean src_query(GstBaseSrc *bs, GstQuery *query)
{
        GstGpuipcSrc *self = GST_GPUIPC_SRC(bs);

        if (GST_QUERY_TYPE(query) == GST_QUERY_CONTEXT && self->cu && cuda_frames_context_query(self->cu, query))
                return TRUE;
        return GST_BASE_SRC_CLASS(gst_gpuipc_src_parent_class)->query(bs, query);
}
#endif

/* Set from the application's thread, read by the streaming thread: under the object lock, and
 * mutable in READY only, since a membership is made from them at the first frame. */
static void src_set_property(GObject *object, guint id, const GValue *value, GParamSpec *pspec)
{
        GstGpuipcSrc *self = GST_GPUIPC_SRC(object);

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
        case PROP_TIMEOUT: self->timeout_ms = g_value_get_int(value); break;
        case PROP_RECONNECT: self->reconnect = g_value_get_boolean(value); break;
        case PROP_IS_LIVE:
                /* gst_base_src_set_live takes the object lock itself. */
                GST_OBJECT_UNLOCK(self);
                gst_base_src_set_live(GST_BASE_SRC(self), g_value_get_boolean(value));
                return;
        default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
        }
        GST_OBJECT_UNLOCK(self);
}

/* is-live is asked of basesrc before the object lock is taken: basesrc takes that same lock. The
 * counters are read under it, since the streaming thread bumps them. */
static void src_get_property(GObject *object, guint id, GValue *value, GParamSpec *pspec)
{
        GstGpuipcSrc *self = GST_GPUIPC_SRC(object);

        if (id == PROP_IS_LIVE) {
                g_value_set_boolean(value, gst_base_src_is_live(GST_BASE_SRC(self)));
                return;
        }
        GST_OBJECT_LOCK(self);
        switch (id) {
        case PROP_RING: g_value_set_string(value, self->ring_name); break;
        case PROP_SOCKET: g_value_set_string(value, self->socket_path); break;
        case PROP_TIMEOUT: g_value_set_int(value, self->timeout_ms); break;
        case PROP_RECONNECT: g_value_set_boolean(value, self->reconnect); break;
        case PROP_FRAMES: g_value_set_uint64(value, self->frames); break;
        case PROP_COPIES: g_value_set_uint64(value, self->copies); break;
        case PROP_SKIPPED: g_value_set_uint64(value, self->skipped); break;
        default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
        }
        GST_OBJECT_UNLOCK(self);
}

static void src_finalize(GObject *object)
{
        GstGpuipcSrc *self = GST_GPUIPC_SRC(object);

        g_free(self->ring_name);
        g_free(self->socket_path);
        g_free(self->caps_text);
        G_OBJECT_CLASS(gst_gpuipc_src_parent_class)->finalize(object);
}

/* Time format: frames carry their producer's timestamps, which downstream syncs on. timeout -1:
 * wait for the ring as long as it takes, as a pipeline started before its producer needs. */
static void gst_gpuipc_src_init(GstGpuipcSrc *self)
{
        self->timeout_ms = -1;
        gst_base_src_set_format(GST_BASE_SRC(self), GST_FORMAT_TIME);
}

static void gst_gpuipc_src_class_init(GstGpuipcSrcClass *klass)
{
        GObjectClass *object_class = G_OBJECT_CLASS(klass);
        GstElementClass *element_class = GST_ELEMENT_CLASS(klass);
        GstBaseSrcClass *bs_class = GST_BASE_SRC_CLASS(klass);
        const GParamFlags rw = G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY;
        const GParamFlags ro = G_PARAM_READABLE | G_PARAM_STATIC_STRINGS;

        object_class->set_property = src_set_property;
        object_class->get_property = src_get_property;
        object_class->finalize = src_finalize;

        g_object_class_install_property(object_class, PROP_RING,
                g_param_spec_string("ring", "Ring", "Name of the ring to join (a gpuipcsink's ring property)", NULL,
                                    rw));
        g_object_class_install_property(object_class, PROP_SOCKET,
                g_param_spec_string("socket", "Socket",
                                    "The broker's socket (default: $GPUIPC_SOCKET, else " GPUIPC_DEFAULT_SOCKET ")",
                                    NULL, rw));
        g_object_class_install_property(object_class, PROP_TIMEOUT,
                g_param_spec_int("timeout", "Timeout",
                                 "How long to wait for the ring to appear and let this member in, in ms, at the "
                                 "start and after reconnecting (-1: as long as it takes); then an error",
                                 -1, G_MAXINT, -1, rw));
        g_object_class_install_property(object_class, PROP_RECONNECT,
                g_param_spec_boolean("reconnect", "Reconnect",
                                     "When the ring ends without an end of stream (its producer died or closed it, "
                                     "or evicted this member), post a warning and wait for a new producer of the "
                                     "ring instead of an error (pausing before it joins again while memberships "
                                     "end before their first frame: 0.2 s, doubling up to 5 s)",
                                     FALSE, rw));
        g_object_class_install_property(object_class, PROP_IS_LIVE,
                g_param_spec_boolean("is-live", "Is live",
                                     "Act as a live source (frames come at the producer's pace; no preroll)", FALSE,
                                     rw));
        g_object_class_install_property(object_class, PROP_FRAMES,
                g_param_spec_uint64("frames", "Frames", "Frames pushed so far", 0, G_MAXUINT64, 0, ro));
        g_object_class_install_property(object_class, PROP_COPIES,
                g_param_spec_uint64("copies", "Copies",
                                    "Frames copied out of their slot because downstream still held them when the "
                                    "next frame was due (the others were lent without a copy)",
                                    0, G_MAXUINT64, 0, ro));
        g_object_class_install_property(object_class, PROP_SKIPPED,
                g_param_spec_uint64("skipped", "Skipped",
                                    "Frames this member did not get (latest mode: the producer moved on)", 0,
                                    G_MAXUINT64, 0, ro));

        gst_element_class_add_static_pad_template(element_class, &src_template);
        gst_element_class_set_static_metadata(element_class, "gpuipc ring source", "Source/Video",
                                              "Joins a gpuipc ring and pushes its frames, zero-copy, with the "
                                              "producer's caps and timestamps (see docs/gstreamer.md)",
                                              "gpuipc");
#if GPUIPC_GST_CUDA
        element_class->set_context = src_set_context;
        bs_class->query = src_query;
#endif
        bs_class->negotiate = src_negotiate;
        bs_class->start = src_start;
        bs_class->stop = src_stop;
        bs_class->unlock = src_unlock;
        bs_class->unlock_stop = src_unlock_stop;
        GST_PUSH_SRC_CLASS(klass)->create = src_create;
}
