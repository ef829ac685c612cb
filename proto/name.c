/* Buffer, group and ring names and name prefixes (docs/protocol.md "Names"): the one definition
 * both sides check against, the client before it sends, the broker when a request arrives. */
#include <string.h>

#include "proto.h"

static bool name_char_ok(char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               (c && strchr("._:/@+=-", c) != NULL);
}

bool proto_prefix_valid(const char *s, size_t len)
{
        /* No leading '/' and no "..": names are often mapped onto paths by policies and tools, and
         * must never climb out of (or above) a directory there. */
        if (len > PROTO_MAX_NAME || (len > 0 && s[0] == '/'))
                return false;
        for (size_t i = 0; i < len; i++) {
                if (!name_char_ok(s[i]))
                        return false;
                if (s[i] == '.' && i + 1 < len && s[i + 1] == '.')
                        return false;
        }
        return true;
}

bool proto_name_valid(const char *s, size_t len)
{
        return len > 0 && proto_prefix_valid(s, len);
}
