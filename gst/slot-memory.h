/* The memory gpuipcsrc pushes downstream: a slot a member holds, lent without a copy. */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

typedef struct SlotHold SlotHold;

/* A hold on size bytes at data, the payload of the slot a member took. owner, with owner_unref, is
 * what keeps the slot mapped: the hold drops it once the frame no longer needs the slot (downstream
 * let go of it, or the hold copied the frame out). */
SlotHold *slot_hold_new(const guint8 *data, gsize size, gpointer owner, GDestroyNotify owner_unref);
void slot_hold_unref(SlotHold *h);

/* The memory downstream gets (read-only; shares and copies work as usual); the last reference to it
 * and its shares hands the frame back. Call once per hold. */
GstMemory *slot_hold_memory(SlotHold *h);

/* Frees the slot for the member to release: at once if downstream let go of the frame; otherwise the
 * frame is copied into memory of the hold's own, which downstream reads from then on (waiting, until
 * *cancel is set, while an element has the memory mapped). FALSE when cancelled; *ret_copied says
 * whether it copied. */
gboolean slot_hold_let_go(SlotHold *h, gint *cancel, gboolean *ret_copied);

G_END_DECLS
