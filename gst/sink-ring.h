/* The ring a gpuipcsink produces into, shared by the element and the buffer pool it offers upstream. */
#pragma once

#include <gst/gst.h>

#include "frame-header.h"
#include "gpuipc.h"

G_BEGIN_DECLS

typedef struct SinkRing SinkRing;

typedef struct SinkRingConfig {
        const char *name;
        gpuipc_ring_mode_t mode;
        gpuipc_kind_t kind;
        int device;             /* cuda-vmm slots: the CUDA device */
        unsigned slots, max_members, lease_ms;
        size_t payload;         /* room for a frame's data in each slot (its header comes on top) */
} SinkRingConfig;

/* Creates the ring on connection c, which the ring takes over on success (it is closed with the ring's
 * last reference); on failure c stays the caller's and the error is posted on element. Errors of
 * later calls are posted on element too, as long as it exists (the ring keeps a weak reference:
 * a slot lent upstream may outlive the element). */
SinkRing *sink_ring_new(GstElement *element, gpuipc_t *c, const SinkRingConfig *cfg);
SinkRing *sink_ring_ref(SinkRing *r);
void sink_ring_unref(SinkRing *r);

size_t sink_ring_payload(const SinkRing *r);
gpuipc_kind_t sink_ring_kind(const SinkRing *r);

/* While the element is flushing, its waits end at once with GST_FLOW_FLUSHING. */
void sink_ring_set_flushing(SinkRing *r, gboolean flushing);

/* The buffer pool's side: lends upstream the payload of the slot the next frame goes into
 * (*ret_data), waiting while backpressure holds it, until *cancel (atomic: the pool's flushing) is
 * set; lend_end(token) says the memory of that lend is gone. Until a publish or lend_end, nobody
 * else gets the slot. */
GstFlowReturn sink_ring_lend(SinkRing *r, gint *cancel, guint8 **ret_data, guint64 *ret_token);
void sink_ring_lend_end(SinkRing *r, guint64 token);
/* Whether data is the payload of the slot lent upstream and not yet published. */
gboolean sink_ring_is_lent(SinkRing *r, const guint8 *data);

/* The element's side: the slot the next frame goes into, for a frame it copies. Waits while
 * backpressure holds the slot, and (at most lent_timeout_ms) while the slot is lent upstream. */
GstFlowReturn sink_ring_acquire(SinkRing *r, int lent_timeout_ms, gpuipc_buffer_t **ret_slot);

/* Writes h at the start of the acquired (or lent) slot and publishes it as the next frame. */
GstFlowReturn sink_ring_publish(SinkRing *r, const FrameHeader *h);

/* Waits until n members hold a seat the producer has given them (frames published from then on are
 * theirs), at most timeout_ms (-1: as long as it takes). */
GstFlowReturn sink_ring_wait_members(SinkRing *r, unsigned n, int timeout_ms);

/* Waits until no member holds a seat any more (they left after the end of the stream), at most
 * timeout_ms; TRUE when none is left. */
gboolean sink_ring_wait_empty(SinkRing *r, int timeout_ms);

G_END_DECLS
