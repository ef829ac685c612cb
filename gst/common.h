/* What gpuipcsink and gpuipcsrc share: connecting to the broker, posting its errors, the enums. */
#pragma once

#include <gst/gst.h>

#include "gpuipc.h"

G_BEGIN_DECLS

/* How long one wait inside the library lasts before an element looks whether it is flushing or
 * stopping: the bound on how late a state change notices a blocked streaming thread. */
#define GPUIPC_GST_SLICE_MS 50

/* The caps both ends take: raw video in system memory, and in CUDA memory where the CUDA variant is
 * built (gst/meson.build defines GPUIPC_GST_CUDA then). */
#if GPUIPC_GST_CUDA
#define GPUIPC_GST_CAPS GST_VIDEO_CAPS_MAKE_WITH_FEATURES("memory:CUDAMemory", GST_VIDEO_FORMATS_ALL) ";" \
        GST_VIDEO_CAPS_MAKE(GST_VIDEO_FORMATS_ALL)
#else
#define GPUIPC_GST_CAPS GST_VIDEO_CAPS_MAKE(GST_VIDEO_FORMATS_ALL)
#endif

/* The ring modes the elements offer (mode=backpressure|latest). */
#define GST_TYPE_GPUIPC_RING_MODE (gst_gpuipc_ring_mode_get_type())
GType gst_gpuipc_ring_mode_get_type(void);

/* Connects to the broker at socket_path (NULL: $GPUIPC_SOCKET, else the default), labelled
 * "PROGRAM:ELEMENT", surviving broker restarts. NULL after posting an error that says why. */
gpuipc_t *gst_gpuipc_connect(GstElement *element, const char *socket_path);

/* Posts an error message from element: text says what failed, followed by why (what the library said:
 * gpuipc_errmsg(), or NULL or "" for the error's own sentence, gpuipc_strerror(err)); the debug part
 * names the error code and the usual fix: hint, or NULL for the library's (gpuipc_strerror(err),
 * which speaks of buffers: a ring's failure brings its own). */
void gst_gpuipc_post_error(GstElement *element, GQuark domain, gint code, const char *why, int err,
                           const char *hint, const char *file, const char *function, int line, const char *fmt,
                           ...) G_GNUC_PRINTF(10, 11);

#define GST_GPUIPC_ERROR(element, domain, code, why, err, ...)                                                   \
        gst_gpuipc_post_error(GST_ELEMENT(element), GST_##domain##_ERROR, GST_##domain##_ERROR_##code, why, err, \
                              NULL, __FILE__, GST_FUNCTION, __LINE__, __VA_ARGS__)
#define GST_GPUIPC_ERROR_HINT(element, domain, code, why, err, hint, ...)                                        \
        gst_gpuipc_post_error(GST_ELEMENT(element), GST_##domain##_ERROR, GST_##domain##_ERROR_##code, why, err, \
                              hint, __FILE__, GST_FUNCTION, __LINE__, __VA_ARGS__)

G_END_DECLS
