/* The broker's in-process seccomp filter, built from seccomp/gpuipc-broker.allow. */
#pragma once

#include <stdint.h>

typedef enum SandboxMode {
        SANDBOX_OFF,
        SANDBOX_LOG,     /* everything runs; the kernel logs calls outside the list */
        SANDBOX_ENFORCE, /* a call outside the list fails with ENOSYS and is logged by us; one of the
                          * list's [kill] section kills the process (sandbox.c says why) */
} SandboxMode;

int sandbox_mode_from_name(const char *s, SandboxMode *ret);
const char *sandbox_mode_name(SandboxMode m);

/* Loads the filter for the calling process (no threads may exist yet). 0 or -errno (logged).
 * Built without libseccomp, only SANDBOX_OFF succeeds. */
int sandbox_apply(SandboxMode m);

/* The same, with the NULL-terminated names in also_allowed allowed too: for tests that run the
 * broker's code under its filter and need calls of their own (the fuzz replays' fixtures). */
int sandbox_apply_with(SandboxMode m, const char *const *also_allowed);

/* What the broker is serving, named in the log line of a refused call: op is a static string (an
 * operation's name), kept until sandbox_clear_context. */
void sandbox_set_context(const char *op, uint64_t peer, uint64_t request);
void sandbox_clear_context(void);

/* Calls refused with ENOSYS since the filter was loaded (the stats' seccomp_refused). */
uint64_t sandbox_refused_total(void);
