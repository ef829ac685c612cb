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
                verdict(&d, true, "pid-namespace", "%" PRIu64 ", not the broker's: cuda-vmm and memfd work; cuda-legacy "
                        "needs producer and consumer in one PID namespace (shareProcessNamespace: true)", ctl->c->pidns);

        if (ctl->c->n_gpus == 0)
                verdict(&d, true, "gpus", "none visible to this process: memfd buffers only");
        for (uint32_t i = 0; i < ctl->c->n_gpus; i++)
                verdict(&d, true, "gpu", "%u: %s", i, ctl->c->gpus[i]);
        printf("%s\n", d.problems ? "problems found" : "all checks passed");
        return d.problems ? CTL_FAILED : CTL_OK;
}
