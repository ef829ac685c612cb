/* gpuipcsink: publishes each buffer into a gpuipc ring, with its caps, timestamps and segment. */
#pragma once

#include <gst/base/gstbasesink.h>

G_BEGIN_DECLS

#define GST_TYPE_GPUIPC_SINK (gst_gpuipc_sink_get_type())
G_DECLARE_FINAL_TYPE(GstGpuipcSink, gst_gpuipc_sink, GST, GPUIPC_SINK, GstBaseSink)

GST_ELEMENT_REGISTER_DECLARE(gpuipcsink);

G_END_DECLS
