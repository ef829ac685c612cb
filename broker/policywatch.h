/* Watching the policy file for changes, so that a policy that is replaced on disk takes effect
 * without a SIGHUP: a Kubernetes ConfigMap volume swaps its `..data` symlink, an editor renames a
 * new file into place, `cp` rewrites the file and closes it. One inotify watch on the
 * directory holding the file; the server polls the fd and reloads when an event names the file or
 * `..data`. Set up before the sandbox: afterwards only read() and close() are needed. */
#pragma once

#include <stdbool.h>

typedef struct PolicyWatch PolicyWatch;

/* Watches the directory of policy_path. 0 and *ret; -errno (logged) when inotify or the watch
 * cannot be set up. */
int policy_watch_new(PolicyWatch **ret, const char *policy_path);

/* Closes the inotify fd (which drops the watch). NULL-safe; returns NULL. */
PolicyWatch *policy_watch_free(PolicyWatch *w);

/* The fd to poll for readability (owned by the watch). */
int policy_watch_fd(const PolicyWatch *w);

/* Reads every queued event. 1 when one of them means the policy file may have changed, 0 when
 * none does (or nothing was queued), -errno on a read error. Sets *ret_lost when the directory
 * itself went away or was moved: no further events will come (logged). */
int policy_watch_read(PolicyWatch *w, bool *ret_lost);
