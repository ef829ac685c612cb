/* The header gpuipcsink writes at the start of every slot: what a frame is besides its bytes. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* A slot holds one frame: this header, then the frame's bytes from FRAME_HEADER_SIZE on (a page
 * boundary, so the data is as aligned as any element expects). Every frame carries its caps,
 * timestamps, segment and layout in full: a member that skips frames (latest mode) or joins in the
 * middle knows all it needs from the one frame it takes, and a ring needs no companion buffer nor a
 * second ordering to keep in step with its frames.
 *
 * The producer and its members run on one host, so fields are in the host's byte order. */
#define FRAME_HEADER_SIZE 4096u
#define FRAME_MAGIC 0x46535047u /* "GPSF" read as bytes on a little-endian host */
#define FRAME_VERSION 1u
#define FRAME_MAX_PLANES 4u

enum {
        FRAME_DATA = 1, /* a buffer: payload bytes follow */
        FRAME_EOS = 2,  /* the end of the stream: no payload */
};

/* A GstSegment (TIME format for video), field for field. */
typedef struct FrameSegment {
        uint32_t format; /* GstFormat; 0 (undefined): the sink saw no segment */
        uint32_t flags;  /* GstSegmentFlags */
        double rate, applied_rate;
        uint64_t base, offset, start, stop, time, position, duration;
} FrameSegment;

/* The buffer's GstVideoMeta: planes that do not sit where the caps' default layout puts them. */
typedef struct FrameVideoMeta {
        uint32_t n_planes; /* 0: no meta, the default layout of the caps */
        uint32_t flags;    /* GstVideoFrameFlags */
        uint32_t format;   /* GstVideoFormat */
        uint32_t width, height;
        uint32_t reserved;
        uint64_t offset[FRAME_MAX_PLANES];
        int32_t stride[FRAME_MAX_PLANES];
} FrameVideoMeta;

typedef struct FrameHeader {
        uint32_t magic;
        uint16_t version;
        uint16_t type;       /* FRAME_DATA or FRAME_EOS */
        uint64_t payload;    /* bytes of frame data after the header */
        uint64_t pts, dts, duration, offset, offset_end; /* GST_CLOCK_TIME_NONE etc. as GStreamer has them */
        uint32_t buffer_flags; /* GstBufferFlags, without the GstMiniObject bits */
        uint32_t flush_seq;    /* flush-stops the sink has received: a change tells members to flush */
        uint32_t flush_reset;  /* the reset-time of the last of them */
        uint32_t caps_len;     /* bytes of text in caps, without its NUL */
        FrameSegment segment;
        FrameVideoMeta video;
        char caps[FRAME_HEADER_SIZE - 256]; /* the caps as gst_caps_to_string() writes them, NUL-terminated */
} FrameHeader;

#define FRAME_CAPS_MAX (sizeof(((FrameHeader *)0)->caps) - 1)

_Static_assert(offsetof(FrameHeader, caps) <= 256, "the fixed part of a frame header outgrew its 256 bytes");
_Static_assert(sizeof(FrameHeader) <= FRAME_HEADER_SIZE, "a frame header must fit before the payload");

/* The bytes of h a writer copies into a slot: the fixed part and the caps with their NUL. */
size_t frame_header_bytes(const FrameHeader *h);

/* Checks h, a private copy of a slot's first FRAME_HEADER_SIZE bytes (the producer may scribble on
 * the slot meanwhile: only the copy is checked, then used), for a slot of slot_size bytes, and
 * terminates its caps text. 0, or -EBADMSG with *ret_why (may be NULL) saying what is wrong: a
 * member trusts nothing the producer wrote before this said yes. The plane extents need the video
 * format's geometry and are the element's to check (frame-meta.c). */
int frame_header_check(FrameHeader *h, uint64_t slot_size, const char **ret_why);
