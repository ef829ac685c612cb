/* gst-bench: raw video through gpuipcsink/gpuipcsrc between two processes, against the same pipeline
 * in one process with a queue (the baseline, measured in the same run) and against shmsink/shmsrc
 * (GStreamer's own cross-process shared memory). Prints one table and states the machine.
 * Where nvcodec's cudaupload/cudadownload work (a GPU) and the plugin has its CUDA variant, the same
 * three rows run again over video/x-raw(memory:CUDAMemory): uploaded at the start of each, downloaded
 * at the end, shmsink's with a download before it and an upload after shmsrc.
 *
 *     gst-bench [--frames N] [--paced-frames N] [--width W] [--height H] [--runs R] [--memory system|cuda]
 *
 * Each row runs twice, R times (3) interleaved with the other rows, and shows the medians: unpaced (the producer as
 * fast as it can: frames/s) and paced at 30 frames/s by a live videotestsrc (per-frame latency without queueing, and
 * CPU per frame). The producer stamps every frame (its number and CLOCK_MONOTONIC, in its first 16 bytes) where it
 * enters the transport: the queue's, gpuipcsink's or shmsink's sink pad (cudaupload's in the CUDA rows); the consumer
 * reads the stamp at fakesink. CPU
 * per frame is user + system time of both processes between their first and last frame (the broker is off the per-frame
 * path). Not a test: nothing is asserted; the goals are reported as MET/MISSED.
 *
 * Roles run as child processes of this program (--role ...), the broker as another. */
#include <errno.h>
#include <getopt.h>
#include <gst/gst.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

typedef struct Opts {
        int frames, paced_frames, width, height, runs;
        const char *memory; /* "system" or "cuda": only those rows; NULL: all */
} Opts;

static Opts opts = { .frames = 600, .paced_frames = 150, .width = 1920, .height = 1080, .runs = 3 };

#define MAX_RUNS 15

static uint64_t cpu_ns(void)
{
        struct rusage ru;

        getrusage(RUSAGE_SELF, &ru);
        return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000u +
               ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000u;
}

_Noreturn static void die(const char *fmt, ...) G_GNUC_PRINTF(1, 2);
static void die(const char *fmt, ...)
{
        va_list ap;

        fprintf(stderr, "gst-bench: ");
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        exit(1);
}

/* ---- roles: one pipeline each ---- */

typedef struct Role {
        GMainLoop *loop;
        int frames;          /* to stamp or to receive */
        int seen;
        uint64_t t_first, t_last, cpu_first, cpu_last;
        double *latency_us;  /* one per received frame */
        gboolean failed;
} Role;

static GstPadProbeReturn stamp(GstPad *pad, GstPadProbeInfo *info, gpointer data)
{
        Role *r = data;
        GstMemory *mem = gst_buffer_peek_memory(GST_PAD_PROBE_INFO_BUFFER(info), 0);
        uint64_t word[2] = { (uint64_t)r->seen, 0 };
        GstMapInfo map;

        /* Into the memory in place: making the buffer writable would copy it when someone else holds
         * a reference (a live source does), and the copy would be measured as the transport's. */
        if (!gst_memory_map(mem, &map, GST_MAP_WRITE) || map.size < sizeof(word))
                die("cannot stamp a frame");
        word[1] = monotonic_ns();
        memcpy(map.data, word, sizeof(word));
        gst_memory_unmap(mem, &map);
        if (r->seen == 0) {
                r->t_first = word[1];
                r->cpu_first = cpu_ns();
        }
        r->t_last = word[1];
        r->cpu_last = cpu_ns();
        r->seen++;
        return GST_PAD_PROBE_OK;
}

static GstPadProbeReturn receive(GstPad *pad, GstPadProbeInfo *info, gpointer data)
{
        Role *r = data;
        uint64_t word[2], t = monotonic_ns();

        if (r->seen >= r->frames)
                return GST_PAD_PROBE_DROP;
        if (gst_buffer_extract(GST_PAD_PROBE_INFO_BUFFER(info), 0, word, sizeof(word)) != sizeof(word))
                die("a frame too short to carry a stamp");
        if (word[0] != (uint64_t)r->seen)
                die("frame %d arrived as frame %" PRIu64 " (a transport dropped or reordered frames)", r->seen,
                    word[0]);
        r->latency_us[r->seen] = (double)(t - word[1]) / 1000.0;
        if (r->seen == 0) {
                r->t_first = t;
                r->cpu_first = cpu_ns();
        }
        r->t_last = t;
        r->cpu_last = cpu_ns();
        if (++r->seen == r->frames)
                g_main_loop_quit(r->loop);
        return GST_PAD_PROBE_OK;
}

static gboolean on_message(GstBus *bus, GstMessage *m, gpointer data)
{
        Role *r = data;

        if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
                GError *err = NULL;
                char *debug = NULL;

                gst_message_parse_error(m, &err, &debug);
                fprintf(stderr, "gst-bench: %s: %s (%s)\n", GST_OBJECT_NAME(m->src), err->message,
                        debug ? debug : "");
                g_clear_error(&err);
                g_free(debug);
                r->failed = TRUE;
                g_main_loop_quit(r->loop);
        } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS) {
                g_main_loop_quit(r->loop);
        }
        return TRUE;
}

static void probe(GstElement *pipeline, const char *element, const char *pad, GstPadProbeCallback cb, Role *r)
{
        GstElement *e = gst_bin_get_by_name(GST_BIN(pipeline), element);
        GstPad *p = e ? gst_element_get_static_pad(e, pad) : NULL;

        if (!p)
                die("no pad %s.%s", element, pad);
        gst_pad_add_probe(p, GST_PAD_PROBE_TYPE_BUFFER, cb, r, NULL);
        gst_object_unref(p);
        gst_object_unref(e);
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;

        return x < y ? -1 : x > y;
}

/* Runs launch; stamps at stamp_el's sink pad and/or receives at rx_el's, then prints a RESULT line. A
 * producer of another process waits for SIGTERM after its stream, so that it does not take its
 * shared memory away before the consumer has read it. */
static int run_role(const char *launch, const char *stamp_el, const char *rx_el, int frames, gboolean linger)
{
        Role tx = { .frames = frames }, rx = { .frames = frames };
        GError *err = NULL;
        GstElement *pipeline;
        GstBus *bus;

        /* A role that hangs (a transport that lost its peer) ends by itself. */
        alarm(300);

        pipeline = gst_parse_launch(launch, &err);
        if (!pipeline)
                die("%s: %s", launch, err->message);
        tx.loop = rx.loop = g_main_loop_new(NULL, FALSE);
        rx.latency_us = g_new0(double, frames);
        if (stamp_el)
                probe(pipeline, stamp_el, "sink", stamp, &tx);
        if (rx_el)
                probe(pipeline, rx_el, "sink", receive, &rx);
        bus = gst_element_get_bus(pipeline);
        gst_bus_add_watch(bus, on_message, rx_el ? &rx : &tx);
        if (gst_element_set_state(pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE)
                die("cannot start %s", launch);
        g_main_loop_run(tx.loop);
        if (rx.failed || tx.failed)
                return 1;
        if (rx_el && rx.seen) {
                qsort(rx.latency_us, rx.seen, sizeof(double), cmp_double);
                /* Nearest rank. */
                printf("RESULT rx frames=%d span_ns=%" PRIu64 " cpu_ns=%" PRIu64 " p50_us=%.1f p99_us=%.1f\n",
                       rx.seen, rx.t_last - rx.t_first, rx.cpu_last - rx.cpu_first, rx.latency_us[(rx.seen - 1) / 2],
                       rx.latency_us[(rx.seen * 99 + 99) / 100 - 1]);
        }
        if (stamp_el && !rx_el)
                printf("RESULT tx frames=%d cpu_ns=%" PRIu64 "\n", tx.seen, tx.cpu_last - tx.cpu_first);
        fflush(stdout);
        if (linger)
                pause();
        gst_element_set_state(pipeline, GST_STATE_NULL);
        gst_object_unref(bus);
        gst_object_unref(pipeline);
        return 0;
}

/* ---- the transports ---- */

typedef enum {
        T_QUEUE,
        T_GPUIPC,
        T_GPUIPC_LAST,
        T_SHM,
        /* Device memory: each row uploads at its start and downloads at its end, the stamp and the
         * receive stay in system memory, so the rows differ only in how the frame crosses. */
        T_CUDA_QUEUE,
        T_CUDA_GPUIPC,
        T_CUDA_SHM,
        T_COUNT
} Transport;

static const char *const transport_name[T_COUNT] = {
        [T_QUEUE] = "one process: videotestsrc ! queue ! fakesink",
        [T_GPUIPC] = "gpuipcsink -> gpuipcsrc (2 processes)",
        [T_GPUIPC_LAST] = "  the same, fakesink keeps its last sample",
        [T_SHM] = "shmsink -> shmsrc (2 processes)",
        [T_CUDA_QUEUE] = "CUDA, one process: cudaupload ! queue ! cudadownload",
        [T_CUDA_GPUIPC] = "CUDA: cudaupload ! gpuipcsink -> gpuipcsrc ! cudadownload (2 processes)",
        [T_CUDA_SHM] = "CUDA: ... cudadownload ! shmsink -> shmsrc ! cudaupload ... (2 processes)",
};

static gboolean is_cuda(Transport t)
{
        return t >= T_CUDA_QUEUE;
}

static gboolean is_shm(Transport t)
{
        return t == T_SHM || t == T_CUDA_SHM;
}

/* The row each row is compared with: the one-process queue over the same memory. */
static Transport baseline(Transport t)
{
        return is_cuda(t) ? T_CUDA_QUEUE : T_QUEUE;
}

#define CUDA_CAPS "video/x-raw(memory:CUDAMemory)"
#define SHM_FRAMES 12 /* shmsink's area, in frames (T_SHM says why) */

/* The pipelines of transport t: a single one (consumer NULL), or a producer and a consumer. */
static void pipelines(Transport t, gboolean paced, int frames, const char *dir, char **ret_producer,
                      char **ret_consumer)
{
        g_autofree char *src = g_strdup_printf(
                "videotestsrc num-buffers=%d pattern=black is-live=%s ! "
                "video/x-raw,format=RGBA,width=%d,height=%d,framerate=%s",
                frames, paced ? "true" : "false", opts.width, opts.height, paced ? "30/1" : "1000/1");
        g_autofree char *caps = g_strdup_printf("video/x-raw,format=RGBA,width=%d,height=%d,framerate=30/1",
                                                opts.width, opts.height);
        size_t frame = (size_t)opts.width * opts.height * 4;

        *ret_consumer = NULL;
        switch (t) {
        case T_QUEUE:
                *ret_producer =
                        g_strdup_printf("%s ! queue name=stamp max-size-buffers=4 max-size-bytes=0 "
                                        "max-size-time=0 ! fakesink name=rx sync=false enable-last-sample=false",
                                        src);
                break;
        case T_GPUIPC:
        case T_GPUIPC_LAST:
                *ret_producer =
                        g_strdup_printf("%s ! gpuipcsink name=stamp ring=bench slots=4 wait-members=1 sync=false", src);
                *ret_consumer = g_strdup_printf("gpuipcsrc ring=bench timeout=30000 ! fakesink name=rx sync=false "
                                                "enable-last-sample=%s",
                                                t == T_GPUIPC_LAST ? "true" : "false");
                break;
        case T_SHM:
                /* Room for 12 frames, three times what the other transports hold at most: with room
                 * for 6, shmsink stopped for good in 6 of 40 unpaced runs (its allocator waiting for
                 * space the consumer had already freed); with 12, in none of 60. */
                *ret_producer = g_strdup_printf("%s ! shmsink name=stamp socket-path=%s/shm%d.sock shm-size=%zu "
                                                "wait-for-connection=true sync=false",
                                                src, dir, paced, SHM_FRAMES * frame);
                *ret_consumer = g_strdup_printf("shmsrc socket-path=%s/shm%d.sock is-live=true ! %s ! fakesink name=rx "
                                                "sync=false enable-last-sample=false",
                                                dir, paced, caps);
                break;
        case T_CUDA_QUEUE:
                *ret_producer = g_strdup_printf("%s ! cudaupload name=stamp ! %s ! queue max-size-buffers=4 "
                                                "max-size-bytes=0 max-size-time=0 ! cudadownload ! video/x-raw ! "
                                                "fakesink name=rx sync=false enable-last-sample=false",
                                                src, CUDA_CAPS);
                break;
        case T_CUDA_GPUIPC:
                *ret_producer = g_strdup_printf("%s ! cudaupload name=stamp ! %s ! gpuipcsink ring=bench slots=4 "
                                                "wait-members=1 sync=false",
                                                src, CUDA_CAPS);
                *ret_consumer = g_strdup_printf("gpuipcsrc ring=bench timeout=30000 ! cudadownload ! video/x-raw ! "
                                                "fakesink name=rx sync=false enable-last-sample=false");
                break;
        case T_CUDA_SHM:
                /* What a pipeline without CUDA IPC does: down to system memory, across, and up again. */
                *ret_producer = g_strdup_printf("%s ! cudaupload name=stamp ! %s ! cudadownload ! video/x-raw ! "
                                                "shmsink socket-path=%s/shm%d.sock shm-size=%zu "
                                                "wait-for-connection=true sync=false",
                                                src, CUDA_CAPS, dir, paced, SHM_FRAMES * frame);
                *ret_consumer = g_strdup_printf("shmsrc socket-path=%s/shm%d.sock is-live=true ! %s ! cudaupload ! "
                                                "%s ! cudadownload ! video/x-raw ! fakesink name=rx sync=false "
                                                "enable-last-sample=false",
                                                dir, paced, caps, CUDA_CAPS);
                break;
        default:
                abort();
        }
}

typedef struct Result {
        gboolean ok;
        const char *why;
        double fps, p50_us, p99_us;
        double cpu_rx_us, cpu_tx_us; /* per frame: the consumer (or the single process), the producer */
        int failed_runs;             /* a row's medians: how many of its runs failed (left out) */
} Result;

static pid_t spawn(const char *self, const char *role, const char *launch, int frames, int *ret_fd)
{
        char frames_s[16];
        int fds[2];
        pid_t pid;

        snprintf(frames_s, sizeof(frames_s), "%d", frames);
        if (pipe(fds) < 0)
                die("pipe: %s", strerror(errno));
        pid = fork();
        if (pid < 0)
                die("fork: %s", strerror(errno));
        if (pid == 0) {
                dup2(fds[1], STDOUT_FILENO);
                close(fds[0]);
                close(fds[1]);
                execl(self, self, "--role", role, "--launch", launch, "--frames", frames_s, (char *)NULL);
                _exit(127);
        }
        close(fds[1]);
        *ret_fd = fds[0];
        return pid;
}

/* The RESULT line a role printed (within 120 s), parsed into r; FALSE if there was none. */
static gboolean read_result(int fd, gboolean rx, Result *r, int frames)
{
        char buf[512] = "";
        ssize_t n = 0, got;
        unsigned long long span = 0, cpu = 0;
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int seen = 0;

        /* Twice the time the frames take at 30 frames/s, and 30 s to start: a pass that has not
         * reported by then has stalled (a transport that lost a wake-up), and the run fails. */
        int limit_ms = 30000 + frames * 2000 / 30;

        while (n < (ssize_t)sizeof(buf) - 1 && poll(&pfd, 1, limit_ms) == 1 &&
               (got = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0) {
                n += got;
                if (strchr(buf, '\n'))
                        break;
        }
        if (rx) {
                if (sscanf(buf, "RESULT rx frames=%d span_ns=%llu cpu_ns=%llu p50_us=%lf p99_us=%lf", &seen, &span,
                           &cpu, &r->p50_us, &r->p99_us) != 5)
                        return FALSE;
                if (seen != frames) {
                        fprintf(stderr, "gst-bench: %d of %d frames arrived\n", seen, frames);
                        return FALSE;
                }
                r->fps = span ? (double)(seen - 1) * 1e9 / (double)span : NAN;
        } else if (sscanf(buf, "RESULT tx frames=%d cpu_ns=%llu", &seen, &cpu) != 2) {
                return FALSE;
        }
        *(rx ? &r->cpu_rx_us : &r->cpu_tx_us) = (double)cpu / 1000.0 / (frames > 1 ? frames - 1 : 1);
        return TRUE;
}

static int wait_child(pid_t pid)
{
        int st;

        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static Result run_pass(const char *self, Transport t, gboolean paced, const char *dir)
{
        int frames = paced ? opts.paced_frames : opts.frames;
        g_autofree char *producer = NULL, *consumer = NULL;
        Result r = { 0 };
        int pfd, cfd;
        pid_t p, c;

        pipelines(t, paced, frames, dir, &producer, &consumer);
        if (!consumer) {
                p = spawn(self, "single", producer, frames, &pfd);
                /* The single process's CPU covers both ends: its receive side measured it all. */
                r.ok = read_result(pfd, TRUE, &r, frames);
                close(pfd);
                r.ok = wait_child(p) == 0 && r.ok;
                if (!r.ok)
                        r.why = "failed: the pipeline reported no result or did not exit cleanly";
                return r;
        }
        if (is_shm(t)) {
                g_autofree char *path = g_strdup_printf("%s/shm%d.sock", dir, paced);

                /* shmsrc needs the socket shmsink makes; gpuipcsrc waits for its ring. */
                p = spawn(self, "producer", producer, frames, &pfd);
                for (int i = 0; i < 200 && access(path, F_OK) < 0; i++)
                        usleep(50000);
                c = spawn(self, "consumer", consumer, frames, &cfd);
        } else {
                c = spawn(self, "consumer", consumer, frames, &cfd);
                p = spawn(self, "producer", producer, frames, &pfd);
        }
        if (!read_result(cfd, TRUE, &r, frames)) {
                r.why = "failed: the consumer reported no result";
                kill(c, SIGTERM); /* it may hang on a lost peer */
        }
        if (wait_child(c) != 0 && !r.why)
                r.why = "failed: the consumer did not exit cleanly";
        if (!read_result(pfd, FALSE, &r, frames) && !r.why)
                r.why = "failed: the producer reported no result";
        r.ok = !r.why;
        kill(p, SIGTERM);
        wait_child(p);
        close(cfd);
        close(pfd);
        if (is_shm(t)) {
                g_autofree char *path = g_strdup_printf("%s/shm%d.sock", dir, paced);

                unlink(path);
        }
        return r;
}

/* ---- the table ---- */

static double median_of(double *v, int n)
{
        qsort(v, n, sizeof(double), cmp_double);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Each figure's median over the runs that finished (how many did not, the row says); the first
 * failure when none did. */
static Result median(const Result *r, int runs)
{
        double fps[MAX_RUNS], p50[MAX_RUNS], p99[MAX_RUNS], rx[MAX_RUNS], tx[MAX_RUNS];
        Result m = { .ok = TRUE };
        int n = 0;

        for (int i = 0; i < runs; i++) {
                if (!r[i].ok)
                        continue;
                fps[n] = r[i].fps;
                p50[n] = r[i].p50_us;
                p99[n] = r[i].p99_us;
                rx[n] = r[i].cpu_rx_us;
                tx[n] = r[i].cpu_tx_us;
                n++;
        }
        for (int i = 0; i < runs && n == 0; i++)
                if (!r[i].ok)
                        return r[i];
        m.failed_runs = runs - n;
        m.fps = median_of(fps, n);
        m.p50_us = median_of(p50, n);
        m.p99_us = median_of(p99, n);
        m.cpu_rx_us = median_of(rx, n);
        m.cpu_tx_us = median_of(tx, n);
        return m;
}

static gboolean have_element(const char *name)
{
        GstElementFactory *f = gst_element_factory_find(name);

        if (f)
                gst_object_unref(f);
        return f != NULL;
}

/* Whether the gpuipc plugin was built with its CUDA variant: its sink pad template says so. */
static gboolean plugin_takes_cuda(void)
{
        GstElementFactory *f = gst_element_factory_find("gpuipcsink");
        gboolean found = FALSE;

        if (!f)
                return FALSE;
        for (const GList *l = gst_element_factory_get_static_pad_templates(f); l && !found; l = l->next) {
                const GstStaticPadTemplate *tmpl = l->data;

                found = tmpl->direction == GST_PAD_SINK && tmpl->static_caps.string &&
                        strstr(tmpl->static_caps.string, "memory:CUDAMemory");
        }
        gst_object_unref(f);
        return found;
}

/* Why row t does not run here, or NULL. */
static const char *why_not_measured(Transport t)
{
        if (is_shm(t) && !have_element("shmsink"))
                return "not measured: no shmsink (gstreamer1.0-plugins-bad)";
        if (is_cuda(t) && !(have_element("cudaupload") && have_element("cudadownload")))
                return "not measured: no cudaupload/cudadownload (a GPU, its driver and nvcodec)";
        if (is_cuda(t) && !plugin_takes_cuda())
                return "not measured: the plugin was built without its CUDA variant";
        if (opts.memory && is_cuda(t) != !strcmp(opts.memory, "cuda"))
                return "not asked for (--memory)";
        return NULL;
}

static void describe_machine(void)
{
        char line[512], cpu[256] = "unknown CPU";
        unsigned long long mem_kib = 0;
        double load[3] = { 0 };
        struct utsname u;
        FILE *f;

        f = fopen("/proc/cpuinfo", "re");
        while (f && fgets(line, sizeof(line), f))
                if (strncmp(line, "model name", 10) == 0 && strchr(line, ':')) {
                        snprintf(cpu, sizeof(cpu), "%s", strchr(line, ':') + 2);
                        cpu[strcspn(cpu, "\n")] = 0;
                        break;
                }
        if (f)
                fclose(f);
        f = fopen("/proc/meminfo", "re");
        while (f && fgets(line, sizeof(line), f))
                if (strncmp(line, "MemTotal:", 9) == 0)
                        mem_kib = strtoull(line + 9, NULL, 10);
        if (f)
                fclose(f);
        uname(&u);
        getloadavg(load, 3);
        printf("machine: %s, %ld cores, %llu MiB, %s %s; load average %.1f at the start\n", cpu,
               sysconf(_SC_NPROCESSORS_ONLN), mem_kib / 1024, u.sysname, u.release, load[0]);
        printf("%s; %dx%d RGBA (%.1f MB a frame); %d frames unpaced, %d paced at 30 frames/s; medians of %d runs\n",
               gst_version_string(), opts.width, opts.height, opts.width * opts.height * 4 / 1e6, opts.frames,
               opts.paced_frames, opts.runs);
}

static void report_goals(Result res[T_COUNT][2], Transport queue, Transport gpuipc, Transport shm)
{
        const char *memory = is_cuda(queue) ? "CUDA memory" : "system memory";

        if (res[queue][0].ok && res[gpuipc][0].ok) {
                double ratio = res[queue][0].fps / res[gpuipc][0].fps;

                printf("goal (%s): gpuipc within 1.2x of the one-process queue: %.2fx, %s\n", memory, ratio,
                       ratio <= 1.2 ? "MET" : "MISSED");
        }
        if (res[shm][0].ok && res[gpuipc][0].ok)
                printf("goal (%s): gpuipc faster than shmsink/shmsrc: %.0f vs %.0f frames/s, %s\n", memory,
                       res[gpuipc][0].fps, res[shm][0].fps, res[gpuipc][0].fps > res[shm][0].fps ? "MET" : "MISSED");
}

static void usage(void)
{
        fprintf(stderr, "usage: gst-bench [--frames N] [--paced-frames N] [--width W] [--height H] [--runs R] "
                        "[--memory system|cuda]\n");
        exit(2);
}

int main(int argc, char **argv)
{
        static const struct option longopts[] = {
                { "frames", required_argument, NULL, 'f' }, { "paced-frames", required_argument, NULL, 'p' },
                { "width", required_argument, NULL, 'w' },  { "height", required_argument, NULL, 'h' },
                { "role", required_argument, NULL, 'r' },   { "launch", required_argument, NULL, 'l' },
                { "runs", required_argument, NULL, 'n' },   { "memory", required_argument, NULL, 'm' },
                { NULL, 0, NULL, 0 },
        };
        const char *role = NULL, *launch = NULL;
        char dir[] = "/tmp/gst-bench.XXXXXX", sock[64], reg[64];
        static Result runs[T_COUNT][2][MAX_RUNS];
        const char *skip[T_COUNT];
        Result res[T_COUNT][2];
        pid_t broker;
        int o;

        while ((o = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
                switch (o) {
                case 'f': opts.frames = atoi(optarg); break;
                case 'p': opts.paced_frames = atoi(optarg); break;
                case 'w': opts.width = atoi(optarg); break;
                case 'h': opts.height = atoi(optarg); break;
                case 'r': role = optarg; break;
                case 'l': launch = optarg; break;
                case 'n': opts.runs = atoi(optarg); break;
                case 'm': opts.memory = optarg; break;
                default: usage();
                }
        }
        if (opts.frames < 2 || opts.paced_frames < 2 || opts.width < 4 || opts.height < 1 || opts.runs < 1 ||
            opts.runs > MAX_RUNS || (opts.memory && strcmp(opts.memory, "system") && strcmp(opts.memory, "cuda")))
                usage();
        if (role) {
                /* As gst-launch-1.0 does: a transport writing to a peer that went away must get EPIPE, not
                 * die (shmsink does not ask for MSG_NOSIGNAL). */
                signal(SIGPIPE, SIG_IGN);
                gst_init(&argc, &argv);
                if (!strcmp(role, "single"))
                        return run_role(launch, "stamp", "rx", opts.frames, FALSE);
                if (!strcmp(role, "producer"))
                        return run_role(launch, "stamp", NULL, opts.frames, TRUE);
                return run_role(launch, NULL, "rx", opts.frames, FALSE);
        }

        if (!mkdtemp(dir))
                die("mkdtemp: %s", strerror(errno));
        snprintf(sock, sizeof(sock), "%s/gpuipc.sock", dir);
        snprintf(reg, sizeof(reg), "%s/registry.bin", dir);
        setenv("GPUIPC_SOCKET", sock, 1);
        setenv("GST_REGISTRY", reg, 1);
        setenv("GST_PLUGIN_PATH", BENCH_GST_PLUGIN_DIR, 1);
        gst_init(&argc, &argv);
        broker = fork();
        if (broker == 0) {
                execl(BENCH_BROKER, BENCH_BROKER, "--socket", sock, "--log-level", "error", (char *)NULL);
                _exit(127);
        }
        for (int i = 0; i < 100 && access(sock, F_OK) < 0; i++)
                usleep(50000);
        if (access(sock, F_OK) < 0)
                die("the broker did not start");
        if (!have_element("gpuipcsink"))
                die("the gpuipc plugin is not in %s", BENCH_GST_PLUGIN_DIR);

        describe_machine();
        for (Transport t = 0; t < T_COUNT; t++)
                skip[t] = why_not_measured(t);
        /* Interleaved, so that a burst of load elsewhere hurts one run of every row, not all of one. */
        for (int run = 0; run < opts.runs; run++)
                for (Transport t = 0; t < T_COUNT; t++)
                        for (int paced = 0; paced < 2; paced++) {
                                Result *r = &runs[t][paced][run];

                                if ((r->why = skip[t]))
                                        continue;
                                fprintf(stderr, "gst-bench: run %d: %s, %s\n", run + 1, transport_name[t],
                                        paced ? "paced" : "unpaced");
                                *r = run_pass(argv[0], t, paced, dir);
                                if (!r->ok)
                                        fprintf(stderr, "gst-bench: %s\n", r->why);
                        }
        for (Transport t = 0; t < T_COUNT; t++)
                for (int paced = 0; paced < 2; paced++)
                        res[t][paced] = median(runs[t][paced], opts.runs);
        kill(broker, SIGTERM);
        wait_child(broker);
        unlink(reg);
        unlink(sock);

        printf("\n| transport | frames/s (unpaced) | x the queue's (time per frame) | latency p50 / p99 (us, 30 "
               "frames/s) | CPU per "
               "frame (us, 30 frames/s): producer + consumer |\n|---|---|---|---|---|\n");
        for (Transport t = 0; t < T_COUNT; t++) {
                Result *u = &res[t][0], *p = &res[t][1];
                g_autofree char *name = NULL;

                if (!u->ok || !p->ok) {
                        printf("| %s | %s | | | |\n", transport_name[t], u->why ? u->why : p->why);
                        continue;
                }
                name = u->failed_runs || p->failed_runs
                               ? g_strdup_printf("%s (left out, failed: %d of %d runs unpaced, %d of %d paced)",
                                                 transport_name[t], u->failed_runs, opts.runs, p->failed_runs,
                                                 opts.runs)
                               : g_strdup(transport_name[t]);
                printf("| %s | %.0f | %.2f | %.0f / %.0f | ", name, u->fps,
                       res[baseline(t)][0].ok ? res[baseline(t)][0].fps / u->fps : NAN, p->p50_us, p->p99_us);
                if (t == baseline(t))
                        printf("%.0f (one process) |\n", p->cpu_rx_us);
                else
                        printf("%.0f + %.0f = %.0f |\n", p->cpu_tx_us, p->cpu_rx_us, p->cpu_tx_us + p->cpu_rx_us);
        }
        printf("| cudaipcsink -> cudaipcsrc | %s | | | |\n",
               have_element("cudaipcsink") ? "not measured here (not built for GStreamer >= 1.24)"
                                           : "not available: needs GStreamer >= 1.24 with nvcodec");
        printf("\n");
        report_goals(res, T_QUEUE, T_GPUIPC, T_SHM);
        report_goals(res, T_CUDA_QUEUE, T_CUDA_GPUIPC, T_CUDA_SHM);
        if (rmdir(dir) < 0)
                fprintf(stderr, "gst-bench: %s left behind: %s\n", dir, strerror(errno));
        return 0;
}
