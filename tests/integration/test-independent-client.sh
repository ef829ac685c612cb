#!/bin/sh
# Runs the independent Python client (written from docs/protocol.md alone) against a real broker on
# a temporary socket, then stops the broker with SIGTERM and requires a clean exit.
# Needs GPUIPC_BROKER and GPUIPC_CTL (set by the test environment). Exit 77 = skipped.
set -u

here=$(cd "$(dirname "$0")" && pwd)

if [ -z "${GPUIPC_BROKER:-}" ] || [ ! -x "$GPUIPC_BROKER" ]; then
  echo "skip: GPUIPC_BROKER does not point at the broker binary"
  exit 77
fi
if [ -z "${GPUIPC_CTL:-}" ] || [ ! -x "$GPUIPC_CTL" ]; then
  echo "skip: GPUIPC_CTL does not point at gpuipcctl"
  exit 77
fi
python=$(command -v python3 || true)
if [ -z "$python" ]; then
  echo "skip: no python3"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpuipc-indep.XXXXXX") || exit 1
sock="$tmp/s.sock"
broker_pid=

cleanup() {
  if [ -n "$broker_pid" ] && kill -0 "$broker_pid" 2>/dev/null; then
    kill -KILL "$broker_pid" 2>/dev/null
    wait "$broker_pid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

"$GPUIPC_BROKER" --socket "$sock" --seccomp off --log-level warn &
broker_pid=$!

# Wait up to 5 s for the broker to answer.
ready=no
i=0
while [ $i -lt 50 ]; do
  if "$GPUIPC_CTL" --socket "$sock" --timeout 100 ping >/dev/null 2>&1; then
    ready=yes
    break
  fi
  if ! kill -0 "$broker_pid" 2>/dev/null; then
    break
  fi
  sleep 0.1
  i=$((i + 1))
done
if [ "$ready" != yes ]; then
  echo "FAIL: the broker did not answer on $sock within 5 s"
  exit 1
fi

"$python" "$here/independent_client.py" "$sock"
client_rc=$?

kill -TERM "$broker_pid"
wait "$broker_pid"
broker_rc=$?
broker_pid=

if [ "$broker_rc" -ne 0 ]; then
  echo "FAIL: the broker exited with status $broker_rc after SIGTERM (expected 0)"
  exit 1
fi
if [ -e "$sock" ]; then
  echo "FAIL: the broker left its socket file behind"
  exit 1
fi
exit "$client_rc"
