/* Runs a fuzz target's LLVMFuzzerTestOneInput over files, without libFuzzer: this is how the
 * committed corpus and crash reproducers run in the ordinary test suite.
 *
 *     replay-frame DIR_OR_FILE...
 *
 * Directories are read in name order (not recursively); a directory that does not exist is
 * skipped with a note, so optional reproducer folders may be named before they exist. Exits 0
 * when every input ran (a failing input aborts, like under libFuzzer), 1 when there was nothing
 * to run, a file could not be read, or (under GPUIPC_REPLAY_SECCOMP=enforce) the broker's filter
 * refused a call. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "fuzz.h"
#include "log.h"
#include "sandbox.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
extern const char *const fuzz_fixture_calls[] __attribute__((weak));

/* Every input, read before anything runs: the replay may confine itself between reading and
 * running (below), and reading files is not what the code under test does. */
typedef struct Input {
        char *path;
        uint8_t *data; /* an exact-size heap copy, so a sanitizer catches any read past the input */
        size_t len;
} Input;

typedef struct Inputs {
        Input *v;
        size_t n, cap;
} Inputs;

static int load_file(Inputs *in, const char *path)
{
        struct stat st;
        uint8_t *data;
        size_t got;
        FILE *f;

        f = fopen(path, "rb");
        if (!f || fstat(fileno(f), &st) < 0) {
                fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
                if (f)
                        fclose(f);
                return -1;
        }
        data = malloc(st.st_size ? (size_t)st.st_size : 1);
        if (!data) {
                fclose(f);
                return -1;
        }
        got = fread(data, 1, (size_t)st.st_size, f);
        fclose(f);
        if (got != (size_t)st.st_size) {
                fprintf(stderr, "replay: %s: short read\n", path);
                free(data);
                return -1;
        }
        if (in->n == in->cap) {
                Input *v = realloc(in->v, (in->cap = in->cap ? in->cap * 2 : 256) * sizeof(*v));
                if (!v) {
                        free(data);
                        return -1;
                }
                in->v = v;
        }
        in->v[in->n++] = (Input){ strdup(path), data, got };
        return 0;
}

static int cmp_names(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads the regular files of dir in name order; -1 when one could not be read. */
static int load_dir(Inputs *in, const char *dir)
{
        struct dirent *de;
        char **names = NULL;
        size_t n = 0, cap = 0;
        int r = 0;
        DIR *d;

        d = opendir(dir);
        if (!d) {
                if (errno == ENOENT) {
                        fprintf(stderr, "replay: %s: absent, skipped\n", dir);
                        return 0;
                }
                fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
                return -1;
        }
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                if (n == cap) {
                        char **v = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof(*v));
                        if (!v)
                                break;
                        names = v;
                }
                names[n] = malloc(strlen(dir) + strlen(de->d_name) + 2);
                if (!names[n])
                        break;
                sprintf(names[n], "%s/%s", dir, de->d_name);
                n++;
        }
        closedir(d);
        qsort(names, n, sizeof(*names), cmp_names);
        for (size_t i = 0; i < n; i++) {
                struct stat st;

                if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode) && load_file(in, names[i]) < 0)
                        r = -1;
                free(names[i]);
        }
        free(names);
        return r;
}

/* GPUIPC_REPLAY_SECCOMP=enforce: the inputs run under the broker's own run-time filter, so a libc
 * path of the broker's code that the allow-list misses is found here (docs/security.md "The filter
 * fails safe"): the filter refuses it with ENOSYS and logs it, and the replay fails. */
static const char *const abort_calls[] = { FUZZ_ABORT_CALLS, NULL };

static int confine(void)
{
        const char *mode = getenv("GPUIPC_REPLAY_SECCOMP");

        if (!mode || strcmp(mode, "enforce"))
                return 0;
        if (!HAVE_SECCOMP) {
                fprintf(stderr, "replay: built without libseccomp: inputs run unconfined\n");
                return 0;
        }
        log_setup(false, LOG_WARN);
        return sandbox_apply_with(SANDBOX_ENFORCE, fuzz_fixture_calls ? fuzz_fixture_calls : abort_calls);
}

int main(int argc, char **argv)
{
        Inputs in = { 0 };
        int failed = 0;

        if (LLVMFuzzerInitialize)
                LLVMFuzzerInitialize(&argc, &argv);
        for (int i = 1; i < argc; i++) {
                struct stat st;

                if (stat(argv[i], &st) == 0 && S_ISREG(st.st_mode))
                        failed |= load_file(&in, argv[i]) < 0;
                else
                        failed |= load_dir(&in, argv[i]) < 0;
        }
        if (confine() < 0) {
                fprintf(stderr, "replay: cannot load the broker's seccomp filter\n");
                return 1;
        }
        for (size_t i = 0; i < in.n; i++)
                LLVMFuzzerTestOneInput(in.v[i].data, in.v[i].len);
        fprintf(stderr, "replay: %zu inputs\n", in.n);
        if (sandbox_refused_total()) {
                fprintf(stderr, "replay: the broker's filter refused %llu calls (logged above)\n",
                        (unsigned long long)sandbox_refused_total());
                return 1;
        }
        for (size_t i = 0; i < in.n; i++) {
                free(in.v[i].path);
                free(in.v[i].data);
        }
        free(in.v);
        if (failed || in.n == 0)
                return 1;
        return 0;
}
