/* Fuzz target: frame_header_check (gst/frame-header.c), what gpuipcsrc believes of the header a
 * producer wrote at the start of a slot. The input is a slot size (8 bytes) and the slot's first
 * bytes, as a broken or hostile producer may leave them. A header that passes must be one a member can
 * use without reading past the slot: its payload fits the slot after the header, its caps text ends
 * at caps_len with no control character before, its planes start within the payload and have
 * positive strides; checking the same bytes again gives the same answer; and what a writer copies
 * of an accepted header (frame_header_bytes) fits before the payload and reads back the same. */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "frame-header.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static FrameHeader h, again, copy;
        uint64_t slot_size = 0;
        const char *why = NULL;
        int r;

        if (size < 8)
                return 0;
        memcpy(&slot_size, data, 8);
        data += 8;
        size -= 8;
        memset(&h, 0, sizeof(h));
        memcpy(&h, data, size < sizeof(h) ? size : sizeof(h));
        again = h;
        r = frame_header_check(&h, slot_size, &why);
        CHECK(r == 0 || r == -EBADMSG);
        CHECK(r == 0 || (why && *why));
        CHECK(frame_header_check(&again, slot_size, NULL) == r);
        if (r < 0)
                return 0;
        CHECK(slot_size >= FRAME_HEADER_SIZE);
        CHECK(h.payload <= slot_size - FRAME_HEADER_SIZE);
        CHECK(h.type == FRAME_DATA || (h.type == FRAME_EOS && h.payload == 0));
        CHECK(h.caps_len <= FRAME_CAPS_MAX && strlen(h.caps) == h.caps_len);
        for (uint32_t i = 0; i < h.caps_len; i++)
                CHECK((unsigned char)h.caps[i] >= 0x20 && h.caps[i] != 0x7f);
        CHECK(h.video.n_planes <= FRAME_MAX_PLANES);
        for (uint32_t i = 0; i < h.video.n_planes; i++)
                CHECK(h.video.offset[i] <= h.payload && h.video.stride[i] > 0);
        CHECK(frame_header_bytes(&h) <= FRAME_HEADER_SIZE);
        memset(&copy, 0xa5, sizeof(copy));
        memcpy(&copy, &h, frame_header_bytes(&h));
        CHECK(frame_header_check(&copy, slot_size, NULL) == 0);
        CHECK(memcmp(&copy, &h, frame_header_bytes(&h)) == 0);
        return 0;
}
