#!/bin/bash
# The rings' data plane (client/ring-data.c, ring-stream-data.c, built as libgpuipc-ring-data.a)
# makes no socket call, allocates nothing and makes no request of the broker: none of its
# undefined symbols (what it calls outside itself) is one of those. The control plane's library
# (libgpuipc-client.a) is checked the same way and must be caught, so that the check itself is
# known to bite.
#
#   ring-data-symbols.sh NM DATA_PLANE.a CONTROL_PLANE.a
set -euo pipefail
nm=$1 data=$2 control=$3

# Socket and polling calls, allocation, and the library's ways to the broker (requests, reading the
# socket, allocating or freeing buffers, attaching), and the connection's lock.
forbidden='^(socket|socketpair|connect|accept4?|bind|listen|send|sendto|sendmsg|recv|recvfrom|recvmsg|poll|ppoll|select|pselect|epoll_(wait|pwait|ctl|create1?)|malloc|calloc|realloc|reallocarray|free|strdup|strndup|posix_memalign|aligned_alloc|memalign|mmap|munmap|fdpass_send|fdpass_recv|client_request|client_pump|client_send_nowait|proto_frame_encode|gpuipc_buffer_alloc|gpuipc_buffer_free|gpuipc_attach|gpuipc_attach_id|gpuipc_release|gpuipc_publish|client_lock|client_unlock)$'

# What an archive calls outside itself: undefined in some member, defined in none.
outside() {
        comm -23 <("$nm" -u "$1" 2>/dev/null | awk 'NF == 2 && $1 == "U" { print $2 }' | sort -u) \
                 <("$nm" --defined-only "$1" 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u)
}

bad=$(outside "$data" | grep -E "$forbidden" || true)
if [[ -n $bad ]]; then
        echo "FAIL: the ring data plane ($data) calls:" $bad
        exit 1
fi
echo "ok: the ring data plane calls none of the forbidden functions; it calls:" $(outside "$data")

caught=$(outside "$control" | grep -E "$forbidden" | tr '\n' ' ')
if [[ -z $caught ]]; then
        echo "FAIL: the check finds nothing in the control plane ($control) either: it would not bite"
        exit 1
fi
echo "ok: the same check catches the control plane's: $caught"
