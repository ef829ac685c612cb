/* gpuipcsrc: joins a gpuipc ring and pushes its frames downstream, with their caps and timestamps. */
#pragma once

#include <gst/base/gstpushsrc.h>

G_BEGIN_DECLS

#define GST_TYPE_GPUIPC_SRC (gst_gpuipc_src_get_type())
G_DECLARE_FINAL_TYPE(GstGpuipcSrc, gst_gpuipc_src, GST, GPUIPC_SRC, GstPushSrc)

GST_ELEMENT_REGISTER_DECLARE(gpuipcsrc);

G_END_DECLS
