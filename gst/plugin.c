/* The gstgpuipc plugin: registers gpuipcsink and gpuipcsrc. */
#include <gst/gst.h>

#include "config.h"
#include "gpuipcsink.h"
#include "gpuipcsrc.h"

#define PACKAGE "gpuipc"

static gboolean plugin_init(GstPlugin *plugin)
{
        gboolean ok = GST_ELEMENT_REGISTER(gpuipcsink, plugin);

        return GST_ELEMENT_REGISTER(gpuipcsrc, plugin) && ok;
}

/* The plugin is Apache-2.0, like the rest of gpuipc: GStreamer's list of licences has no such entry
 * and loads plugins of any other licence under "unknown". */
GST_PLUGIN_DEFINE(GST_VERSION_MAJOR, GST_VERSION_MINOR, gpuipc,
                  "Frames between processes and containers through gpuipc rings", plugin_init, GPUIPC_VERSION,
                  GST_LICENSE_UNKNOWN, "gpuipc", "https://github.com/gpuipc/gpuipc")
