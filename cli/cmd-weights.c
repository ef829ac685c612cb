/* gpuipcctl weights: a checkpoint loaded once per node and kept resident for the engines that
 * (re)start from it. load reads safetensors files straight into one broker-held buffer, in the
 * layout the Python package's attach_state_dict() reads, publishes it and exits: the memory stays
 * with the broker until `weights drop` and the last holder's release. serve does the same and stays
 * as the buffer's producer, so that a broker restart (which forgets broker-held buffers whose
 * producer is gone) loses nothing. ls lists broker-held buffers; drop retires one.
 *
 * What they must never do: publish a checkpoint that was not read whole and checked (the publish
 * is the last step, so a loader killed or failing before it leaves nothing registered), or allocate
 * more than the device or the machine has free (checked against the layout, before allocating). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "ctl.h"
#include "text.h"

#define TICK_MS 200 /* how often serve looks at its stop flag */

/* Set by SIGTERM or SIGINT; serve looks at it every TICK_MS between events. The handler only sets
 * it: the leaving (which talks to the broker) happens in serve's loop, outside the signal. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
        (void)sig;
        stop_requested = 1;
}

/* What load and serve were asked for; files point into argv. */
typedef struct LoadArgs {
        const char *name;
        char **files;
        size_t n_files;
        gpuipc_kind_t kind;
        long device;
        uint64_t chunk;
} LoadArgs;

/* The progress line: on a terminal only, redrawn at most 10 times a second. */
typedef struct Progress {
        const char *name;
        uint64_t total, start_ns, last_ns;
        bool shown;
} Progress;

/* gpuipc_buffer_load's callback, after each chunk, on the calling thread. Redraws are rate-limited:
 * at a few GB/s chunks come far faster than a person reads, and the terminal's writes would cost the
 * load time. The last call (done == total) always draws, so the line ends at 100%. */
static void on_progress(uint64_t done, void *ud)
{
        Progress *p = ud;
        uint64_t now = monotonic_ns();
        double s = (double)(now - p->start_ns) / 1e9;
        char have[32], want[32];

        if (now - p->last_ns < 100000000 && done < p->total)
                return;
        p->last_ns = now;
        ctl_human_size(done, have, sizeof(have));
        ctl_human_size(p->total, want, sizeof(want));
        fprintf(stderr, "\rloading %s: %s of %s (%.0f%%), %.2f GB/s   ", p->name, have, want,
                p->total ? 100.0 * (double)done / (double)p->total : 100.0, s > 0 ? (double)done / s / 1e9 : 0.0);
        p->shown = true;
}

/* load's and serve's arguments. cuda-legacy is refused here: broker-held memory outlives its
 * producer, so it must be exportable as an fd, which legacy IPC handles are not. --chunk is bounded
 * so that the staging memory (two chunks, page-locked) stays reasonable and a read is never tiny. */
static int parse_load(Ctl *ctl, int argc, char **argv, LoadArgs *a)
{
        int c, r;

        *a = (LoadArgs){ .kind = GPUIPC_KIND_CUDA_VMM };
        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0) {
                switch (c) {
                case 'k':
                        if (ctl_parse_kind(ctl, "--kind", optarg, &a->kind))
                                return CTL_USAGE;
                        if (a->kind == GPUIPC_KIND_CUDA_LEGACY)
                                return ctl_usage(ctl, "--kind cuda-legacy: weights are cuda-vmm or memfd (broker-held "
                                                      "memory must be exported as an fd)");
                        break;
                case 'd':
                        if (ctl_parse_int(ctl, "--device", optarg, 0, 1024, &a->device))
                                return CTL_USAGE;
                        break;
                case CTL_OPT_CHUNK:
                        if (ctl_parse_size(ctl, "--chunk", optarg, &a->chunk))
                                return CTL_USAGE;
                        if (a->chunk < (1u << 20) || a->chunk > (1ull << 30))
                                return ctl_usage(ctl, "--chunk '%s': between 1M and 1G", optarg);
                        break;
                }
        }
        if (c < 0)
                return r;
        if (optind + 2 > argc)
                return ctl_usage(ctl, "give a NAME and at least one FILE");
        a->name = argv[optind];
        a->files = argv + optind + 1;
        a->n_files = (size_t)(argc - optind - 1);
        /* Checked here, before a file is read: a long load must not end in a refused publish. */
        if (!a->name[0] || strlen(a->name) > GPUIPC_MAX_NAME)
                return ctl_usage(ctl, "NAME must be 1 to %d bytes", GPUIPC_MAX_NAME);
        return CTL_CONTINUE;
}

/* Refuses a checkpoint the device or the machine cannot hold, before anything is allocated. */
static int check_room(Ctl *ctl, const LoadArgs *a, const Checkpoint *ck)
{
        size_t free_b, total;
        char want[32], have[32], all[32];
        int r;

        /* A memfd larger than the memory this process may still use is refused by
         * gpuipc_buffer_alloc itself, naming the bound, before anything is allocated. */
        if (a->kind == GPUIPC_KIND_MEMFD)
                return 0;
        r = gpuipc_device_memory(ctl->c, (int)a->device, &free_b, &total);
        if (r < 0)
                return ctl_fail(ctl, "reading the device's free memory", r);
        /* Free memory is a snapshot: another process may take it before the allocation, which
         * then fails with its own error; this is for a clear message in the usual case. */
        if (ck->size <= free_b)
                return 0;
        ctl_human_size(ck->size, want, sizeof(want));
        ctl_human_size(free_b, have, sizeof(have));
        ctl_human_size(total, all, sizeof(all));
        return ctl_error(ctl, "no-memory",
                         "the checkpoint needs %" PRIu64 " bytes (%s) on device %ld, which has %zu bytes (%s) free "
                         "of %s",
                         ck->size, want, a->device, free_b, have, all);
}

/* When each step around the load ended (monotonic_ns): a fresh process pays CUDA's start and the
 * allocation before the load, which its rate does not show. */
typedef struct LoadTimes {
        uint64_t start, connected, allocated, published;
} LoadTimes;

/* The summary: total time and rate, and how it split between reading the files and waiting for the
 * device's copies, which says whether the disk or the GPU set the pace; and what came before and
 * after the load (connecting, with CUDA's start for the CUDA kinds; allocating; the manifest and the
 * publish). */
static void print_loaded(Ctl *ctl, const LoadArgs *a, const Checkpoint *ck, const gpuipc_buffer_t *b,
                         const gpuipc_load_stats_t *st, const LoadTimes *t)
{
        double connect_s = (double)(t->connected - t->start) / 1e9;
        double alloc_s = (double)(t->allocated - t->connected) / 1e9;
        double publish_s = (double)(t->published - t->allocated - st->total_ns) / 1e9;
        double s = (double)st->total_ns / 1e9, read_s = (double)st->read_ns / 1e9;
        double gbps = s > 0 ? (double)st->bytes / s / 1e9 : 0;
        double read_gbps = read_s > 0 ? (double)st->bytes / read_s / 1e9 : 0;

        /* Exact numbers for scripts: size is the whole buffer (manifest included), bytes the
         * tensors' data read, times in seconds; the text line rounds them for people. */
        if (ctl->json) {
                Json o;
                json_begin(&o, stdout, '{');
                json_kstr(&o, "event", "loaded");
                json_kstr(&o, "name", a->name);
                json_ku64(&o, "buffer", gpuipc_buffer_id(b));
                json_ku64(&o, "generation", gpuipc_buffer_generation(b));
                json_kstr(&o, "kind", gpuipc_kind_name(gpuipc_buffer_kind(b)));
                json_kstr(&o, "device", gpuipc_buffer_device(b));
                json_ku64(&o, "files", ck->n_files);
                json_ku64(&o, "tensors", ck->n);
                json_ku64(&o, "bytes", st->bytes);
                json_ku64(&o, "size", ck->size);
                json_kdouble(&o, "seconds", s);
                json_kdouble(&o, "gb_per_s", gbps);
                json_kdouble(&o, "read_seconds", read_s);
                json_kdouble(&o, "copy_wait_seconds", (double)st->copy_wait_ns / 1e9);
                json_kdouble(&o, "connect_seconds", connect_s);
                json_kdouble(&o, "alloc_seconds", alloc_s);
                json_kdouble(&o, "publish_seconds", publish_s);
                json_end(&o, '}');
                putchar('\n');
        } else {
                char size[32];
                ctl_human_size(st->bytes, size, sizeof(size));
                printf("loaded ");
                text_safe(stdout, a->name);
                printf(": %zu tensors from %zu file%s, %" PRIu64 " bytes (%s) in %.3f s: %.2f GB/s (reading %.3f s, "
                       "%.2f GB/s; waiting for the device's copies %.3f s); before it connecting %.3f s and "
                       "allocating %.3f s, after it publishing %.3f s\n", ck->n, ck->n_files,
                       ck->n_files == 1 ? "" : "s", st->bytes, size, s, gbps, read_s, read_gbps,
                       (double)st->copy_wait_ns / 1e9, connect_s, alloc_s, publish_s);
                printf("published name=");
                text_safe(stdout, a->name);
                printf(" buffer=%" PRIu64 " generation=%" PRIu64 " kind=%s size=%zu%s%s broker-held\n",
                       gpuipc_buffer_id(b), gpuipc_buffer_generation(b), gpuipc_kind_name(gpuipc_buffer_kind(b)),
                       gpuipc_buffer_size(b), gpuipc_buffer_device(b)[0] ? " device=" : "", gpuipc_buffer_device(b));
        }
        ctl->printed = true;
        /* Flushed now: serve goes on running, and whatever waits on its stdout (a pipe is block
         * buffered) must see the line when the weights are published, not when it exits. */
        fflush(stdout);
}

/* Reads the checkpoint into a new buffer and publishes it; *ret_b on success. Every failure frees
 * what it made, and nothing is published before every byte is in. */
static int load_and_publish(Ctl *ctl, const LoadArgs *a, gpuipc_buffer_t **ret_b)
{
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .broker_held = 1 };
        gpuipc_load_options_t lo = { .struct_size = sizeof(lo), .chunk_size = (size_t)a->chunk };
        Progress prog = { .name = a->name };
        LoadTimes t = { .start = monotonic_ns() };
        gpuipc_load_stats_t st;
        gpuipc_file_range_t *ranges = NULL;
        Checkpoint *ck = NULL;
        gpuipc_buffer_t *b = NULL;
        uint8_t meta[512];
        char err[1024];
        int r;

        /* Headers first, before connecting: a bad file is refused without touching the broker. */
        r = checkpoint_open(a->files, a->n_files, &ck, err, sizeof(err));
        if (r == -ENOMEM)
                return ctl_error(ctl, "no-memory", "reading the checkpoint's headers: out of memory");
        if (r < 0)
                return ctl_error(ctl, "bad-checkpoint", "%s", err);
        r = ctl_connect(ctl, a->kind != GPUIPC_KIND_MEMFD);
        if (r == 0)
                r = check_room(ctl, a, ck);
        if (r)
                goto out;
        t.connected = monotonic_ns();
        ranges = checkpoint_ranges(ck);
        po.meta = meta;
        po.meta_len = checkpoint_meta(ck, meta, sizeof(meta));
        if (!ranges || !po.meta_len) {
                r = ctl_error(ctl, "no-memory", "laying out the checkpoint: out of memory");
                goto out;
        }
        r = gpuipc_buffer_alloc(ctl->c, a->kind, (size_t)ck->size, (int)a->device, &b);
        if (r < 0) {
                /* Nothing was allocated: the cleanup below must not free a stale pointer. */
                r = ctl_fail(ctl, "allocating the buffer", r);
                b = NULL;
                goto out;
        }
        t.allocated = monotonic_ns();
        /* A terminal only: redrawn with '\r', the line would fill a log file with hundreds of
         * copies. */
        if (isatty(STDERR_FILENO)) {
                prog.total = ck->data_bytes;
                prog.start_ns = monotonic_ns();
                lo.progress = on_progress;
                lo.progress_ud = &prog;
        }
        r = gpuipc_buffer_load(b, ranges, ck->n, &lo, &st);
        if (prog.shown)
                fputc('\n', stderr);
        if (r < 0) {
                r = ctl_fail(ctl, "loading the checkpoint", r);
                goto out;
        }
        /* The manifest goes last: a buffer without it is no state dict, and it is only written once
         * every tensor is in. */
        r = gpuipc_buffer_write(b, (size_t)ck->manifest_offset, ck->manifest, ck->manifest_len);
        if (r < 0) {
                r = ctl_fail(ctl, "writing the manifest", r);
                goto out;
        }
        r = gpuipc_publish(ctl->c, b, a->name, &po);
        if (r < 0) {
                r = ctl_fail(ctl, "publish", r);
                goto out;
        }
        t.published = monotonic_ns();
        print_loaded(ctl, a, ck, b, &st, &t);
        *ret_b = b;
        b = NULL;
out:
        if (b)
                gpuipc_buffer_free(ctl->c, b);
        free(ranges);
        checkpoint_free(ck);
        return r;
}

/* Leaves the published buffer to the broker: the connection ends without retiring or freeing it
 * (gpuipc_close would), and main's gpuipc_close then has nothing to close. */
static void leave_to_broker(Ctl *ctl)
{
        gpuipc_abandon(ctl->c);
        ctl->c = NULL;
}

/* load: publish, then leave the buffer to the broker and exit. */
static int weights_load(Ctl *ctl, int argc, char **argv)
{
        gpuipc_buffer_t *b = NULL;
        LoadArgs a;
        int r = parse_load(ctl, argc, argv, &a);

        if (r != CTL_CONTINUE)
                return r;
        r = load_and_publish(ctl, &a, &b);
        if (r)
                return r;
        leave_to_broker(ctl);
        return CTL_OK;
}

/* serve: publish, then stay the producer until stopped or until the weights drained. Signals are
 * set up before the load so that a SIGTERM during a long load stops the loop at once after it. */
static int weights_serve(Ctl *ctl, int argc, char **argv)
{
        struct sigaction sa = { .sa_handler = on_stop_signal };
        gpuipc_buffer_t *b = NULL;
        LoadArgs a;
        int r = parse_load(ctl, argc, argv, &a);

        if (r != CTL_CONTINUE)
                return r;
        ctl->reconnect = true; /* the point of serve: through a broker restart, publishing again */
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        r = load_and_publish(ctl, &a, &b);
        if (r)
                return r;
        /* Held until told to stop, or until the weights were dropped and every holder let go
         * (then the memory is gone with us: nothing is left to serve). */
        while (!stop_requested) {
                gpuipc_event_t ev;
                r = gpuipc_next_event(ctl->c, TICK_MS, &ev);
                /* A reconnect within one tick may meet a broker that drops the connection (one being
                 * killed still accepts for a moment): the library gives up for this call and tries
                 * again at the next, as it does while nothing listens. Only other errors end serve. */
                if (r == GPUIPC_E_TIMEOUT || r == GPUIPC_E_DISCONNECTED)
                        continue;
                if (r < 0) {
                        /* The "loaded" line was a document of its own: with --json the failure is
                         * the next line's, as serve prints one document per line. */
                        ctl->printed = false;
                        return ctl_fail(ctl, "serving", r);
                }
                if (ev.type == GPUIPC_EVENT_RECONNECTED && !ctl->json)
                        printf("reconnected: the broker restarted; the weights are registered again\n");
                /* Subscription 0: the notice about our own buffer, not about one a watch matched. */
                if (ev.type == GPUIPC_EVENT_DRAINED && ev.subscription == 0 && ev.buffer == gpuipc_buffer_id(b)) {
                        if (!ctl->json)
                                printf("dropped and drained: the memory is freed\n");
                        return CTL_OK; /* main's gpuipc_close frees it */
                }
                fflush(stdout);
        }
        /* Stopped: the weights stay, broker-held, as after load. */
        leave_to_broker(ctl);
        return CTL_OK;
}

/* ---- ls and drop ---- */

/* A retired version still held is "draining": that is what a user sees after loading a new version
 * or dropping one, and the word says the memory goes once its holders let go. */
static const char *weights_state(const gpuipc_buffer_info_t *b)
{
        return b->state == GPUIPC_STATE_LIVE ? "live" : b->state == GPUIPC_STATE_RETIRED ? "draining" : "idle";
}

static void weights_json(Json *o, const void *record)
{
        const gpuipc_buffer_info_t *b = record;

        json_kstr(o, "name", b->name);
        json_kstr(o, "state", weights_state(b));
        json_ku64(o, "generation", b->generation);
        json_ku64(o, "buffer", b->buffer);
        json_kstr(o, "kind", gpuipc_kind_name(b->kind));
        json_kstr(o, "device", b->device);
        json_ku64(o, "size", b->size);
        json_ku64(o, "holders", b->holders);
        json_ku64(o, "uid", b->uid);
        json_ku64(o, "pid", b->pid);
        json_kbool(o, "orphaned", b->owner == 0);
}

static const char *const weights_headers[] = { "NAME", "STATE", "GEN", "KIND", "DEVICE", "SIZE", "HOLDERS", "UID",
                                               "KEPT BY" };

static void weights_row(Table *t, const void *record)
{
        const gpuipc_buffer_info_t *b = record;
        char size[32];

        ctl_human_size(b->size, size, sizeof(size));
        table_cell(t, "%s", b->name);
        table_cell(t, "%s", weights_state(b));
        table_cell(t, "%" PRIu64, b->generation);
        table_cell(t, "%s", gpuipc_kind_name(b->kind));
        table_cell(t, "%s", b->device[0] ? b->device : "-");
        table_cell(t, "%s", size);
        table_cell(t, "%" PRIu64, b->holders);
        table_cell(t, "%" PRIu64, b->uid);
        if (b->owner)
                table_cell(t, "pid %" PRIu64, b->pid);
        else
                table_cell(t, "broker");
}

/* The broker-held buffers of a page, moved to its front. */
static int fetch_weights(Ctl *ctl, const char *prefix, uint64_t *cursor, void *page, int cap)
{
        gpuipc_buffer_info_t *v = page;
        int n = gpuipc_list_buffers(ctl->c, prefix, cursor, v, (size_t)cap), kept = 0;

        /* Filtered after the fetch, so a page may keep none while the cursor goes on: ctl_list
         * pages until the cursor is 0, never stopping at a short page. */
        for (int i = 0; i < n; i++)
                if (v[i].broker_held)
                        v[kept++] = v[i];
        return n < 0 ? n : kept;
}

static const CtlListing weights_listing = {
        sizeof(gpuipc_buffer_info_t), 256, fetch_weights, weights_json, weights_headers, "lllllrrrl", weights_row,
};

/* ls: the broker's own listing, kept to broker-held buffers; weights are exactly those. */
static int weights_ls(Ctl *ctl, int argc, char **argv)
{
        const char *prefix = NULL;
        int c, r;

        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0)
                prefix = optarg;
        if (c < 0)
                return r;
        if (optind < argc)
                return ctl_usage(ctl, "unexpected argument '%s'", argv[optind]);
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        r = ctl_list(ctl, &weights_listing, prefix, false);
        return r < 0 ? ctl_fail(ctl, "list", r) : CTL_OK;
}

/* drop: a stat first, so that a name that is not weights (a producer's own buffer) is refused with
 * the right fix instead of being retired by mistake; then a retire by id, which is the buffer the
 * stat saw even if the name is published again meanwhile. */
static int weights_drop(Ctl *ctl, int argc, char **argv)
{
        gpuipc_buffer_info_t info;
        char what[GPUIPC_MAX_NAME + 32];
        const char *name = NULL;
        int c, r;

        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0)
                ;
        if (c < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, true, &name)) != CTL_CONTINUE)
                return r;
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        snprintf(what, sizeof(what), "drop '%s'", name);
        r = gpuipc_stat_buffer(ctl->c, name, 0, NULL, 0, &info);
        if (r < 0)
                return ctl_fail(ctl, what, r);
        if (!info.broker_held)
                return ctl_error(ctl, "invalid",
                                 "'%s' (buffer %" PRIu64 ") is not broker-held: not weights; its producer frees it "
                                 "(gpuipcctl retire retires it)", name, info.buffer);
        r = gpuipc_retire_id(ctl->c, info.buffer);
        if (r < 0)
                return ctl_fail(ctl, what, r);
        if (ctl->json) {
                Json o;
                json_begin(&o, stdout, '{');
                json_kstr(&o, "event", "dropped");
                json_kstr(&o, "name", name);
                json_ku64(&o, "buffer", info.buffer);
                json_ku64(&o, "holders", info.holders);
                json_end(&o, '}');
                putchar('\n');
        } else {
                printf("dropped ");
                text_safe(stdout, name);
                if (info.holders)
                        printf(" (buffer %" PRIu64 "): new attaches fail; the memory is freed once its %" PRIu64
                               " holder%s released it\n", info.buffer, info.holders, info.holders == 1 ? "" : "s");
                else
                        printf(" (buffer %" PRIu64 "): nobody held it; the memory is freed\n", info.buffer);
        }
        return CTL_OK;
}

/* ---- the subcommands ---- */

static const CtlOption load_options[] = {
        { 'k', "kind", 'k', "K", CTL_VALUE_KIND, "cuda-vmm (default) or memfd (host memory: CPU inference, tests)" },
        { 'd', "device", 'd', "N", CTL_VALUE_ANY, "the CUDA device ordinal (cuda-vmm; default 0)" },
        { CTL_OPT_CHUNK, "chunk", 0, "BYTES", CTL_VALUE_ANY,
          "read this much at once (default 64M; 1M to 1G); cuda-vmm stages two chunks\n"
          "in page-locked host memory" },
        { 0 }
};

static const CtlOption ls_options[] = {
        { 'p', "prefix", 'p', "P", CTL_VALUE_ANY, "only names that start with P" },
        { 0 }
};

static const CtlCommand weights_commands[] = {
        { "weights load", weights_load, "NAME FILE... [--kind cuda-vmm|memfd] [--device N] [--chunk BYTES]", "",
          "Reads a safetensors checkpoint (one file, several, or a sharded checkpoint's\n"
          "model.safetensors.index.json, whose shards are read from its directory; FILE - is standard input)\n"
          "into one buffer, in the layout attach_state_dict() reads, publishes it broker-held under NAME as a\n"
          "state dict, and exits: the weights stay resident until `weights drop NAME` and their last holder's\n"
          "release. Every header is checked first (a malformed, truncated or overlapping file is refused with\n"
          "the file and byte named), and the checkpoint must fit the device's free memory (memfd: the memory\n"
          "available); nothing is published unless every byte was read. A progress line on a terminal, a\n"
          "summary at the end (bytes, tensors, seconds, GB/s, time reading and time waiting for the device).\n"
          "Loading NAME again publishes a new version: new attaches get it, the old one drains.",
          load_options, CTL_VALUE_FILE },
        { "weights serve", weights_serve, "NAME FILE... [--kind cuda-vmm|memfd] [--device N] [--chunk BYTES]", "",
          "Loads as `weights load` does, then stays running as the weights' producer, so that a broker restart\n"
          "(SIGKILL included) loses nothing: it reconnects and registers them again, and engines reclaim what\n"
          "they hold. It exits when the weights were dropped and drained (freeing them), or on SIGTERM or\n"
          "SIGINT, leaving them broker-held as load does.", load_options, CTL_VALUE_FILE },
        { "weights ls", weights_ls, "[--prefix P]", "",
          "Lists broker-held buffers, which is what weights are: name, state (live: what attaches get;\n"
          "draining: an older version, or a dropped one, still held; idle), generation (each version has its\n"
          "own), kind, device, size, holders, the producer's uid, and who keeps the memory (\"pid N\": a\n"
          "running producer such as `weights serve`; \"broker\": the broker alone).", ls_options,
          CTL_VALUE_NONE },
        { "weights drop", weights_drop, "NAME", "",
          "Retires the weights published under NAME: new attaches fail at once, engines that hold them keep\n"
          "them, and the memory is freed when the last one releases. Allowed to the weights' uid once no\n"
          "producer runs (stop `weights serve` first) and to a policy admin.", NULL, CTL_VALUE_NAME },
};

/* Dispatches "weights SUB": each subcommand parses its own options (optind reset), with argv moved
 * past "weights" so that its usage and help are its own. */
int cmd_weights(Ctl *ctl, int argc, char **argv)
{
        if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0))
                return ctl_help(ctl);
        for (size_t i = 0; argc >= 2 && i < sizeof(weights_commands) / sizeof(weights_commands[0]); i++) {
                if (strcmp(argv[1], weights_commands[i].name + strlen("weights ")) != 0)
                        continue;
                ctl->cmd = &weights_commands[i];
                optind = 0;
                return weights_commands[i].fn(ctl, argc - 1, argv + 1);
        }
        return ctl_usage(ctl, argc < 2 ? "give a subcommand: load, serve, ls or drop" : "unknown subcommand '%s'",
                         argc < 2 ? "" : argv[1]);
}
