/* The libFuzzer entry points every target defines (and tests/fuzz/replay.c calls). */
#pragma once

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
