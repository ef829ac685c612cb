/* gpuipcctl doctor: what an operator checks first, each with a verdict in plain words. Every check
 * runs whatever the others found: without a broker the driver and the GPUs are still worth
 * knowing about. Checks that depend on something missing say so (verdict "??") instead of being
 * left out. What it must never do: change anything it looks at, or say "ok" about what it could
 * not test. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "ctl.h"
#include "json.h"

/* V_NONE: the check does not apply here (the GPU checks without CUDA): neither passed nor failed. */
typedef enum Verdict { V_OK, V_FAIL, V_UNKNOWN, V_NONE } Verdict;

typedef struct Doctor {
        Ctl *ctl;
        int problems;
        bool no_gpu; /* CUDA is not usable: the GPU checks did not run */
        Json json, checks; /* --json: {"checks": [...], ...} */
} Doctor;

static void verdict(Doctor *d, Verdict v, const char *check, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

static void verdict(Doctor *d, Verdict v, const char *check, const char *fmt, ...)
{
        static const char *const text[] = {
                [V_OK] = " ok ", [V_FAIL] = "FAIL", [V_UNKNOWN] = " ?? ", [V_NONE] = " -- ",
        };
        static const char *const name[] = {
                [V_OK] = "ok", [V_FAIL] = "fail", [V_UNKNOWN] = "unknown", [V_NONE] = "none",
        };
        char detail[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(detail, sizeof(detail), fmt, ap);
        va_end(ap);
        d->problems += v == V_FAIL;
        if (d->ctl->json) {
                Json o;
                json_next(&d->checks);
                json_begin(&o, stdout, '{');
                json_kstr(&o, "check", check);
                json_kstr(&o, "verdict", name[v]);
                json_kstr(&o, "detail", detail);
                json_end(&o, '}');
        } else {
                printf("[%s] %-14s %s\n", text[v], check, detail);
        }
}

/* The same choice the library makes at connect (--socket, then $GPUIPC_SOCKET, then the default),
 * restated because check_socket looks at the file before anything connects. */
static const char *socket_path(const Ctl *ctl)
{
        const char *p = ctl->socket;

        if (!p || !*p)
                p = getenv("GPUIPC_SOCKET");
        return p && *p ? p : GPUIPC_DEFAULT_SOCKET;
}

static bool check_socket(Doctor *d, const char *path)
{
        struct stat st;

        /* stat, not lstat: a symlink to the socket (a mounted directory's alias) is what a client
         * follows too. */
        if (stat(path, &st) < 0) {
                verdict(d, V_FAIL, "socket", "%s: %s. Is the broker running, and is its socket directory mounted "
                        "here (an emptyDir shared by the pod's containers)?", path, strerror(errno));
                return false;
        }
        if (!S_ISSOCK(st.st_mode)) {
                verdict(d, V_FAIL, "socket", "%s exists but is not a socket", path);
                return false;
        }
        /* connect(2) on a Unix socket needs write permission on the file: this is the error a
         * client would otherwise meet as a bare EACCES. */
        if (access(path, W_OK) < 0) {
                verdict(d, V_FAIL, "socket", "%s (mode %04o, uid %u, gid %u) is not writable by uid %u gid %u: run "
                        "in the socket's group (fsGroup or supplementalGroups)", path, (unsigned)(st.st_mode & 07777),
                        (unsigned)st.st_uid, (unsigned)st.st_gid, (unsigned)getuid(), (unsigned)getgid());
                return false;
        }
        verdict(d, V_OK, "socket", "%s (mode %04o, gid %u)", path, (unsigned)(st.st_mode & 07777),
                (unsigned)st.st_gid);
        return true;
}

/* Connects and pings. Without a socket file, one attempt: waiting for it would only delay the
 * other checks. */
static bool check_broker(Doctor *d, bool socket_ok)
{
        gpuipc_connection_info_t info;
        gpuipc_options_t o = { .struct_size = sizeof(o) };
        uint64_t start;
        int r;

        /* GPUs are probed at connect (no_gpus unset): the connection then declares them as an
         * application's would, and the broker checks see what an application meets. */
        o.socket_path = d->ctl->socket;
        o.label = "gpuipcctl";
        o.connect_timeout_ms = socket_ok ? d->ctl->timeout_ms : 0;
        r = gpuipc_connect(&d->ctl->c, &o);
        if (r < 0) {
                d->ctl->c = NULL;
                verdict(d, V_FAIL, "broker", "[%s] %s", gpuipc_err_name(r), gpuipc_errmsg(NULL));
                return false;
        }
        /* Timed from after the connect: this is the broker's responsiveness, not the CUDA probe's
         * or the hello's cost (ping times both). */
        start = monotonic_ms();
        r = gpuipc_ping(d->ctl->c, d->ctl->timeout_ms);
        if (r < 0) {
                verdict(d, V_FAIL, "broker", "no answer to ping: [%s] %s", gpuipc_err_name(r),
                        gpuipc_errmsg(d->ctl->c));
                return false;
        }
        gpuipc_connection_info(d->ctl->c, &info);
        verdict(d, V_OK, "broker", "answers (%" PRIu64 " ms round trip), peer id %" PRIu64, monotonic_ms() - start,
                info.peer);
        return true;
}

static void check_pidns(Doctor *d, bool connected)
{
        gpuipc_connection_info_t info;
        struct stat st;

        if (!connected) {
                verdict(d, V_UNKNOWN, "pid-namespace", "%" PRIu64 " here; cannot compare it with the broker's without "
                        "a broker", stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0);
                return;
        }
        gpuipc_connection_info(d->ctl->c, &info);
        /* Either way ok: another PID namespace is a deployment choice that rules out one kind, not a
         * fault; the verdict's text says which kinds work. */
        if (info.pidns_same)
                verdict(d, V_OK, "pid-namespace", "same as the broker (%" PRIu64 "): cuda-legacy works with producers "
                        "that share it", info.pidns);
        else
                verdict(d, V_OK, "pid-namespace", "%" PRIu64 ", not the broker's: cuda-vmm and memfd work; cuda-legacy "
                        "needs producer and consumer in one PID namespace (shareProcessNamespace: true)", info.pidns);
}

/* A yes/no fact about a device, as a verdict: "no" is a problem only when it blocks a kind. */
static void device_fact(Doctor *d, int ordinal, const char *check, const gpuipc_cuda_fact_t *f, const char *yes,
                        const char *no)
{
        char label[32];

        snprintf(label, sizeof(label), "gpu%d %s", ordinal, check);
        if (!f->ok)
                verdict(d, V_UNKNOWN, label, "cannot tell: %s", f->why);
        else
                verdict(d, f->value ? V_OK : V_FAIL, label, "%s", f->value ? yes : no);
}

static void check_gpus(Doctor *d)
{
        gpuipc_cuda_info_t *info = calloc(1, sizeof(*info)); /* large: per-device facts with their reasons */

        if (!info) {
                verdict(d, V_UNKNOWN, "gpus", "out of memory");
                return;
        }
        if (gpuipc_cuda_describe(info) < 0 || !info->loaded) {
                /* Not ok: nothing about a GPU was checked. Not a failure either: memfd works. */
                verdict(d, V_NONE, "gpus", "no GPU checked: CUDA is not usable here (%s); memfd buffers work, "
                        "cuda-vmm and cuda-legacy fail with no-cuda", info->reason);
                d->no_gpu = true;
                free(info);
                return;
        }
        verdict(d, V_OK, "driver", "CUDA driver %d.%d, %d visible device(s)", info->driver_version / 1000,
                (info->driver_version % 1000) / 10, info->n_devices);
        if (info->n_devices == 0)
                verdict(d, V_FAIL, "gpus", "no GPU is visible: give this container the same ResourceClaim as the "
                        "producer (or set the same visible devices)");
        for (int i = 0; i < info->n_devices; i++) {
                const gpuipc_cuda_device_t *dev = &info->devices[i];
                bool mig = dev->mig.ok && dev->mig.value;
                char label[32];

                snprintf(label, sizeof(label), "gpu%d", dev->ordinal);
                verdict(d, dev->uuid.ok ? V_OK : V_FAIL, label, "%s %s%s%s%s", dev->name.ok ? dev->name.text : "?",
                        dev->uuid.ok ? dev->uuid.text : dev->uuid.why, mig ? " (MIG instance of " : "",
                        mig ? dev->gpu_uuid.text : "", mig ? ")" : "");
                device_fact(d, dev->ordinal, "vmm", &dev->vmm, "virtual memory management: cuda-vmm possible",
                            "no virtual memory management: cuda-vmm impossible, use cuda-legacy or memfd");
                device_fact(d, dev->ordinal, "posix-fd", &dev->posix_fd, "exports memory as POSIX fds: cuda-vmm "
                            "crosses containers", "cannot export POSIX fds: cuda-vmm impossible on this device");
                device_fact(d, dev->ordinal, "fences", &dev->mem_ops_64, "64-bit stream memory operations: gpuipc "
                            "fences work", "no 64-bit stream memory operations: gpuipc fences cannot be used");
        }
        free(info);
}

int cmd_doctor(Ctl *ctl, int argc, char **argv)
{
        Doctor d = { .ctl = ctl };
        const char *none = NULL;
        bool socket_ok, broker_ok;
        int c, r;

        /* --help is the only option. */
        if ((c = ctl_next_option(ctl, argc, argv, &r)) < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, false, &none)) != CTL_CONTINUE)
                return r;
        if (ctl->json) {
                json_begin(&d.json, stdout, '{');
                json_key(&d.json, "checks");
                json_begin(&d.checks, stdout, '[');
        }
        socket_ok = check_socket(&d, socket_path(ctl));
        broker_ok = check_broker(&d, socket_ok);
        check_pidns(&d, broker_ok);
        check_gpus(&d);
        if (ctl->json) {
                json_end(&d.checks, ']');
                json_ku64(&d.json, "problems", (uint64_t)d.problems);
                json_kbool(&d.json, "broker", broker_ok);
                json_kbool(&d.json, "gpus_checked", !d.no_gpu);
                json_end(&d.json, '}');
                putchar('\n');
        } else if (d.problems) {
                printf("problems found\n");
        } else if (d.no_gpu) {
                printf("no check failed; no GPU was checked (memfd buffers only on this host)\n");
        } else {
                printf("all checks passed\n");
        }
        /* No broker outranks other problems: exit 3 is what a probe or an init container waits on. */
        if (!broker_ok)
                return CTL_NO_BROKER;
        return d.problems ? CTL_FAILED : CTL_OK;
}
