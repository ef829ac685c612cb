/* Confining the metrics exporter, the one process of gpuipc that listens on the network, once it
 * listens: no new privileges; Landlock (no file may be opened, created or executed, no TCP port
 * bound or connected); a seccomp filter from seccomp/gpuipcctl-metrics.allow, under which a call
 * outside the list fails with ENOSYS and one log line naming it (the exporter goes on: a missed
 * libc path costs one scrape, not the exporter), and a call that would give new powers ([kill])
 * kills the process. Like the broker's (broker/landlock.c, broker/sandbox.c), apart from gpuipcctl's
 * other commands, which stay unconfined. */
#pragma once

/* Confines the calling process; call it while it has a single thread (the others started later
 * inherit it all). 0, or a negative errno with *why naming what failed. A kernel without Landlock
 * is not an error (the filter still confines it; a warning says so); a build without libseccomp
 * is (-EOPNOTSUPP). */
int exporter_confine(const char **why);
