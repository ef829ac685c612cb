/* Connecting to the broker and posting the library's errors the GStreamer way. */
#include <stdarg.h>

#include "common.h"

GType gst_gpuipc_ring_mode_get_type(void)
{
        static GType type;
        static const GEnumValue values[] = {
                { GPUIPC_RING_BACKPRESSURE, "Every member gets every frame; the sink waits for the slowest",
                  "backpressure" },
                { GPUIPC_RING_LATEST, "The sink never waits; members take the newest frame and skip the rest",
                  "latest" },
                { 0, NULL, NULL },
        };

        if (g_once_init_enter(&type))
                g_once_init_leave(&type, g_enum_register_static("GstGpuipcRingMode", values));
        return type;
}

gpuipc_t *gst_gpuipc_connect(GstElement *element, const char *socket_path)
{
        g_autofree char *name = gst_object_get_name(GST_OBJECT(element));
        /* What `gpuipcctl peers` shows, and members name their producer by. */
        /* Cut to 30 + 1 + 33 = 64 bytes, the broker's label limit (GPUIPC_MAX_LABEL), so a long
         * program or element name shortens the label instead of failing the connect. */
        g_autofree char *label = g_strdup_printf("%.30s:%.33s", g_get_prgname() ? g_get_prgname() : "gst", name);
        gpuipc_options_t opts = {
                .struct_size = sizeof(opts),
                .socket_path = socket_path && *socket_path ? socket_path : NULL,
                .label = label,
                .connect_timeout_ms = 0, /* reconnecting through a broker restart is the library's default */
        };
        gpuipc_t *c = NULL;
        int e;

        e = gpuipc_connect(&c, &opts);
        if (e < 0) {
                GST_GPUIPC_ERROR(element, RESOURCE, OPEN_READ_WRITE, gpuipc_errmsg(NULL), e,
                                 "cannot connect to the gpuipc broker");
                return NULL;
        }
        return c;
}

/* Every library failure reaches the application the same way: what failed, why (the library's
 * message, else its error's text), and a hint for the fix in the debug part, where gst-launch and
 * applications show it. */
void gst_gpuipc_post_error(GstElement *element, GQuark domain, gint code, const char *why, int err,
                           const char *hint, const char *file, const char *function, int line, const char *fmt,
                           ...)
{
        char *what, *text, *debug;
        va_list ap;

        va_start(ap, fmt);
        what = g_strdup_vprintf(fmt, ap);
        va_end(ap);
        if (!why || !*why)
                why = gpuipc_strerror(err);
        text = g_strdup_printf("%s: %s", what, why);
        debug = g_strdup_printf("gpuipc error %s (%d): %s", gpuipc_err_name(err), err,
                                hint ? hint : gpuipc_strerror(err));
        /* Takes text and debug. */
        gst_element_message_full(element, GST_MESSAGE_ERROR, domain, code, text, debug, file, function, line);
        g_free(what);
}
