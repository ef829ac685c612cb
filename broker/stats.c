/* The broker's own counters: see stats.h. */
#include "stats.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "macro.h"
#include "sandbox.h"

/* Histogram bounds in microseconds. A request usually takes tens of microseconds on a busy
 * 2-core machine; forgetting a peer with 10,000 references about 1.5 ms. */
static const uint32_t request_bounds_us[] = { 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 100000 };
static const uint32_t cleanup_bounds_us[] = { 10, 50, 100, 500, 1000, 5000, 10000, 50000, 100000, 1000000 };

void stats_init(ServerStats *st, uint64_t started_ms)
{
        *st = (ServerStats){ .started_ms = started_ms };
        histogram_init(&st->request_us, request_bounds_us, ARRAY_SIZE(request_bounds_us));
        histogram_init(&st->peer_cleanup_us, cleanup_bounds_us, ARRAY_SIZE(cleanup_bounds_us));
}

static uint64_t count_open_fds(void)
{
        DIR *d = opendir("/proc/self/fd");
        uint64_t n = 0;
        struct dirent *e;

        if (!d)
                return 0;
        /* Names are fd numbers, so only "." and ".." start with a dot. */
        while ((e = readdir(d)))
                n += e->d_name[0] != '.';
        closedir(d);
        return n > 0 ? n - 1 : 0; /* minus the directory's own fd */
}

/* The soft RLIMIT_NOFILE, from /proc/self/limits: the filter allows reading /proc but not
 * prlimit64 once the broker runs, and reading it each time shows a limit raised from outside
 * (prlimit --pid). 0 when unknown or unlimited. */
static uint64_t read_fd_limit(void)
{
        static const char key[] = "Max open files";
        unsigned long long soft = 0;
        char line[256];
        FILE *f = fopen("/proc/self/limits", "re");

        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, key, sizeof(key) - 1) == 0 && sscanf(line + sizeof(key) - 1, "%llu", &soft) != 1)
                        soft = 0; /* "unlimited" */
        fclose(f);
        return soft;
}

void stats_refresh(ServerStats *st, uint64_t now_ms)
{
        st->seccomp_refused = sandbox_refused_total();
        if (st->fds_counted_ms && now_ms - st->fds_counted_ms < 1000)
                return;
        st->open_fds = count_open_fds();
        st->open_fds_limit = read_fd_limit();
        st->fds_counted_ms = now_ms ? now_ms : 1;
}

void stats_peer_cleanup(ServerStats *st, uint64_t us, uint32_t refs)
{
        histogram_record(&st->peer_cleanup_us, us);
        st->peer_cleanup_us_last = us;
        st->peer_cleanup_refs_last = refs;
        st->peer_cleanup_us_max = MAX(st->peer_cleanup_us_max, us);
}
