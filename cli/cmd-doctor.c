/* gpuipcctl doctor: what an operator checks first, each with a verdict in plain words. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "ctl.h"
#include "cuda.h"

typedef struct Doctor {
        int problems;
} Doctor;

static void verdict(Doctor *d, bool ok, const char *check, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void verdict(Doctor *d, bool ok, const char *check, const char *fmt, ...)
{
        va_list ap;

        printf("[%s] %-14s ", ok ? " ok " : "FAIL", check);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
        d->problems += !ok;
}

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

        if (stat(path, &st) < 0) {
                verdict(d, false, "socket", "%s: %s. Is the broker running, and is its socket directory mounted "
                        "here (an emptyDir shared by the pod's containers)?", path, strerror(errno));
                return false;
        }
        if (!S_ISSOCK(st.st_mode)) {
                verdict(d, false, "socket", "%s exists but is not a socket", path);
                return false;
        }
        if (access(path, W_OK) < 0) {
                verdict(d, false, "socket", "%s (mode %04o, uid %u, gid %u) is not writable by uid %u gid %u: run in "
                        "the socket's group (fsGroup or supplementalGroups)", path, (unsigned)(st.st_mode & 07777),
                        (unsigned)st.st_uid, (unsigned)st.st_gid, (unsigned)getuid(), (unsigned)getgid());
                return false;
        }
        verdict(d, true, "socket", "%s (mode %04o, gid %u)", path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_gid);
        return true;
}

/* A yes/no fact about a device, as a verdict: "no" is a problem only when it blocks a kind. */
static void device_fact(Doctor *d, int ordinal, const char *check, const CudaFact *f, const char *yes, const char *no)
{
        char label[32];

        snprintf(label, sizeof(label), "gpu%d %s", ordinal, check);
        if (!f->ok)
                verdict(d, false, label, "cannot tell: %s", f->why);
        else
                verdict(d, f->value, label, "%s", f->value ? yes : no);
}

static void check_gpus(Doctor *d)
{
        CudaInfo *info = calloc(1, sizeof(*info)); /* large: per-device facts with their reasons */

        if (!info) {
                verdict(d, false, "gpus", "out of memory");
                return;
        }
        if (cuda_describe(info) < 0 || !info->loaded) {
                verdict(d, true, "gpus", "CUDA is not usable here (%s): memfd buffers only", info->reason);
                free(info);
                return;
        }
        verdict(d, true, "driver", "CUDA driver %d.%d, %d visible device(s)", info->driver_version / 1000,
                (info->driver_version % 1000) / 10, info->n_devices);
        if (info->n_devices == 0)
                verdict(d, false, "gpus", "no GPU is visible: give this container the same ResourceClaim as the "
                        "producer (or set the same visible devices)");
        for (int i = 0; i < info->n_devices; i++) {
                const CudaDeviceInfo *dev = &info->devices[i];
                char label[32];

                snprintf(label, sizeof(label), "gpu%d", dev->ordinal);
                verdict(d, dev->uuid.ok, label, "%s %s%s%s%s", dev->name.ok ? dev->name.text : "?",
                        dev->uuid.ok ? dev->uuid.text : dev->uuid.why,
                        dev->mig.ok && dev->mig.value ? " (MIG instance of " : "",
                        dev->mig.ok && dev->mig.value ? dev->gpu_uuid.text : "",
                        dev->mig.ok && dev->mig.value ? ")" : "");
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
        Doctor d = { 0 };
        uint64_t start;
        int r;

        (void)argc;
        (void)argv;
        if (!check_socket(&d, socket_path(ctl)))
                return CTL_NO_BROKER;
        r = ctl_connect(ctl, true);
        if (r) {
                verdict(&d, false, "broker", "%s", gpuipc_errmsg(NULL));
                return r;
        }
        start = client_now_ms();
        r = gpuipc_ping(ctl->c, ctl->timeout_ms);
        if (r < 0)
                verdict(&d, false, "broker", "no answer to ping: %s", gpuipc_errmsg(ctl->c));
        else
                verdict(&d, true, "broker", "answers (%" PRIu64 " ms round trip), peer id %" PRIu64,
                        client_now_ms() - start, ctl->c->peer_id);

        if (ctl->c->pidns_same)
                verdict(&d, true, "pid-namespace", "same as the broker (%" PRIu64 "): cuda-legacy works with producers "
                        "that share it", ctl->c->pidns);
        else
                verdict(&d, true, "pid-namespace",
                        "%" PRIu64 ", not the broker's: cuda-vmm and memfd work; cuda-legacy needs producer "
                        "and consumer in one PID namespace (shareProcessNamespace: true)", ctl->c->pidns);

        check_gpus(&d);
        printf("%s\n", d.problems ? "problems found" : "all checks passed");
        return d.problems ? CTL_FAILED : CTL_OK;
}
