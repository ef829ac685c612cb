/* What of a GstBuffer and its stream travels in a frame header, and back. */
#pragma once

#include <gst/gst.h>
#include <gst/video/video.h>

#include "frame-header.h"

G_BEGIN_DECLS

/* Timestamps, offsets, flags and the GstVideoMeta (if any) of buf into h. */
void frame_meta_from_buffer(FrameHeader *h, GstBuffer *buf);

/* The other way: h's timestamps, offsets and flags onto buf (its own GstMiniObject flags kept), and
 * h's video meta as a GstVideoMeta. */
void frame_meta_to_buffer(const FrameHeader *h, GstBuffer *buf);

void frame_segment_from_gst(FrameSegment *f, const GstSegment *s);
/* FALSE when f holds no segment of a known format. */
gboolean frame_segment_to_gst(const FrameSegment *f, GstSegment *s);

/* Rows of plane p of a frame of info (subsampled planes have fewer). */
guint frame_plane_rows(const GstVideoInfo *info, guint p);

/* Whether h's payload holds a whole frame of info where h says its planes are (its video meta, or
 * the caps' default layout): a member hands downstream no buffer that would make an element read past
 * the slot. FALSE with *ret_why set otherwise. */
gboolean frame_meta_layout_ok(const FrameHeader *h, const GstVideoInfo *info, const char **ret_why);

G_END_DECLS
