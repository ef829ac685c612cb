/* The frame header's size and the checks a member applies before believing one (pure; fuzzed). */
#include <errno.h>
#include <string.h>

#include "frame-header.h"

/* Only the used part of the caps array is written with a frame: the header is written into every
 * slot for every frame, and most caps are a few hundred bytes of a much larger array. */
size_t frame_header_bytes(const FrameHeader *h)
{
        size_t len = h->caps_len <= FRAME_CAPS_MAX ? h->caps_len : FRAME_CAPS_MAX;

        return offsetof(FrameHeader, caps) + len + 1;
}

/* Every refusal of a header is -EBADMSG with its reason: a member treats a bad header as a broken
 * producer and names why, rather than reading a frame it cannot trust. */
static int bad(const char **ret_why, const char *why)
{
        if (ret_why)
                *ret_why = why;
        return -EBADMSG;
}

/* Caps text is printable: no control characters (UTF-8 in string fields passes). */
static int caps_text_ok(const char *s, size_t len)
{
        for (size_t i = 0; i < len; i++)
                if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
                        return 0;
        return 1;
}

/* h is the member's private copy (gpuipcsrc copies it out of the slot first), so checking it and
 * then using it cannot be raced by a producer writing the slot. Every count and offset is bounded
 * here before anything is sized or indexed from it; the caps are NUL-terminated here, not
 * trusted to be. */
int frame_header_check(FrameHeader *h, uint64_t slot_size, const char **ret_why)
{
        if (slot_size < FRAME_HEADER_SIZE)
                return bad(ret_why, "the slot is smaller than a frame header");
        if (h->magic != FRAME_MAGIC)
                return bad(ret_why, "the slot holds no frame header (was the ring made by gpuipcsink?)");
        if (h->version != FRAME_VERSION)
                return bad(ret_why, "the frame header is of another version of gpuipcsink");
        if (h->type != FRAME_DATA && h->type != FRAME_EOS)
                return bad(ret_why, "the frame header has an unknown type");
        /* Subtracted, not added: payload + FRAME_HEADER_SIZE could wrap for a hostile payload. */
        if (h->payload > slot_size - FRAME_HEADER_SIZE)
                return bad(ret_why, "the frame header announces more data than the slot holds");
        if (h->type == FRAME_EOS && h->payload)
                return bad(ret_why, "an end-of-stream frame header announces data");
        if (h->caps_len > FRAME_CAPS_MAX)
                return bad(ret_why, "the frame header's caps are longer than it can hold");
        if (!caps_text_ok(h->caps, h->caps_len))
                return bad(ret_why, "the frame header's caps are not text");
        h->caps[h->caps_len] = '\0';
        if (h->type == FRAME_DATA && !h->caps_len)
                return bad(ret_why, "the frame header has no caps");
        if (h->video.n_planes > FRAME_MAX_PLANES)
                return bad(ret_why, "the frame header's video meta has too many planes");
        for (uint32_t i = 0; i < h->video.n_planes; i++) {
                if (h->video.offset[i] > h->payload)
                        return bad(ret_why, "a plane of the frame header's video meta starts past the data");
                if (h->video.stride[i] <= 0)
                        return bad(ret_why, "a plane of the frame header's video meta has no positive stride");
        }
        return 0;
}
