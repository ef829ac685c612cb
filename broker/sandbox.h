/* The broker's in-process seccomp filter, built from seccomp/gpuipc-broker.allow. */
#pragma once

typedef enum SandboxMode {
        SANDBOX_OFF,
        SANDBOX_LOG,     /* everything runs; the kernel logs calls outside the list */
        SANDBOX_ENFORCE, /* a call outside the list is logged by us and kills the process */
} SandboxMode;

int sandbox_mode_from_name(const char *s, SandboxMode *ret);
const char *sandbox_mode_name(SandboxMode m);

/* Loads the filter for the calling process (no threads may exist yet). 0 or -errno (logged).
 * Built without libseccomp, only SANDBOX_OFF succeeds. */
int sandbox_apply(SandboxMode m);
