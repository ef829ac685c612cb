/* GstBuffer and GstSegment fields to frame header fields and back, and the layout check a member
 * makes before it lends a slot downstream. */
#include "frame-meta.h"

/* GstBufferFlags start where the GstMiniObject's own flags end. */
#define BUFFER_FLAGS_MASK (~(guint)(GST_MINI_OBJECT_FLAG_LAST - 1))

/* What a member needs to rebuild the buffer as the producer had it: timestamps, offsets, flags and
 * the video layout (strides and plane offsets), which may differ from the caps' default. */
void frame_meta_from_buffer(FrameHeader *h, GstBuffer *buf)
{
        GstVideoMeta *vm = gst_buffer_get_video_meta(buf);

        h->pts = GST_BUFFER_PTS(buf);
        h->dts = GST_BUFFER_DTS(buf);
        h->duration = GST_BUFFER_DURATION(buf);
        h->offset = GST_BUFFER_OFFSET(buf);
        h->offset_end = GST_BUFFER_OFFSET_END(buf);
        /* The buffer's own flags only: the mini object's (LOCKABLE, ...) describe this process's
         * object, not the frame. */
        h->buffer_flags = GST_BUFFER_FLAGS(buf) & BUFFER_FLAGS_MASK;
        memset(&h->video, 0, sizeof(h->video));
        /* Without a (fitting) video meta the frame has the default layout of its caps, which the
         * member assumes when n_planes is 0. */
        if (vm && vm->n_planes <= FRAME_MAX_PLANES) {
                h->video.n_planes = vm->n_planes;
                h->video.flags = vm->flags;
                h->video.format = vm->format;
                h->video.width = vm->width;
                h->video.height = vm->height;
                for (guint i = 0; i < vm->n_planes; i++) {
                        h->video.offset[i] = vm->offset[i];
                        h->video.stride[i] = vm->stride[i];
                }
        }
}

void frame_meta_to_buffer(const FrameHeader *h, GstBuffer *buf)
{
        GST_BUFFER_PTS(buf) = h->pts;
        GST_BUFFER_DTS(buf) = h->dts;
        GST_BUFFER_DURATION(buf) = h->duration;
        GST_BUFFER_OFFSET(buf) = h->offset;
        GST_BUFFER_OFFSET_END(buf) = h->offset_end;
        GST_MINI_OBJECT_FLAGS(buf) = (GST_MINI_OBJECT_FLAGS(buf) & ~BUFFER_FLAGS_MASK) |
                                     (h->buffer_flags & BUFFER_FLAGS_MASK);
        /* The checked header's planes (at most FRAME_MAX_PLANES, frame_header_check) into
         * GStreamer's arrays. */
        if (h->video.n_planes) {
                gsize offset[GST_VIDEO_MAX_PLANES] = { 0 };
                gint stride[GST_VIDEO_MAX_PLANES] = { 0 };

                for (guint i = 0; i < h->video.n_planes; i++) {
                        offset[i] = h->video.offset[i];
                        stride[i] = h->video.stride[i];
                }
                gst_buffer_add_video_meta_full(buf, h->video.flags, h->video.format, h->video.width,
                                               h->video.height, h->video.n_planes, offset, stride);
        }
}

/* Field by field into a struct of fixed-size types: GstSegment's layout is not a wire format
 * (padding, guint64 vs gdouble alignment) and may change between GStreamer releases. */
void frame_segment_from_gst(FrameSegment *f, const GstSegment *s)
{
        *f = (FrameSegment){
                .format = s->format,
                .flags = s->flags,
                .rate = s->rate,
                .applied_rate = s->applied_rate,
                .base = s->base,
                .offset = s->offset,
                .start = s->start,
                .stop = s->stop,
                .time = s->time,
                .position = s->position,
                .duration = s->duration,
        };
}

gboolean frame_segment_to_gst(const FrameSegment *f, GstSegment *s)
{
        /* GStreamer asserts on a rate of 0; what the producer wrote is input like any other. */
        if (f->format != GST_FORMAT_TIME || !(f->rate > 0 || f->rate < 0) ||
            !(f->applied_rate > 0 || f->applied_rate < 0))
                return FALSE;
        gst_segment_init(s, GST_FORMAT_TIME);
        s->flags = f->flags;
        s->rate = f->rate;
        s->applied_rate = f->applied_rate;
        s->base = f->base;
        s->offset = f->offset;
        s->start = f->start;
        s->stop = f->stop;
        s->time = f->time;
        s->position = f->position;
        s->duration = f->duration;
        return TRUE;
}

/* Rows of plane p, subsampling included: what a plane's stride is multiplied by to check that the
 * frame's bytes cover it. */
guint frame_plane_rows(const GstVideoInfo *info, guint p)
{
        gint comp[GST_VIDEO_MAX_COMPONENTS];

        gst_video_format_info_component(info->finfo, p, comp);
        if (comp[0] < 0)
                return 0;
        return GST_VIDEO_FORMAT_INFO_SCALE_HEIGHT(info->finfo, comp[0], GST_VIDEO_INFO_FIELD_HEIGHT(info));
}

gboolean frame_meta_layout_ok(const FrameHeader *h, const GstVideoInfo *info, const char **ret_why)
{
        if (!h->video.n_planes || GST_VIDEO_FORMAT_INFO_IS_TILED(info->finfo)) {
                if (h->payload < GST_VIDEO_INFO_SIZE(info)) {
                        *ret_why = "the frame holds fewer bytes than its caps say a frame has";
                        return FALSE;
                }
                return TRUE;
        }
        if (h->video.n_planes != GST_VIDEO_INFO_N_PLANES(info) ||
            h->video.format != (guint32)GST_VIDEO_INFO_FORMAT(info) ||
            h->video.width != (guint32)GST_VIDEO_INFO_WIDTH(info) ||
            h->video.height != (guint32)GST_VIDEO_INFO_HEIGHT(info)) {
                *ret_why = "the frame's video meta does not describe a frame of its caps";
                return FALSE;
        }
        for (guint p = 0; p < h->video.n_planes; p++) {
                guint64 end = h->video.offset[p] + (guint64)h->video.stride[p] * frame_plane_rows(info, p);

                /* frame_header_check bounded the offset by the payload and the stride by 2^31. */
                if (end > h->payload) {
                        *ret_why = "a plane of the frame's video meta ends past its data";
                        return FALSE;
                }
        }
        return TRUE;
}
