"""What the client and the features built on it (pools, rings, state dicts) share, below all of
them: waits cut into slices, and whether the interpreter is on its way out. Part of the package's
internal layer (with _lib, errors and _args): it imports no module above it, so every module may
import it at the top (docs/design.md, "The Python package")."""
import sys
import threading
import time

# Long waits are cut in slices of this many milliseconds so that Ctrl-C (KeyboardInterrupt) and
# other threads get a turn; the broker and libgpuipc see several shorter waits.
SLICE_MS = 500


def exiting():
    """True once the interpreter is on its way out: the main thread has finished (Python then waits
    for other threads and runs the exit handlers) or the interpreter is being torn down."""
    return sys.is_finalizing() or not threading.main_thread().is_alive()


class Deadline:
    """timeout_ms (negative: forever; 0: do not wait) as a sequence of slices."""

    def __init__(self, timeout_ms):
        self.timeout_ms = timeout_ms
        self.forever = timeout_ms is None or timeout_ms < 0
        self.end = None if self.forever else time.monotonic() + timeout_ms / 1000.0

    def left_ms(self):
        """Milliseconds left (-1: forever)."""
        if self.forever:
            return -1
        return max(0, int((self.end - time.monotonic()) * 1000))

    def next_slice(self):
        """(milliseconds to wait now, whether this is the last slice)."""
        left = self.left_ms()
        if left < 0:
            return SLICE_MS, False
        return min(left, SLICE_MS), left <= SLICE_MS
