# What the GStreamer plugin's tests share (sourced by test-gst.sh): a broker on a temporary socket,
# gst-launch-1.0 pipelines each in a PID namespace of its own (as the containers of a pod run them),
# and the comparisons: every frame byte for byte against a reference run, every buffer's timestamps,
# offsets and flags and every caps and segment event against what the producer's pipeline saw.
#
# Needs: GPUIPC_BROKER, GPUIPC_GST_PLUGIN_DIR (meson sets both); exits 77 (skipped) without
# gst-launch-1.0, the plugin, the elements the pipelines use, or PID namespaces.
#
# A plugin built with AddressSanitizer (the sanitizer build) is loaded by gst-launch-1.0, which is
# not: the sanitizers' runtimes are preloaded into every process that loads the plugin, each writes
# its reports to a file of its own, and sanitizer_verdict fails the case on any memory error or
# undefined behaviour, and on any leak whose stack passes through the plugin or libgpuipc (GLib,
# GStreamer and the plugin scanner keep memory until exit on purpose; those are not ours).

skip() {
        echo "SKIP: $*"
        exit 77
}

fail() {
        echo "FAIL: $*"
        show_logs
        exit 1
}

require_tools() {
        local t e
        for t in gst-launch-1.0 gst-inspect-1.0 unshare timeout cmp; do
                command -v "$t" >/dev/null || skip "$t is missing (gstreamer1.0-tools, util-linux, coreutils, diffutils)"
        done
        [[ -n ${GPUIPC_GST_PLUGIN_DIR:-} && -d $GPUIPC_GST_PLUGIN_DIR ]] ||
                skip "the plugin was not built (GStreamer's development packages are missing)"
        export GST_PLUGIN_PATH=$GPUIPC_GST_PLUGIN_DIR
        # A registry of the test's own: no cache from another build, no rescans racing each other.
        export GST_REGISTRY=$dir/registry.bin
        sanitizer_setup
        for e in gpuipcsink gpuipcsrc videotestsrc identity filesink fakesink concat; do
                "${inspect[@]}" gst-inspect-1.0 "$e" >/dev/null 2>&1 ||
                        skip "GStreamer element $e is missing (gstreamer1.0-plugins-base, the plugin's build)"
        done
        export GST_REGISTRY_UPDATE=no
        if [[ $(id -u) == 0 ]]; then
                ns=(unshare --pid --fork --mount-proc --kill-child)
        elif unshare --user --map-root-user --pid --fork --mount-proc true 2>/dev/null; then
                ns=(unshare --user --map-root-user --pid --fork --mount-proc --kill-child)
        else
                skip "cannot make PID namespaces (unshare --pid needs root or user namespaces)"
        fi
}

# With a sanitized plugin: san_prefix NAME sets pre, what runs a process named NAME that loads the
# plugin; inspect runs gst-inspect-1.0 (its registry scan loads every plugin of the machine, so
# leaks are not looked for there). Both are empty otherwise.
pre=() inspect=() sanitized=
sanitizer_setup() {
        local asan ubsan
        command -v readelf >/dev/null && readelf -d "$GPUIPC_GST_PLUGIN_DIR/libgstgpuipc.so" 2>/dev/null |
                grep 'NEEDED.*libasan' >/dev/null || return 0 # not -q: readelf must not die of SIGPIPE
        asan=$(gcc -print-file-name=libasan.so 2>/dev/null)
        ubsan=$(gcc -print-file-name=libubsan.so 2>/dev/null)
        [[ -e $asan && -e $ubsan ]] || skip "the plugin is built with ASan, but libasan.so/libubsan.so (gcc) are not there to preload"
        sanitized=1
        inspect=(env LD_PRELOAD="$asan $ubsan" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
        san_libs="$asan $ubsan"
}

san_prefix() {
        pre=()
        [[ -n $sanitized ]] || return 0
        # Every namespace's gst-launch-1.0 is its pid 1: reports go to files named by the process.
        # exitcode=0: GLib's own memory kept until exit must not fail the pipeline; the verdict reads
        # the reports instead (an error also stops the process, which the comparisons notice).
        pre=(env LD_PRELOAD="$san_libs"
                ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:halt_on_error=1:exitcode=0:log_path=$dir/asan-$1"
                UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$dir/ubsan-$1")
}

# Fails on what the sanitizers reported (nothing to do without them).
sanitizer_verdict() {
        local f ours=0
        [[ -n $sanitized ]] || return 0
        for f in "$dir"/asan-* "$dir"/ubsan-* "$dir/broker.log"; do
                [[ -e $f ]] || continue
                if grep -qE 'ERROR: AddressSanitizer|runtime error:' "$f"; then
                        logs+=("$f")
                        fail "a sanitizer reported an error in $(basename "$f")"
                fi
                # Leak reports are blank-line separated blocks; ours are those through our code (a frame
                # in one of our sources when symbolized, in one of our libraries when not).
                if awk -v RS= '/(Direct|Indirect) leak/ && /libgstgpuipc|libgpuipc|[.][.]\/(gst|client|proto|util)\// { found = 1; print }
                               END { exit !found }' \
                        "$f" >"$f.ours"; then
                        ours=1
                        logs+=("$f.ours")
                fi
        done
        ((ours == 0)) || fail "the plugin or libgpuipc leaked (LeakSanitizer)"
        echo "sanitizers: no error, no leak of the plugin's or libgpuipc's"
}

# Names of the processes started by start_ns, and their pids (the unshare parents).
declare -A pids
logs=()

setup() {
        dir=$(mktemp -d /tmp/gpuipc-gst.XXXXXX)
        export GPUIPC_SOCKET=$dir/gpuipc.sock
        require_tools
        "$GPUIPC_BROKER" --socket "$GPUIPC_SOCKET" --log-level warn 2>"$dir/broker.log" &
        broker_pid=$!
        for _ in $(seq 100); do
                [[ -S $GPUIPC_SOCKET ]] && break
                sleep 0.05
        done
        logs+=("$dir/broker.log")
        [[ -S $GPUIPC_SOCKET ]] || fail "the broker did not start"
}

cleanup() {
        local n
        for n in "${!pids[@]}"; do
                # The unshare parent ignores SIGTERM; SIGKILL takes its child with it (--kill-child).
                kill -KILL "${pids[$n]}" 2>/dev/null
        done
        [[ -n ${broker_pid:-} ]] && kill "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
        [[ -n ${KEEP:-} ]] && echo "kept $dir" || rm -rf "$dir"
}

show_logs() {
        local f
        for f in "${logs[@]}"; do
                [[ -s $f ]] || continue
                echo "---- $(basename "$f") (last 40 lines)"
                tail -n 40 "$f"
        done
}

# start_ns NAME GST-LAUNCH-ARGS...: a pipeline in a PID namespace of its own, its output in
# $dir/NAME.log (with -v: property notifications, which the identity taps print).
start_ns() {
        local name=$1
        shift
        san_prefix "$name"
        GST_DEBUG=${GST_DEBUG:-gpuipcsrc:4,gpuipcsink:4} GST_DEBUG_NO_COLOR=1 \
                "${ns[@]}" "${pre[@]}" gst-launch-1.0 -v "$@" >"$dir/$name.log" 2>&1 &
        pids[$name]=$!
        logs+=("$dir/$name.log")
}

# finish NAME [SECONDS]: waits for NAME's pipeline to end (at most SECONDS, default 120) and sets
# status to its exit status; a pipeline that does not end is killed and reported as 124. (Not in a
# subshell: only this shell can wait for its children.)
finish() {
        local name=$1 limit=${2:-120} pid=${pids[$1]}
        local deadline=$((SECONDS + limit))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
                sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
                kill -KILL "$pid" 2>/dev/null
                wait "$pid" 2>/dev/null
                status=124
        else
                wait "$pid"
                status=$?
        fi
        unset "pids[$name]"
}

# expect_ok NAME [SECONDS]: NAME's pipeline must end with status 0.
expect_ok() {
        finish "$@"
        [[ $status == 0 ]] || fail "pipeline $1 ended with status $status"
}

# kill_ns NAME: SIGKILL to NAME's namespace (its gst-launch-1.0 dies with the unshare parent), if
# it still runs.
kill_ns() {
        kill -KILL "${pids[$1]}" 2>/dev/null
        wait "${pids[$1]}" 2>/dev/null
        unset "pids[$1]"
}

# wait_log FILE PATTERN [SECONDS]: until FILE has a line matching PATTERN (grep -E).
wait_log() {
        local deadline=$((SECONDS + ${3:-60}))
        until grep -qE "$2" "$1" 2>/dev/null; do
                ((SECONDS < deadline)) || fail "$(basename "$1") did not say: $2"
                sleep 0.05
        done
}

# The pid of NAME's gst-launch-1.0 as the outer namespace sees it (for SIGSTOP/SIGCONT).
inner_pid() {
        pgrep -P "${pids[$1]}" | head -n 1
}

# wait_bytes FILE BYTES [SECONDS]: until FILE holds at least BYTES.
wait_bytes() {
        local f=$1 n=$2 deadline=$((SECONDS + ${3:-60}))
        while (($(stat -c %s "$f" 2>/dev/null || echo 0) < n)); do
                ((SECONDS < deadline)) || fail "$f did not reach $n bytes"
                sleep 0.05
        done
}

# reference NAME GST-LAUNCH-ARGS...: the frames a deterministic producer pipeline makes, written
# by a plain run of it (no ring), into $dir/NAME.raw.
reference() {
        local name=$1
        shift
        gst-launch-1.0 -q "$@" ! filesink location="$dir/$name.raw" >"$dir/$name.ref.log" 2>&1 ||
                fail "the reference pipeline for $name failed: $(cat "$dir/$name.ref.log")"
}

# taps LOG: what the identity named tap saw, one line per buffer or event, without addresses, in
# order: "buffer (SIZE bytes, dts: ..., pts: ..., duration: ..., offset: ..., offset_end: ...,
# flags: ...)" and "event caps/segment ...". Stream-start events name their stream and are left out.
taps() {
        grep -E 'GstIdentity:tap: last-message = ' "$1" |
                sed -E -e 's/.*last-message = //' -e 's/ 0x[0-9a-f]+$//' |
                sed -E -e 's/^chain +\*+ \(tap:sink\) /buffer /' -e 's/^event +\*+ \(tap:sink\) E \(type: ([a-z-]+) \([0-9]+\), /event \1 /' |
                grep -vE '^event stream-start' | sed -E 's/, meta: [^)]*\)$/)/'
}

# same_taps PRODUCER-LOG CONSUMER-LOG: the consumer's tap saw exactly what the producer's did.
same_taps() {
        taps "$1" >"$1.taps"
        taps "$2" >"$2.taps"
        [[ -s $1.taps ]] || fail "the producer's tap saw nothing ($1)"
        diff -u "$1.taps" "$2.taps" >"$2.diff" ||
                fail "$(basename "$2") saw other buffers or events than the producer: $(head -n 20 "$2.diff")"
}

# stat_of LOG WORD: the count before WORD in the element's closing INFO line ("N frames pushed,
# N copied out of their slot, N skipped" / "N frames published, N copied into their slot").
stat_of() {
        grep -oE "[0-9]+ $2" "$1" | tail -n 1 | cut -d' ' -f1
}
