/* The libFuzzer entry points every target defines (and tests/fuzz/replay.c calls). */
#pragma once

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What abort() needs to report a failing input (raise: gettid, tgkill) while the replay runs under
 * the broker's seccomp filter, which the broker itself never needs. */
#define FUZZ_ABORT_CALLS "gettid", "tgkill"

/* A target whose fixtures make calls of their own defines these (with FUZZ_ABORT_CALLS among
 * them): the replay allows them besides the broker's allow-list (replay.c). */
extern const char *const fuzz_fixture_calls[];
