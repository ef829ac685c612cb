/* Text and JSON-lines logging with logfmt fields. Writes with one write(2) per line so lines
 * from a dying process are never interleaved. What it must never do: let a field's bytes (names
 * and labels come from peers) break a JSON line: quotes, backslashes and control characters are
 * escaped. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Set once by log_setup before the loop starts and only read after: the SIGSYS handler
 * (sandbox.c) reads json_mode through log_json(), which is safe in a signal handler only because
 * nothing writes it any more. */
static bool json_mode;
static LogLevel min_level = LOG_INFO;
static const char *const level_names[] = { "debug", "info", "warn", "error" };

void log_setup(bool json, LogLevel level)
{
        json_mode = json;
        min_level = level;
}

bool log_json(void)
{
        return json_mode;
}

int log_level_from_name(const char *s, LogLevel *ret)
{
        for (unsigned i = 0; i < ARRAY_SIZE(level_names); i++) {
                if (strcmp(s, level_names[i]) == 0) {
                        *ret = (LogLevel)i;
                        return 0;
                }
        }
        return -1;
}

/* One line, on the stack: 4096 bytes is the most a pipe writes atomically (PIPE_BUF), so a
 * line to a pipe or a journal socket never interleaves with another writer's. */
typedef struct Line {
        char buf[4096];
        size_t n;
} Line;

/* Cuts rather than fails: a line too long still goes out, with its start, which holds the level,
 * the message and the first fields. */
static void put(Line *l, const char *s, size_t len)
{
        size_t room = sizeof(l->buf) - 2 - l->n; /* keep space for '}' and '\n' */
        if (len > room)
                len = room;
        memcpy(l->buf + l->n, s, len);
        l->n += len;
}

static void puts_(Line *l, const char *s)
{
        put(l, s, strlen(s));
}

/* Appends s as the inside of a JSON string. */
static void put_escaped(Line *l, const char *s, size_t len)
{
        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)s[i];
                char esc[8];

                if (c == '"' || c == '\\') {
                        esc[0] = '\\';
                        esc[1] = (char)c;
                        put(l, esc, 2);
                } else if (c < 0x20) {
                        /* \u form for every control byte: a newline from a peer's label would
                         * otherwise split one record into two for a log shipper. */
                        snprintf(esc, sizeof(esc), "\\u%04x", c);
                        put(l, esc, 6);
                } else {
                        put(l, (const char *)&c, 1);
                }
        }
}

/* Whether an unquoted value is a JSON integer (-?(0|[1-9][0-9]*)): it becomes a number, so a log
 * shipper compares pids and sizes as numbers. Anything else, and every quoted value, stays a string
 * (a mode like 0660 too: a leading zero is no JSON number). */
static bool is_json_integer(const char *v, size_t len)
{
        size_t i = v[0] == '-';

        if (i >= len || len - i > 20)
                return false;
        if (v[i] == '0')
                return len - i == 1;
        for (; i < len; i++)
                if (v[i] < '0' || v[i] > '9')
                        return false;
        return true;
}

/* Converts logfmt fields (key=value, key="quoted value") into JSON members. */
static void put_fields_json(Line *l, const char *f)
{
        while (*f) {
                const char *key, *eq, *val;
                size_t vlen;
                bool quoted;

                while (*f == ' ')
                        f++;
                if (!*f)
                        break;
                key = f;
                eq = strchr(f, '=');
                if (!eq)
                        break;
                val = eq + 1;
                quoted = *val == '"';
                if (quoted) {
                        const char *end = val + 1;
                        while (*end && !(*end == '"' && end[-1] != '\\'))
                                end++;
                        val++;
                        vlen = (size_t)(end - val);
                        f = *end ? end + 1 : end;
                } else {
                        vlen = strcspn(val, " ");
                        f = val + vlen;
                }
                puts_(l, ",\"");
                put_escaped(l, key, (size_t)(eq - key));
                if (!quoted && is_json_integer(val, vlen)) {
                        puts_(l, "\":");
                        put(l, val, vlen);
                        continue;
                }
                puts_(l, "\":\"");
                put_escaped(l, val, vlen);
                puts_(l, "\"");
        }
}

static void write_line(LogLevel level, const char *msg, const char *fields)
{
        struct timespec ts;
        struct tm tm;
        char stamp[64];
        Line l = { .n = 0 };
        /* UTC with milliseconds, RFC 3339: sortable, and comparable across hosts and time zones. */
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);

        if (json_mode) {
                puts_(&l, "{\"ts\":\"");
                puts_(&l, stamp);
                puts_(&l, "\",\"level\":\"");
                puts_(&l, level_names[level]);
                puts_(&l, "\",\"msg\":\"");
                put_escaped(&l, msg, strlen(msg));
                puts_(&l, "\"");
                put_fields_json(&l, fields);
                l.buf[l.n++] = '}';
        } else {
                puts_(&l, stamp);
                puts_(&l, " ");
                puts_(&l, level_names[level]);
                puts_(&l, " ");
                puts_(&l, msg);
                if (fields[0]) {
                        puts_(&l, " ");
                        puts_(&l, fields);
                }
        }
        /* put() kept two bytes free for these. A failed write is dropped: there is nowhere left to
         * report it, and logging must never stop the broker. */
        l.buf[l.n++] = '\n';
        (void)!write(STDERR_FILENO, l.buf, l.n);
}

void log_msg(LogLevel level, const char *msg, const char *fields_fmt, ...)
{
        char fields[2048] = "";
        va_list ap;

        /* Before any formatting: debug lines cost nothing at the default level. */
        if (level < min_level)
                return;
        if (fields_fmt) {
                va_start(ap, fields_fmt);
                vsnprintf(fields, sizeof(fields), fields_fmt, ap);
                va_end(ap);
        }
        write_line(level, msg, fields);
}

void log_audit(const char *fields_fmt, ...)
{
        char fields[2048] = "";
        va_list ap;

        va_start(ap, fields_fmt);
        vsnprintf(fields, sizeof(fields), fields_fmt, ap);
        va_end(ap);
        write_line(LOG_INFO, "audit", fields);
}
