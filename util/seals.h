/* Memfd seals newer than some C libraries' headers: the one place they are defined. Include it
 * after <fcntl.h>. */
#pragma once

#include <fcntl.h>

/* Linux 5.1: no new writable mapping (or write()) from now on; mappings made before stay writable,
 * so a producer seals after mapping its own memory. Debian 12's glibc headers predate it. */
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
