/* A producer pipeline that flushes mid-stream, which gst-launch-1.0 cannot make happen: runs the
 * pipeline given as its first argument, and once the element named sink has been handed the number
 * of buffers given as the second, seeks back to the start with a flush, once. Prints what
 * gst-launch-1.0 -v prints (property notifications, so the tap's last messages), then exits 0 at the
 * end of the stream, 1 on an error.
 *
 *     flush-producer 'videotestsrc ! ... ! identity name=tap silent=false ! gpuipcsink name=sink ...' 20
 *
 * Counted at the sink, not the tap: a gpuipcsink holds its first buffer until a member joined, so
 * buffers reaching it means frames published, while the tap upstream of a queue may pass the whole
 * stream before a slow consumer joins (and the flush would then precede every published frame). The
 * seek is sent into the tap, upstream from there, so one flush starts at the source and reaches every
 * branch of a tee once; a seek of the pipeline goes to each of its sinks and may flush twice. */
#include <gst/gst.h>
#include <stdlib.h>

typedef struct Run {
        GMainLoop *loop;
        GstElement *pipeline, *tap;
        gint buffers, flush_after;
        gint seeked;
        int status;
} Run;

static gboolean seek_to_start(gpointer data)
{
        Run *r = data;
        GstEvent *seek = gst_event_new_seek(1.0, GST_FORMAT_TIME, GST_SEEK_FLAG_FLUSH, GST_SEEK_TYPE_SET, 0,
                                            GST_SEEK_TYPE_NONE, GST_CLOCK_TIME_NONE);

        if (!gst_element_send_event(r->tap, seek)) {
                g_printerr("flush-producer: the flushing seek failed\n");
                r->status = 1;
                g_main_loop_quit(r->loop);
        }
        return G_SOURCE_REMOVE;
}

static GstPadProbeReturn count(GstPad *pad, GstPadProbeInfo *info, gpointer data)
{
        Run *r = data;

        /* The seek is the application's, from its own thread: not from a streaming thread. */
        if (g_atomic_int_add(&r->buffers, 1) + 1 == r->flush_after && !g_atomic_int_exchange(&r->seeked, 1))
                g_idle_add(seek_to_start, r);
        return GST_PAD_PROBE_OK;
}

static gboolean on_message(GstBus *bus, GstMessage *m, gpointer data)
{
        Run *r = data;

        if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
                GError *err = NULL;

                gst_message_parse_error(m, &err, NULL);
                g_printerr("ERROR: from %s: %s\n", GST_OBJECT_NAME(m->src), err->message);
                g_clear_error(&err);
                r->status = 1;
                g_main_loop_quit(r->loop);
        } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS) {
                g_main_loop_quit(r->loop);
        }
        return TRUE;
}

int main(int argc, char **argv)
{
        Run r = { 0 };
        GError *err = NULL;
        GstElement *sink;
        GstPad *pad;
        GstBus *bus;

        gst_init(&argc, &argv);
        if (argc != 3 || (r.flush_after = atoi(argv[2])) < 1) {
                g_printerr("usage: flush-producer PIPELINE BUFFERS\n");
                return 2;
        }
        r.pipeline = gst_parse_launch(argv[1], &err);
        if (!r.pipeline) {
                g_printerr("flush-producer: %s\n", err->message);
                return 2;
        }
        r.tap = gst_bin_get_by_name(GST_BIN(r.pipeline), "tap");
        sink = gst_bin_get_by_name(GST_BIN(r.pipeline), "sink");
        if (!r.tap || !sink) {
                g_printerr("flush-producer: the pipeline needs an element named tap and one named sink\n");
                return 2;
        }
        pad = gst_element_get_static_pad(sink, "sink");
        gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, count, &r, NULL);
        gst_object_unref(pad);
        gst_object_unref(sink);
        g_signal_connect(r.pipeline, "deep-notify", G_CALLBACK(gst_object_default_deep_notify), NULL);
        r.loop = g_main_loop_new(NULL, FALSE);
        bus = gst_element_get_bus(r.pipeline);
        gst_bus_add_watch(bus, on_message, &r);
        gst_element_set_state(r.pipeline, GST_STATE_PLAYING);
        g_main_loop_run(r.loop);
        gst_element_set_state(r.pipeline, GST_STATE_NULL);
        gst_bus_remove_watch(bus);
        gst_object_unref(bus);
        gst_object_unref(r.tap);
        gst_object_unref(r.pipeline);
        g_main_loop_unref(r.loop);
        return r.status;
}
