/* See identity.h. */
#include "identity.h"

#include <errno.h>
#include <sys/stat.h>

int ipc_shm_identity(uint64_t *ret_dev, uint64_t *ret_ino)
{
        struct stat st;

        *ret_dev = *ret_ino = 0;
        if (stat("/dev/shm", &st) < 0)
                return -errno;
        *ret_dev = (uint64_t)st.st_dev;
        *ret_ino = (uint64_t)st.st_ino;
        return 0;
}
