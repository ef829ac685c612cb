/* Subcommands that move data: publish, attach, retire, and group. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "json.h"
#include "pattern.h"

#define CHUNK (16u << 20) /* staging for the CUDA kinds */
#define TICK_MS 200         /* how often a holding command checks for SIGTERM */

/* Set by SIGTERM/SIGINT. A holding command must act on them itself: as a container's pid 1 it
 * would otherwise ignore SIGTERM, and the kubelet would have to wait for the grace period. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
        (void)sig;
        stop_requested = 1;
}

static void catch_stop_signals(void)
{
        struct sigaction sa = { .sa_handler = on_stop_signal };

        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
}

static int parse_kind(const char *s, gpuipc_kind_t *ret)
{
        ProtoKind k = proto_kind_from_name(s);

        if (k == PROTO_KIND_NONE)
                return -EINVAL;
        *ret = (gpuipc_kind_t)k;
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

static void print_buffer(Ctl *ctl, const char *what, const gpuipc_buffer_t *b)
{
        const char *kind = proto_kind_name((ProtoKind)gpuipc_buffer_kind(b));

        if (ctl->json) {
                Json o;
                json_begin(&o, stdout, '{');
                json_key(&o, "event");
                json_str(&o, what, strlen(what));
                json_key(&o, "name");
                json_str(&o, gpuipc_buffer_name(b), strlen(gpuipc_buffer_name(b)));
                json_key(&o, "buffer");
                json_u64(&o, gpuipc_buffer_id(b));
                json_key(&o, "generation");
                json_u64(&o, gpuipc_buffer_generation(b));
                json_key(&o, "kind");
                json_str(&o, kind, strlen(kind));
                json_key(&o, "size");
                json_u64(&o, gpuipc_buffer_size(b));
                json_key(&o, "device");
                json_str(&o, gpuipc_buffer_device(b), strlen(gpuipc_buffer_device(b)));
                json_end(&o, '}');
                putchar('\n');
        } else {
                printf("%s name=%s buffer=%" PRIu64 " generation=%" PRIu64 " kind=%s size=%zu%s%s\n", what,
                       gpuipc_buffer_name(b), gpuipc_buffer_id(b), gpuipc_buffer_generation(b), kind,
                       gpuipc_buffer_size(b), gpuipc_buffer_device(b)[0] ? " device=" : "", gpuipc_buffer_device(b));
        }
        fflush(stdout);
}

/* Waits for events until our buffer drained (or we are told to stop); reports broker loss. */
static int hold_until_drained(Ctl *ctl, gpuipc_buffer_t *b)
{
        catch_stop_signals();
        while (!stop_requested) {
                gpuipc_event_t ev;
                int r = gpuipc_next_event(ctl->c, &ev, TICK_MS);

                if (r == GPUIPC_E_TIMEOUT)
                        continue;
                if (r < 0)
                        return ctl_fail(ctl, "waiting for drained", r);
                if (ev.type == GPUIPC_EVENT_DRAINED && ev.subscription == 0 && ev.buffer == gpuipc_buffer_id(b)) {
                        print_buffer(ctl, "drained", b);
                        return CTL_OK;
                }
        }
        return CTL_OK;
}

int cmd_publish(Ctl *ctl, int argc, char **argv)
{
        static const struct option longopts[] = {
                { "name", required_argument, NULL, 'n' },
                { "size", required_argument, NULL, 's' },
                { "kind", required_argument, NULL, 'k' },
                { "device", required_argument, NULL, 'd' },
                { "fill", required_argument, NULL, 'f' },
                { "writable", no_argument, NULL, 'w' },
                { "broker-held", no_argument, NULL, 'b' },
                { "retire-after", required_argument, NULL, 'r' },
                {}
        };
        gpuipc_publish_options_t po = { 0 };
        gpuipc_kind_t kind = GPUIPC_KIND_MEMFD;
        Pattern pat = { PATTERN_COUNTER, 0 };
        const char *name = NULL;
        gpuipc_buffer_t *b = NULL;
        uint64_t size = 0;
        long device = 0, v;
        int c, r;

        while ((c = getopt_long(argc, argv, "n:s:k:d:f:wbr:", longopts, NULL)) >= 0) {
                switch (c) {
                case 'n': name = optarg; break;
                case 's':
                        if (ctl_parse_size(optarg, &size) < 0)
                                goto usage;
                        break;
                case 'k':
                        if (parse_kind(optarg, &kind) < 0)
                                goto usage;
                        break;
                case 'd':
                        if (ctl_parse_int(optarg, 0, 1024, &device) < 0)
                                goto usage;
                        break;
                case 'f':
                        if (pattern_parse(optarg, &pat) < 0)
                                goto usage;
                        break;
                case 'w': po.writable = 1; break;
                case 'b': po.broker_held = 1; break;
                case 'r':
                        if (ctl_parse_int(optarg, 1, UINT32_MAX, &v) < 0)
                                goto usage;
                        po.retire_after = (unsigned)v;
                        break;
                default: goto usage;
                }
        }
        if (!name || !size || optind < argc)
                goto usage;
        r = ctl_connect(ctl, kind != GPUIPC_KIND_MEMFD);
        if (r)
                return r;
        r = gpuipc_buffer_alloc(ctl->c, kind, size, (int)device, &b);
        if (r < 0)
                return ctl_fail(ctl, "allocating the buffer", r);
        r = fill(b, &pat);
        if (r < 0)
                return ctl_fail(ctl, "filling the buffer", r);
        r = gpuipc_publish(ctl->c, b, name, &po);
        if (r < 0)
                return ctl_fail(ctl, "publish", r);
        print_buffer(ctl, "published", b);
        /* Held until killed, or until someone retires it (or retire_after does) and it drains. */
        r = hold_until_drained(ctl, b);
        gpuipc_buffer_free(ctl->c, b);
        return r;
usage:
        fprintf(stderr, "usage: gpuipcctl publish --name N --size BYTES [--kind memfd|cuda-vmm|cuda-legacy] "
                        "[--device N] [--fill PATTERN] [--writable] [--broker-held] [--retire-after N]\n");
        return CTL_USAGE;
}

/* Keeps the reference for ms milliseconds, still handling events: a revoke, a lost broker or
 * SIGTERM ends it early. */
/* Holds the buffer for ms milliseconds (ms < 0: until a stop signal), or until it is revoked. */
static void hold_for(Ctl *ctl, gpuipc_buffer_t *b, long ms)
{
        uint64_t end = ms < 0 ? UINT64_MAX : client_now_ms() + (uint64_t)ms;

        catch_stop_signals();
        while (!gpuipc_buffer_revoked(b) && !stop_requested) {
                uint64_t now = client_now_ms();
                gpuipc_event_t ev;
                int r;

                if (now >= end)
                        return;
                r = gpuipc_next_event(ctl->c, &ev, (int)MIN(end - now, (uint64_t)TICK_MS));
                if (r < 0 && r != GPUIPC_E_TIMEOUT)
                        return;
        }
}

int cmd_attach(Ctl *ctl, int argc, char **argv)
{
        static const struct option longopts[] = {
                { "name", required_argument, NULL, 'n' },
                { "verify", required_argument, NULL, 'v' },
                { "timeout", required_argument, NULL, 't' },
                { "hold", required_argument, NULL, 'H' },
                { "device", required_argument, NULL, 'd' },
                {}
        };
        const char *name = NULL;
        Pattern pat;
        bool check = false;
        long timeout = 0, hold = 0, device = -1;
        gpuipc_buffer_t *b = NULL;
        size_t at = 0;
        int c, r, result = CTL_OK;

        while ((c = getopt_long(argc, argv, "n:v:t:H:d:", longopts, NULL)) >= 0) {
                switch (c) {
                case 'n': name = optarg; break;
                case 'v':
                        if (pattern_parse(optarg, &pat) < 0)
                                goto usage;
                        check = true;
                        break;
                case 't':
                        if (ctl_parse_int(optarg, -1, INT32_MAX, &timeout) < 0)
                                goto usage;
                        break;
                case 'H':
                        if (ctl_parse_int(optarg, -1, INT32_MAX, &hold) < 0)
                                goto usage;
                        break;
                case 'd':
                        if (ctl_parse_int(optarg, 0, 1024, &device) < 0)
                                goto usage;
                        break;
                default: goto usage;
                }
        }
        if (!name || optind < argc)
                goto usage;
        r = ctl_connect(ctl, true);
        if (r)
                return r;
        if (device >= 0)
                gpuipc_set_device(ctl->c, (int)device);
        r = gpuipc_attach(ctl->c, name, (int)timeout, &b);
        if (r < 0)
                return ctl_fail(ctl, "attach", r);
        print_buffer(ctl, "attached", b);
        if (check) {
                r = verify(b, &pat, &at);
                if (r < 0) {
                        result = ctl_fail(ctl, "reading the buffer", r);
                } else if (r > 0) {
                        fprintf(stderr, "gpuipcctl: verify: the data differs from the pattern at byte %zu\n", at);
                        result = CTL_FAILED;
                } else if (!ctl->json) {
                        printf("verified %zu bytes\n", gpuipc_buffer_size(b));
                }
        }
        if (hold != 0)
                hold_for(ctl, b, hold);
        if (gpuipc_buffer_revoked(b)) {
                fprintf(stderr, "gpuipcctl: the buffer was revoked: its producer died\n");
                result = CTL_FAILED;
        }
        r = gpuipc_release(ctl->c, b);
        if (r < 0 && result == CTL_OK)
                result = ctl_fail(ctl, "release", r);
        return result;
usage:
        fprintf(stderr, "usage: gpuipcctl attach --name N [--verify PATTERN] [--timeout MS] [--hold MS|-1] "
                        "[--device N]\n");
        return CTL_USAGE;
}

int cmd_retire(Ctl *ctl, int argc, char **argv)
{
        static const struct option longopts[] = { { "id", required_argument, NULL, 'i' }, {} };
        ProtoMsg req = { 0 };
        Frame f = { .fd = -1 };
        uint64_t id = 0;
        long v;
        int c, r;

        while ((c = getopt_long(argc, argv, "i:", longopts, NULL)) >= 0) {
                if (c != 'i' || ctl_parse_int(optarg, 1, INT64_MAX, &v) < 0)
                        goto usage;
                id = (uint64_t)v;
        }
        if ((optind < argc) == (id != 0) || optind + 1 < argc)
                goto usage;
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        if (!id) {
                /* By name: the live buffer under that name. */
                req.op = PROTO_OP_STAT;
                req.name = proto_str(argv[optind]);
                req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME);
                r = client_request(ctl->c, &req, -1, ctl->timeout_ms, &f);
                if (r < 0)
                        return ctl_fail(ctl, "stat", r);
                id = f.msg.buffer;
                frame_free(&f);
        }
        req = (ProtoMsg){ .op = PROTO_OP_RETIRE, .buffer = id, .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER) };
        r = client_request(ctl->c, &req, -1, ctl->timeout_ms, &f);
        if (r < 0)
                return ctl_fail(ctl, "retire", r);
        frame_free(&f);
        if (!ctl->json)
                printf("retired buffer %" PRIu64 "\n", id);
        return CTL_OK;
usage:
        fprintf(stderr, "usage: gpuipcctl retire NAME | --id N\n");
        return CTL_USAGE;
}

int cmd_group(Ctl *ctl, int argc, char **argv)
{
        static const struct option longopts[] = {
                { "name", required_argument, NULL, 'n' },
                { "members", required_argument, NULL, 'm' },
                { "timeout", required_argument, NULL, 't' },
                {}
        };
        const char *name = NULL;
        long members = 0, timeout = 30000;
        int c, r;

        while ((c = getopt_long(argc, argv, "n:m:t:", longopts, NULL)) >= 0) {
                switch (c) {
                case 'n': name = optarg; break;
                case 'm':
                        if (ctl_parse_int(optarg, 1, 4096, &members) < 0)
                                goto usage;
                        break;
                case 't':
                        if (ctl_parse_int(optarg, 1, INT32_MAX, &timeout) < 0)
                                goto usage;
                        break;
                default: goto usage;
                }
        }
        if (!name || !members || optind < argc)
                goto usage;
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        r = gpuipc_group_join(ctl->c, name, (unsigned)members, (int)timeout);
        if (r < 0)
                return ctl_fail(ctl, "group", r);
        printf("group %s complete (%ld members)\n", name, members);
        return CTL_OK;
usage:
        fprintf(stderr, "usage: gpuipcctl group --name G --members N [--timeout MS]\n");
        return CTL_USAGE;
}
