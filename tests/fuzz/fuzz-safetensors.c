/* Fuzz target: safetensors_header_len and safetensors_parse (cli/safetensors.c), what `gpuipcctl
 * weights load` believes of a checkpoint's header. The input is a whole file as a hostile writer
 * may leave it. A header that passes must describe only what the file holds: every tensor's range
 * within the data, no two overlapping, each as long as its shape and dtype say, no name twice;
 * a refusal must say at which byte; parsing the same bytes again gives the same answer. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fuzz.h"
#include "safetensors.h"

/* glibc's qsort (the parser sorts its tensors) asks sysinfo how much memory there is past 1 KiB. */
const char *const fuzz_fixture_calls[] = { FUZZ_ABORT_CALLS, "sysinfo", NULL };

static void check_header(const SafetensorsHeader *h, uint64_t size)
{
        CHECK(h->data_start + h->data_size == size);
        for (size_t i = 0; i < h->n; i++) {
                const SafetensorsTensor *t = &h->tensors[i];
                uint64_t n = 1;

                CHECK(t->begin <= t->end && t->end <= h->data_size);
                CHECK(t->ndim <= SAFETENSORS_MAX_NDIM && strlen(t->name) <= SAFETENSORS_MAX_NAME);
                for (uint32_t d = 0; d < t->ndim; d++)
                        n *= t->shape[d];
                CHECK(n * safetensors_dtype_bits(t->dtype) / 8 == t->end - t->begin);
                /* quadratic, but the inputs the fuzzer makes hold few tensors */
                for (size_t j = 0; j < i && j < 256; j++) {
                        const SafetensorsTensor *u = &h->tensors[j];
                        CHECK(strcmp(t->name, u->name) != 0);
                        CHECK(t->end <= u->begin || u->end <= t->begin || t->begin == t->end || u->begin == u->end);
                }
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        SafetensorsHeader *h = NULL, *again = NULL;
        char err[512] = "", err2[512] = "";
        uint64_t len;
        int r;

        if (size < 8)
                return 0;
        r = safetensors_header_len(data, size, &len, err, sizeof(err));
        CHECK(r == 0 || r == -EBADMSG);
        if (r < 0) {
                CHECK(strncmp(err, "byte 0: ", 8) == 0);
                return 0;
        }
        CHECK(len <= size - 8 && len <= SAFETENSORS_MAX_HEADER);
        r = safetensors_parse((const char *)data + 8, len, size, &h, err, sizeof(err));
        CHECK(r == 0 || r == -EBADMSG || r == -ENOMEM);
        CHECK(safetensors_parse((const char *)data + 8, len, size, &again, err2, sizeof(err2)) == r);
        if (r == -EBADMSG) {
                CHECK(strncmp(err, "byte ", 5) == 0 && strcmp(err, err2) == 0);
                return 0;
        }
        if (r < 0)
                return 0;
        check_header(h, size);
        CHECK(again->n == h->n);
        safetensors_header_free(h);
        safetensors_header_free(again);
        return 0;
}
