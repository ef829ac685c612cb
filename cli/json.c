/* JSON writer; strings are escaped per RFC 8259. */
#include "json.h"

#include <inttypes.h>

void json_begin(Json *j, FILE *f, char open)
{
        j->f = f;
        j->first = true;
        fputc(open, f);
}

void json_end(Json *j, char close)
{
        fputc(close, j->f);
        j->first = false;
}

void json_next(Json *j)
{
        if (!j->first)
                fputc(',', j->f);
        j->first = false;
}

void json_key(Json *j, const char *key)
{
        json_next(j);
        json_str(j, key, __builtin_strlen(key));
        fputc(':', j->f);
}

void json_str(Json *j, const char *s, size_t len)
{
        fputc('"', j->f);
        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)s[i];
                if (c == '"' || c == '\\')
                        fprintf(j->f, "\\%c", c);
                else if (c < 0x20)
                        fprintf(j->f, "\\u%04x", c);
                else
                        fputc(c, j->f);
        }
        fputc('"', j->f);
}

void json_u64(Json *j, uint64_t v)
{
        fprintf(j->f, "%" PRIu64, v);
}

void json_bool(Json *j, bool v)
{
        fputs(v ? "true" : "false", j->f);
}
