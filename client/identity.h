/* What legacy CUDA IPC compares between two processes, as measured (docs/legacy-ipc.md): the PID
 * each has in its own PID namespace (a memory or event handle does not open where the two are
 * equal) and the /dev/shm each sees (an event handle opens only where it is the same). */
#pragma once

#include <stdint.h>

/* The identity of this process's /dev/shm: the device and inode of the directory, which tell one
 * mount from another across mount namespaces. 0, or -errno (then both are 0: no /dev/shm). */
int ipc_shm_identity(uint64_t *ret_dev, uint64_t *ret_ino);
