/* The buffer pool gpuipcsink offers upstream: its one buffer is the slot the next frame goes into. */
#pragma once

#include <gst/gst.h>

#include "sink-ring.h"

G_BEGIN_DECLS

#define GST_TYPE_GPUIPC_SLOT_POOL (gst_gpuipc_slot_pool_get_type())
G_DECLARE_FINAL_TYPE(GstGpuipcSlotPool, gst_gpuipc_slot_pool, GST, GPUIPC_SLOT_POOL, GstBufferPool)

/* A pool whose one buffer wraps the payload of ring's next slot (what upstream writes there is
 * published without a copy). It holds a reference to ring, and so does the memory it lends. */
GstBufferPool *gst_gpuipc_slot_pool_new(SinkRing *ring);

G_END_DECLS
