/* gpuipcctl audit: the broker's audit trail (docs/operations.md, "The audit trail") out of its log
 * stream. The broker serves the trail no other way than its log (docs/design.md, "Observability"), so
 * this reads what the log goes to: a pipe (kubectl logs -f, journalctl -o cat -f) or a file, which
 * --follow reads on as it grows, the way tail -f does.
 *
 * What it must never do: let one line cost more than LINE_MAX bytes of memory, or let a line that is
 * not a record (another log line, text that is not JSON, a line cut short) stop the stream. Such
 * lines are skipped and counted, and the counts go to stderr at the end. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "jsonread.h"
#include "text.h"

/* The broker's lines are about 250 bytes (log.c keeps each under a few KiB); a longer one is not
 * the broker's, and is skipped rather than buffered without end. */
#define LINE_MAX_BYTES (64 * 1024)
#define MAX_EVENTS 16
/* How often --follow looks for more in a file that stopped growing: often enough for a person
 * watching, rarely enough to cost nothing. */
#define FOLLOW_POLL_NS (200 * 1000 * 1000L)

typedef struct AuditArgs {
        const char *file;      /* NULL or "-": stdin */
        const char *events[MAX_EVENTS];
        int n_events;
        const char *result;
        bool uid_given;
        uint64_t uid;
        bool follow;
} AuditArgs;

/* One record's fields; a field the record lacks has has_* false or an empty string. */
enum { F_PEER, F_UID, F_PID, F_PIDNS, F_BYTES, F_BUFFER, F_REFS, F_BUFFERS, F_COUNT, N_NUMBERS };
static const char *const number_keys[N_NUMBERS] = { "peer", "uid", "pid", "pidns", "bytes",
                                                    "buffer", "refs", "buffers", "count" };

typedef struct AuditRecord {
        char ts[64], msg[64], event[64], result[64], kind[64];
        char name[1024];
        uint64_t n[N_NUMBERS];
        bool has[N_NUMBERS];
} AuditRecord;

typedef struct AuditCounts {
        uint64_t malformed, overlong;
        bool header_printed;
} AuditCounts;

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
        (void)sig;
        stop = 1;
}

static int parse_args(Ctl *ctl, int argc, char **argv, AuditArgs *a)
{
        long v;
        int c, r;

        *a = (AuditArgs){ 0 };
        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0) {
                switch (c) {
                case CTL_OPT_EVENT:
                        if (a->n_events == MAX_EVENTS)
                                return ctl_usage(ctl, "--event: at most %d", MAX_EVENTS);
                        a->events[a->n_events++] = optarg;
                        break;
                case CTL_OPT_UID:
                        if (ctl_parse_int(ctl, "--uid", optarg, 0, UINT32_MAX, &v))
                                return CTL_USAGE;
                        a->uid = (uint64_t)v;
                        a->uid_given = true;
                        break;
                case CTL_OPT_RESULT: a->result = optarg; break;
                case CTL_OPT_FOLLOW: a->follow = true; break;
                }
        }
        if (c < 0)
                return r;
        return ctl_operand(ctl, argc, argv, false, &a->file);
}

/* A number, or (as brokers before numbers became JSON numbers wrote them) a string holding one. */
static bool read_number(JsonRead *r, uint64_t *ret)
{
        char s[32], *end;
        size_t len;

        if (jsonread_peek(r) != '"')
                return jsonread_u64(r, ret, "a number");
        if (!jsonread_string(r, s, sizeof(s), &len, "a number"))
                return false;
        errno = 0;
        *ret = strtoull(s, &end, 10);
        if (!len || *end || errno || s[0] == '-')
                return jsonread_fail(r, "not a number");
        return true;
}

/* A string member: read whole (no string is longer than its line), then kept as far as its field
 * holds it. Other log lines have longer messages, and a cut name still shows where it came from;
 * neither is a reason to call the line malformed. */
static bool read_string_field(JsonRead *r, const char *key, AuditRecord *rec)
{
        static const struct { const char *key; size_t off, cap; } fields[] = {
                { "ts", offsetof(AuditRecord, ts), sizeof(((AuditRecord *)0)->ts) },
                { "msg", offsetof(AuditRecord, msg), sizeof(((AuditRecord *)0)->msg) },
                { "event", offsetof(AuditRecord, event), sizeof(((AuditRecord *)0)->event) },
                { "result", offsetof(AuditRecord, result), sizeof(((AuditRecord *)0)->result) },
                { "kind", offsetof(AuditRecord, kind), sizeof(((AuditRecord *)0)->kind) },
                { "name", offsetof(AuditRecord, name), sizeof(((AuditRecord *)0)->name) },
        };
        static char value[LINE_MAX_BYTES + 1];
        size_t len;

        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
                if (strcmp(key, fields[i].key))
                        continue;
                if (!jsonread_string(r, value, sizeof(value), &len, key))
                        return false;
                snprintf((char *)rec + fields[i].off, fields[i].cap, "%s", value);
                return true;
        }
        return jsonread_skip(r);
}

/* One line as a JSON object into rec: false when it is not one (or a field has the wrong type). */
static bool parse_record(const char *line, size_t len, AuditRecord *rec)
{
        JsonRead r;
        bool first = true;
        char key[64];
        size_t klen;

        memset(rec, 0, sizeof(*rec));
        jsonread_init(&r, line, len);
        if (!jsonread_expect(&r, '{'))
                return false;
        while (jsonread_more(&r, '}', &first)) {
                int i;

                /* A key longer than any the broker writes: no line of the broker's. */
                if (!jsonread_string(&r, key, sizeof(key), &klen, "a key") || !jsonread_expect(&r, ':'))
                        return false;
                for (i = 0; i < N_NUMBERS && strcmp(key, number_keys[i]); i++)
                        ;
                if (i < N_NUMBERS) {
                        if (!read_number(&r, &rec->n[i]))
                                return false;
                        rec->has[i] = true;
                } else if (!read_string_field(&r, key, rec)) {
                        return false;
                }
        }
        return !jsonread_failed(&r) && jsonread_at_end(&r);
}

static bool wanted(const AuditArgs *a, const AuditRecord *rec)
{
        bool event_ok = a->n_events == 0;

        if (strcmp(rec->msg, "audit"))
                return false;
        for (int i = 0; i < a->n_events; i++)
                event_ok = event_ok || !strcmp(rec->event, a->events[i]);
        if (!event_ok || (a->result && strcmp(rec->result, a->result)))
                return false;
        return !a->uid_given || (rec->has[F_UID] && rec->n[F_UID] == a->uid);
}

/* A number column, "-" where the record has none. */
static void number_cell(const AuditRecord *rec, int i, int width)
{
        if (rec->has[i])
                printf(" %*" PRIu64, width, rec->n[i]);
        else
                printf(" %*s", width, "-");
}

/* Fixed columns, not a table: records go out one by one as they come, so widths cannot be measured
 * first. Text from the log (names came from peers) goes through text_cell, as everywhere else. */
static void print_human(AuditCounts *counts, const AuditRecord *rec)
{
        if (!counts->header_printed) {
                printf("%-24s %-11s %-10s %10s %8s %6s %-32s %-11s %12s\n", "TIME", "EVENT", "RESULT", "UID", "PID",
                       "PEER", "NAME", "KIND", "BYTES");
                counts->header_printed = true;
        }
        text_cell(stdout, rec->ts[0] ? rec->ts : "-", 24);
        putchar(' ');
        text_cell(stdout, rec->event, 11);
        putchar(' ');
        text_cell(stdout, rec->result[0] ? rec->result : "-", 10);
        number_cell(rec, F_UID, 10);
        number_cell(rec, F_PID, 8);
        number_cell(rec, F_PEER, 6);
        putchar(' ');
        text_cell(stdout, rec->name[0] ? rec->name : "-", 32);
        putchar(' ');
        text_cell(stdout, rec->kind[0] ? rec->kind : "-", 11);
        number_cell(rec, F_BYTES, 12);
        /* What only some events carry, after the columns. */
        if (rec->has[F_BUFFER])
                printf(" buffer=%" PRIu64, rec->n[F_BUFFER]);
        if (rec->has[F_REFS])
                printf(" refs=%" PRIu64, rec->n[F_REFS]);
        if (rec->has[F_BUFFERS])
                printf(" buffers=%" PRIu64, rec->n[F_BUFFERS]);
        if (rec->has[F_COUNT])
                printf(" count=%" PRIu64, rec->n[F_COUNT]);
        putchar('\n');
}

static void handle_line(Ctl *ctl, const AuditArgs *a, AuditCounts *counts, char *line, size_t len)
{
        AuditRecord rec;

        if (len && line[len - 1] == '\r')
                len--;
        if (!len)
                return;
        if (!parse_record(line, len, &rec)) {
                counts->malformed++;
                return;
        }
        if (!wanted(a, &rec))
                return;
        if (ctl->json) {
                /* Passed through as the broker wrote it: a shipper or jq sees the record itself. */
                fwrite(line, 1, len, stdout);
                putchar('\n');
        } else {
                print_human(counts, &rec);
        }
        fflush(stdout); /* one line per record as it comes, also into a pipe */
}

/* Sleeps until the next look at a followed file; false when a signal asked to stop. */
static bool follow_wait(void)
{
        struct timespec ts = { 0, FOLLOW_POLL_NS };

        if (stop)
                return false;
        nanosleep(&ts, NULL);
        return !stop;
}

/* The read loop: lines of at most LINE_MAX_BYTES assembled in one buffer; a longer one is dropped
 * as it streams past (skipping until its newline), so memory never grows with the input. */
static int read_stream(Ctl *ctl, const AuditArgs *a, int fd, bool follow_file, AuditCounts *counts)
{
        static char line[LINE_MAX_BYTES];
        char chunk[16384];
        size_t len = 0;
        bool skipping = false;

        while (!stop) {
                ssize_t n = read(fd, chunk, sizeof(chunk));

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return ctl_error(ctl, "io", "reading %s: %s", a->file ? a->file : "stdin", strerror(errno));
                if (n == 0) {
                        struct stat st;
                        off_t at;

                        if (!follow_file)
                                break;
                        /* Truncated under us (logrotate's copytruncate): start over from the top. */
                        at = lseek(fd, 0, SEEK_CUR);
                        if (fstat(fd, &st) == 0 && at > st.st_size) {
                                lseek(fd, 0, SEEK_SET);
                                len = 0;
                                skipping = false;
                        }
                        if (!follow_wait())
                                break;
                        continue;
                }
                for (char *p = chunk, *end = chunk + n; p < end;) {
                        char *nl = memchr(p, '\n', (size_t)(end - p));
                        size_t piece = (size_t)((nl ? nl : end) - p);

                        if (!skipping && piece > sizeof(line) - len) {
                                skipping = true;
                                len = 0;
                        }
                        if (!skipping) {
                                memcpy(line + len, p, piece);
                                len += piece;
                        }
                        p += piece;
                        if (!nl)
                                break;
                        p++;
                        if (skipping)
                                counts->overlong++;
                        else
                                handle_line(ctl, a, counts, line, len);
                        skipping = false;
                        len = 0;
                }
        }
        /* The last line may lack its newline (a file cut at the end, or a stopped follow). */
        if (skipping)
                counts->overlong++;
        else if (len && !stop)
                handle_line(ctl, a, counts, line, len);
        return CTL_OK;
}

int cmd_audit(Ctl *ctl, int argc, char **argv)
{
        struct sigaction sa = { .sa_handler = on_signal };
        AuditCounts counts = { 0 };
        AuditArgs a;
        struct stat st;
        bool from_stdin;
        int fd, r = parse_args(ctl, argc, argv, &a);

        if (r != CTL_CONTINUE)
                return r;
        from_stdin = !a.file || !strcmp(a.file, "-");
        fd = from_stdin ? STDIN_FILENO : open(a.file, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return ctl_error(ctl, "io", "cannot open '%s': %s", a.file, strerror(errno));
        /* A stream the output follows: SIGINT and SIGTERM end it with the counts, not mid-line. No
         * SA_RESTART: a read blocked on a pipe returns to see the flag. */
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        /* A pipe or terminal ends when its writer does; only a regular file is polled for more. */
        r = read_stream(ctl, &a, fd, a.follow && fstat(fd, &st) == 0 && S_ISREG(st.st_mode), &counts);
        if (!from_stdin)
                close(fd);
        if (counts.malformed)
                fprintf(stderr,
                        "gpuipcctl audit: skipped %" PRIu64 " line(s) that are not JSON objects (the broker writes "
                        "JSON with --log-format json)\n",
                        counts.malformed);
        if (counts.overlong)
                fprintf(stderr, "gpuipcctl audit: skipped %" PRIu64 " line(s) longer than %d bytes\n",
                        counts.overlong, LINE_MAX_BYTES);
        return r;
}
