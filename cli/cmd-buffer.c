/* Subcommands that move data: publish, attach, retire, and group. publish and attach hold what
 * they got until told to stop, so they handle SIGTERM themselves.
 *
 * What they must never do: leave a reference or a published buffer behind when they exit on a
 * signal (every path ends in gpuipc_release or gpuipc_buffer_free), or print a verdict about data
 * they did not read: attach reports "verified" only after every byte was compared. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "json.h"
#include "pattern.h"
#include "text.h"

/* gpuipcctl includes no internal header but util's header-only clock.h (it is a client of the
 * public API alone), so not macro.h's MIN either. */
#ifndef MIN
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#endif

/* Staging for the CUDA kinds, whose memory the host cannot address: a buffer of any size is filled
 * or checked through this much host memory, not a copy of its whole size. */
#define CHUNK (16u << 20)
#define TICK_MS 200         /* how often a holding command checks for SIGTERM: a stop is acted on
                             * within a fifth of a second, and an idle hold wakes 5 times a second */

/* Set by SIGTERM/SIGINT. A holding command must act on them itself: as a container's pid 1 it
 * would otherwise ignore SIGTERM, and the kubelet would have to wait for the grace period. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
        (void)sig;
        stop_requested = 1;
}

/* The library retries its polls on EINTR, so a signal does not cut a wait short: the holding
 * loops wait in TICK_MS slices and look at stop_requested between them. */
static void catch_stop_signals(void)
{
        struct sigaction sa = { .sa_handler = on_stop_signal };

        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
}

/* --fill's and --verify's value; the message lists the spellings, since a pattern is easy to
 * mistype and the usage line alone does not say them. */
static int parse_pattern(Ctl *ctl, const char *opt, const char *s, Pattern *ret)
{
        if (pattern_parse(s, ret) < 0)
                return ctl_usage(ctl, "%s '%s': not a pattern; use counter, byte:0xAB or random:SEED", opt, s);
        return 0;
}

/* Fills or checks the whole buffer, in place for host memory, through a staging area otherwise. */
static int fill(gpuipc_buffer_t *b, const Pattern *p)
{
        size_t size = gpuipc_buffer_size(b);
        uint8_t *stage;

        if (gpuipc_buffer_kind(b) == GPUIPC_KIND_MEMFD) {
                pattern_fill(p, 0, gpuipc_buffer_ptr(b), size);
                return 0;
        }
        /* A chunk at a time: pattern offsets are buffer offsets (pattern_fill), so the chunks
         * join into the same bytes as a fill in place would write. */
        stage = malloc(MIN(size, CHUNK));
        if (!stage)
                return -ENOMEM;
        for (size_t off = 0; off < size; off += CHUNK) {
                size_t n = MIN(size - off, CHUNK);
                int r;

                pattern_fill(p, off, stage, n);
                r = gpuipc_buffer_write(b, off, stage, n);
                if (r < 0) {
                        free(stage);
                        return r;
                }
        }
        free(stage);
        return 0;
}

/* Returns 0 when every byte matches, 1 with *ret_at set when one differs, or an error. */
static int verify(const gpuipc_buffer_t *b, const Pattern *p, size_t *ret_at)
{
        size_t size = gpuipc_buffer_size(b), at;
        uint8_t *stage;

        if (gpuipc_buffer_kind(b) == GPUIPC_KIND_MEMFD) {
                at = pattern_check(p, 0, gpuipc_buffer_ptr(b), size);
                *ret_at = at;
                return at != SIZE_MAX;
        }
        stage = malloc(MIN(size, CHUNK));
        if (!stage)
                return -ENOMEM;
        for (size_t off = 0; off < size; off += CHUNK) {
                size_t n = MIN(size - off, CHUNK);
                int r = gpuipc_buffer_read(b, off, stage, n);

                if (r < 0) {
                        free(stage);
                        return r;
                }
                /* The first difference ends the check: the verdict is already known, and a
                 * large GPU buffer would otherwise be read to its end for nothing. */
                at = pattern_check(p, off, stage, n);
                if (at != SIZE_MAX) {
                        free(stage);
                        *ret_at = off + at;
                        return 1;
                }
        }
        free(stage);
        return 0;
}


/* One line about b: "published", "attached", "drained"; with --json an object with the same
 * facts (extra members added by the caller's fn, e.g. the verification's outcome). */
static void print_buffer(Ctl *ctl, const char *what, const gpuipc_buffer_t *b, void (*extra)(Json *, void *),
                         void *ud)
{
        const char *kind = gpuipc_kind_name(gpuipc_buffer_kind(b));

        if (ctl->json) {
                Json o;
                json_begin(&o, stdout, '{');
                /* The same keys whatever the event (attach adds its verdict's), so that a script
                 * reads publish's stream of lines ("published", then "drained") with one shape. */
                json_kstr(&o, "event", what);
                json_kstr(&o, "name", gpuipc_buffer_name(b));
                json_ku64(&o, "buffer", gpuipc_buffer_id(b));
                json_ku64(&o, "generation", gpuipc_buffer_generation(b));
                json_kstr(&o, "kind", kind);
                json_ku64(&o, "size", gpuipc_buffer_size(b));
                json_kstr_or_null(&o, "device", gpuipc_buffer_device(b));
                if (extra)
                        extra(&o, ud);
                json_end(&o, '}');
                putchar('\n');
        } else {
                printf("%s name=", what);
                text_safe(stdout, gpuipc_buffer_name(b));
                printf(" buffer=%" PRIu64 " generation=%" PRIu64 " kind=%s size=%zu%s%s\n", gpuipc_buffer_id(b),
                       gpuipc_buffer_generation(b), kind, gpuipc_buffer_size(b), gpuipc_buffer_device(b)[0] ? " device="
                                                                                                             : "",
                       gpuipc_buffer_device(b));
        }
        /* publish's lines come one at a time over a long hold: flushed, so that whatever reads
         * the pipe sees "published" when it happens, not at exit. */
        ctl->printed = true;
        fflush(stdout);
}

/* Waits for events until our buffer drained (or we are told to stop); reports broker loss. */
static int hold_until_drained(Ctl *ctl, gpuipc_buffer_t *b)
{
        catch_stop_signals();
        while (!stop_requested) {
                gpuipc_event_t ev;
                int r = gpuipc_next_event(ctl->c, TICK_MS, &ev);

                if (r == GPUIPC_E_TIMEOUT)
                        continue;
                if (r < 0) {
                        /* With no_reconnect unset the library rides out broker restarts, so an
                         * error here means the connection is gone for good. */
                        ctl->printed = false; /* a stream of lines: the error is the last one */
                        return ctl_fail(ctl, "waiting for drained", r);
                }
                /* Ours, not a subscription's copy (subscription 0): only the producer's drained
                 * says every consumer let go. */
                if (ev.type == GPUIPC_EVENT_DRAINED && ev.subscription == 0 && ev.buffer == gpuipc_buffer_id(b)) {
                        print_buffer(ctl, "drained", b, NULL, NULL);
                        return CTL_OK;
                }
        }
        return CTL_OK;
}

/* publish: a test producer. It allocates, fills with a pattern a consumer can verify, publishes,
 * and holds the buffer until killed or drained; filling before publishing means no consumer ever
 * attaches a buffer that is half written. */
int cmd_publish(Ctl *ctl, int argc, char **argv)
{
        gpuipc_publish_options_t po = { .struct_size = sizeof(po) };
        gpuipc_kind_t kind = GPUIPC_KIND_MEMFD;
        Pattern pat = { PATTERN_COUNTER, 0 };
        const char *name = NULL, *size_arg = NULL;
        gpuipc_buffer_t *b = NULL;
        uint64_t size = 0;
        long device = 0, v;
        int c, r;

        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0) {
                switch (c) {
                case CTL_OPT_NAME: name = optarg; break;
                case CTL_OPT_SIZE:
                        size_arg = optarg;
                        if (ctl_parse_size(ctl, "--size", optarg, &size))
                                return CTL_USAGE;
                        break;
                case 'k':
                        if (ctl_parse_kind(ctl, "--kind", optarg, &kind))
                                return CTL_USAGE;
                        break;
                case 'd':
                        if (ctl_parse_int(ctl, "--device", optarg, 0, 1024, &device))
                                return CTL_USAGE;
                        break;
                case 'f':
                        if (parse_pattern(ctl, "--fill", optarg, &pat))
                                return CTL_USAGE;
                        break;
                case 'w': po.writable = 1; break;
                case 'b': po.broker_held = 1; break;
                case CTL_OPT_RETIRE_AFTER:
                        if (ctl_parse_int(ctl, "--retire-after", optarg, 1, UINT32_MAX, &v))
                                return CTL_USAGE;
                        po.retire_after = (unsigned)v;
                        break;
                }
        }
        if (c < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, true, &name)) != CTL_CONTINUE)
                return r;
        if (!size)
                return ctl_usage(ctl, "--size is required");
        /* --size is parsed as 64 bits; on a 32-bit build a size_t would silently cut it. */
        if (size > SIZE_MAX)
                return ctl_usage(ctl, "--size '%s' does not fit in this process's address space", size_arg);
        /* GPUs are probed (loading the CUDA driver, which takes a while) only for the CUDA kinds,
         * whose publish names the device. */
        ctl->reconnect = true; /* it holds the buffer: through a broker restart too */
        r = ctl_connect(ctl, kind != GPUIPC_KIND_MEMFD);
        if (r)
                return r;
        /* The library holds every size to one limit (gpuipc.h: gpuipc_buffer_alloc), a memfd's to the
         * memory available: refused at once, rather than filling memory until the OOM killer or a
         * SIGBUS ends the fill. */
        r = gpuipc_buffer_alloc(ctl->c, kind, (size_t)size, (int)device, &b);
        if (r < 0) {
                char what[128];

                snprintf(what, sizeof(what), "allocating --size '%.64s'", size_arg);
                return ctl_fail(ctl, what, r);
        }
        /* Filled before publish: a consumer may attach the moment the publish reply is sent, and
         * must see the pattern, not zeros. */
        r = fill(b, &pat);
        if (r < 0) {
                gpuipc_buffer_free(ctl->c, b);
                return ctl_fail(ctl, "filling the buffer", r);
        }
        r = gpuipc_publish(ctl->c, b, name, &po);
        if (r < 0) {
                r = ctl_fail(ctl, "publish", r);
                gpuipc_buffer_free(ctl->c, b);
                return r;
        }
        print_buffer(ctl, "published", b, NULL, NULL);
        /* Held until killed, or until someone retires it (or retire_after does) and it drains.
         * Stopped early, gpuipc_buffer_free retires it first: consumers keep what they hold. */
        r = hold_until_drained(ctl, b);
        gpuipc_buffer_free(ctl->c, b);
        return r;
}

/* Keeps the reference for ms milliseconds (ms < 0: until a stop signal), still handling events:
 * reading them is what notices a revoke; a revoke, a lost broker or SIGTERM ends it early. */
static void hold_for(Ctl *ctl, gpuipc_buffer_t *b, long ms)
{
        uint64_t end = ms < 0 ? UINT64_MAX : monotonic_ms() + (uint64_t)ms;

        catch_stop_signals();
        while (!gpuipc_buffer_revoked(b) && !stop_requested) {
                uint64_t now = monotonic_ms();
                gpuipc_event_t ev;
                int r;

                if (now >= end)
                        return;
                /* Capped at TICK_MS, so the int cast cannot overflow and a stop is seen soon. */
                r = gpuipc_next_event(ctl->c, (int)MIN(end - now, (uint64_t)TICK_MS), &ev);
                if (r < 0 && r != GPUIPC_E_TIMEOUT)
                        return;
        }
}

/* What --verify found, for the attach document. */
typedef struct Verdict {
        bool checked;
        int result; /* 0 every byte matched, 1 one differs at `at`, < 0 could not read */
        size_t at;
} Verdict;

/* The attach document's verification fields: absent when nothing was verified (or reading failed,
 * which is reported as the error instead), so "verified": false always means the data differs. */
static void verdict_json(Json *o, void *ud)
{
        const Verdict *v = ud;

        if (!v->checked || v->result < 0)
                return;
        json_kbool(o, "verified", v->result == 0);
        if (v->result > 0)
                json_ku64(o, "differs_at", v->at);
}

/* attach: a test consumer. Attaches (waiting up to --wait for a publish), optionally verifies the
 * pattern, optionally holds, then releases; its exit status says whether the data was right, which
 * is what the integration tests and a person checking a deployment rely on. */
int cmd_attach(Ctl *ctl, int argc, char **argv)
{
        const char *name = NULL;
        Pattern pat;
        Verdict verdict = { 0 };
        long timeout = 0, hold = 0, device = -1;
        gpuipc_buffer_t *b = NULL;
        int c, r, result = CTL_OK;

        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0) {
                switch (c) {
                case CTL_OPT_NAME: name = optarg; break;
                case 'v':
                        if (parse_pattern(ctl, "--verify", optarg, &pat))
                                return CTL_USAGE;
                        verdict.checked = true;
                        break;
                case CTL_OPT_WAIT:
                        if (ctl_parse_int(ctl, "--wait", optarg, -1, INT32_MAX, &timeout))
                                return CTL_USAGE;
                        break;
                case 'H':
                        if (ctl_parse_int(ctl, "--hold", optarg, -1, INT32_MAX, &hold))
                                return CTL_USAGE;
                        break;
                case 'd':
                        if (ctl_parse_int(ctl, "--device", optarg, 0, 1024, &device))
                                return CTL_USAGE;
                        break;
                }
        }
        if (c < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, true, &name)) != CTL_CONTINUE)
                return r;
        /* A consumer declares its GPUs in its hello: the broker refuses a CUDA buffer on a device the
         * consumer cannot see, with a message naming both, instead of letting CUDA fail later. */
        ctl->reconnect = hold != 0; /* held a while: through a broker restart too */
        r = ctl_connect(ctl, true);
        if (r)
                return r;
        if (device >= 0)
                gpuipc_set_device(ctl->c, (int)device);
        r = gpuipc_attach(ctl->c, name, (int)timeout, &b);
        if (r < 0)
                return ctl_fail(ctl, "attach", r);
        if (verdict.checked)
                verdict.result = verify(b, &pat, &verdict.at);
        /* One line (or document) once we know what the data holds, before holding it. */
        print_buffer(ctl, "attached", b, verdict_json, &verdict);
        if (verdict.checked && verdict.result < 0) {
                result = ctl_fail(ctl, "reading the buffer", verdict.result);
        } else if (verdict.checked && verdict.result > 0) {
                fprintf(stderr, "gpuipcctl attach: verify: the data differs from the pattern at byte %zu\n",
                        verdict.at);
                result = CTL_FAILED;
        } else if (verdict.checked && !ctl->json) {
                /* Text only: with --json, "verified": true in the document says it. */
                printf("verified %zu bytes\n", gpuipc_buffer_size(b));
        }
        if (hold != 0)
                hold_for(ctl, b, hold);
        if (gpuipc_buffer_revoked(b)) {
                fprintf(stderr, "gpuipcctl attach: the buffer was revoked: its producer died\n");
                result = CTL_FAILED;
        }
        /* Released even when revoked: the handle (and its mapping) is ours to free either way, and
         * the first failure is the one reported. */
        r = gpuipc_release(ctl->c, b);
        if (r < 0 && result == CTL_OK)
                result = ctl_fail(ctl, "release", r);
        return result;
}

/* retire NAME | --id N. The reply names the id retired: the name may be published again at once,
 * and the id is what the drained event and the listings will show. */
int cmd_retire(Ctl *ctl, int argc, char **argv)
{
        char what[GPUIPC_MAX_NAME + 32];
        gpuipc_buffer_info_t info;
        const char *name = NULL;
        uint64_t id = 0;
        long v;
        int c, r;

        /* retire's one option is --id; ids are positive and read as a signed long, hence
         * INT64_MAX. */
        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0) {
                if (ctl_parse_int(ctl, "--id", optarg, 1, INT64_MAX, &v))
                        return CTL_USAGE;
                id = (uint64_t)v;
        }
        if (c < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, false, &name)) != CTL_CONTINUE)
                return r;
        if (!name == !id)
                return ctl_usage(ctl, "give a NAME or --id N (one of them)");
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        if (!id) {
                /* By name: the live buffer under that name. The broker retires by id (a name may
                 * change hands), so the name is looked up first; a retired one is found by --id. */
                snprintf(what, sizeof(what), "retire '%s'", name);
                r = gpuipc_stat_buffer(ctl->c, name, 0, NULL, 0, &info);
                if (r < 0)
                        return ctl_fail(ctl, what, r);
                id = info.buffer;
        } else {
                snprintf(what, sizeof(what), "retire --id %" PRIu64, id);
        }
        r = gpuipc_retire_id(ctl->c, id);
        if (r < 0)
                return ctl_fail(ctl, what, r);
        if (ctl->json) {
                Json o;
                json_begin(&o, stdout, '{');
                json_kstr(&o, "event", "retired");
                json_ku64(&o, "buffer", id);
                /* Only when the caller gave it: retired by --id, the name is not looked up. */
                if (name)
                        json_kstr(&o, "name", name);
                json_end(&o, '}');
                putchar('\n');
        } else {
                printf("retired buffer %" PRIu64 "\n", id);
        }
        return CTL_OK;
}

/* group NAME --members N: a barrier across processes (scripts start a set of consumers together).
 * --wait defaults to 30 s rather than forever, so a member that never comes fails the script. */
int cmd_group(Ctl *ctl, int argc, char **argv)
{
        const char *name = NULL;
        long members = 0, timeout = 30000;
        int c, r;

        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0) {
                switch (c) {
                case CTL_OPT_NAME: name = optarg; break;
                case 'm':
                        if (ctl_parse_int(ctl, "--members", optarg, 1, 4096, &members))
                                return CTL_USAGE;
                        break;
                case CTL_OPT_WAIT:
                        if (ctl_parse_int(ctl, "--wait", optarg, 1, INT32_MAX, &timeout))
                                return CTL_USAGE;
                        break;
                }
        }
        if (c < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, true, &name)) != CTL_CONTINUE)
                return r;
        if (!members)
                return ctl_usage(ctl, "--members is required");
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        r = gpuipc_group_join(ctl->c, name, (unsigned)members, (int)timeout);
        if (r < 0)
                return ctl_fail(ctl, "group", r);
        if (ctl->json) {
                Json o;
                json_begin(&o, stdout, '{');
                json_kstr(&o, "event", "complete");
                json_kstr(&o, "group", name);
                json_ku64(&o, "members", (uint64_t)members);
                json_end(&o, '}');
                putchar('\n');
        } else {
                printf("group ");
                text_safe(stdout, name);
                printf(" complete (%ld members)\n", members);
        }
        return CTL_OK;
}
