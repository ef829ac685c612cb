/* Runs a fuzz target's LLVMFuzzerTestOneInput over files, without libFuzzer: this is how the
 * committed corpus and crash reproducers run in the ordinary test suite.
 *
 *     replay-frame DIR_OR_FILE...
 *
 * Directories are read in name order (not recursively); a directory that does not exist is
 * skipped with a note, so optional reproducer folders may be named before they exist. Exits 0
 * when every input ran (a failing input aborts, like under libFuzzer), 1 when there was nothing
 * to run or a file could not be read. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
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
        /* An exact-size heap copy, so a sanitizer catches any read past the input. */
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
        LLVMFuzzerTestOneInput(data, got);
        free(data);
        return 0;
}

static int cmp_names(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Returns the number of inputs run, or -1. */
static long run_dir(const char *dir)
{
        struct dirent *de;
        char **names = NULL;
        size_t n = 0, cap = 0;
        long ran = 0;
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

                if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
                        if (run_file(names[i]) < 0)
                                ran = -1;
                        else if (ran >= 0)
                                ran++;
                }
                free(names[i]);
        }
        free(names);
        return ran;
}

int main(int argc, char **argv)
{
        long total = 0;
        int failed = 0;

        if (LLVMFuzzerInitialize)
                LLVMFuzzerInitialize(&argc, &argv);
        for (int i = 1; i < argc; i++) {
                struct stat st;
                long n;

                if (stat(argv[i], &st) == 0 && S_ISREG(st.st_mode))
                        n = run_file(argv[i]) < 0 ? -1 : 1;
                else
                        n = run_dir(argv[i]);
                if (n < 0)
                        failed = 1;
                else
                        total += n;
        }
        fprintf(stderr, "replay: %ld inputs\n", total);
        if (failed || total == 0)
                return 1;
        return 0;
}
