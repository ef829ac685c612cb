#!/bin/bash
# gpuipcsink and gpuipcsrc across processes, each pipeline in a PID namespace of its own:
#   test-gst.sh one          1 source: every frame byte for byte, every buffer's timestamps, offsets and
#                            flags and every caps and segment event as the producer's pipeline saw them;
#                            both ends zero-copy (the producer writes into the slot through the sink's
#                            pool, the consumer reads the slot itself)
#   test-gst.sh fanout       4 sources on one sink, each checked the same way; their sinks keep the last
#                            buffer, so the sources copy frames out of held slots
#   test-gst.sh kill-source  a source killed mid-stream: the other two get every frame and their EOS
#   test-gst.sh kill-sink    the sink killed mid-stream: a source with reconnect=false posts an error naming
#                            the producer's end (and the ring's fix, not a buffer's), one with reconnect=true waits and carries on with the next
#                            producer of the ring
#   test-gst.sh caps-change  caps changing mid-stream (and the segment with them) reach the source in
#                            order; a change to frames larger than the slots is refused, naming slot-size
#   test-gst.sh latest       mode=latest: a member stopped mid-stream does not hold the sink up, skips to the
#                            newest frame when it goes on, and every frame it did get is intact
#   test-gst.sh flush        the producer flushes mid-stream (a flushing seek to the start): the source
#                            replays the flush and the new segment before the frames after it, which
#                            start again at 0; every frame it got is the producer's, in the producer's order
#   test-gst.sh errors       no broker, no ring name, no producer: errors that say so, with the library's text
#   test-gst.sh inspect      gst-inspect-1.0 documents every property of both elements, and so does
#                            docs/gstreamer.md
#   test-gst.sh hostile      producers whose control page says what none can: the newest frame 1000
#                            ahead in a slot that never holds it (and stays, or then closes the ring and
#                            goes), or 2^64 - 1: sources waiting for a frame, or (reconnect=true) for the
#                            next producer after the ring ended, stop on SIGINT, with -e (an end of
#                            stream) and without (a state change); without reconnect, 2^64 - 1 is an error
#   test-gst.sh waiting-source  a source started before the sink, waiting for its ring, gets every frame
#                            with the default wait-members=0 (the first frames too) from a live producer
#   test-gst.sh cuda         GPU host: video/x-raw(memory:CUDAMemory) through cuda-vmm slots, cudaupload
#                            before the sink, cudadownload after each of 2 sources: every frame byte for
#                            byte and every buffer's timestamps (77 without a GPU, nvcodec or the variant)
# Exit 77 when GStreamer, the plugin or PID namespaces are not available.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

# 320x240 RGBA, a moving ball: every frame differs from the one before.
W=320 H=240
FRAME=$((W * H * 4))
CAPS_NO_RATE="video/x-raw,format=RGBA,width=$W,height=$H"
CAPS="$CAPS_NO_RATE,framerate=30/1"
SRC=(videotestsrc pattern=ball)
TAP=(identity name=tap silent=false)

# A producer of N frames into ring R, with extra gpuipcsink properties.
producer() {
        local name=$1 n=$2 ring=$3
        shift 3
        start_ns "$name" "${SRC[@]}" num-buffers="$n" ! "$CAPS" ! "${TAP[@]}" ! gpuipcsink ring="$ring" sync=false "$@"
}

# A consumer of ring R writing the frames to $dir/NAME.raw, with extra filesink properties.
consumer() {
        local name=$1 ring=$2
        shift 2
        start_ns "$name" gpuipcsrc ring="$ring" timeout=60000 ! "${TAP[@]}" ! filesink location="$dir/$name.raw" "$@"
}

check_consumer() {
        local name=$1 producer_log=$2 ref=$3
        cmp "$dir/$ref.raw" "$dir/$name.raw" || fail "$name's frames differ from the producer's"
        same_taps "$producer_log" "$dir/$name.log"
}

case_one() {
        reference ref "${SRC[@]}" num-buffers=60 ! "$CAPS"
        consumer c1 r1 enable-last-sample=false
        producer p 60 r1 wait-members=1
        expect_ok p
        expect_ok c1
        check_consumer c1 "$dir/p.log" ref
        [[ $(stat_of "$dir/p.log" "frames published") == 60 ]] || fail "the sink did not publish 60 frames"
        [[ $(stat_of "$dir/p.log" "copied into") == 0 ]] ||
                fail "the sink copied frames: upstream did not write into the slots through its pool"
        [[ $(stat_of "$dir/c1.log" "copied out") == 0 ]] ||
                fail "the source copied frames although its downstream returned each before the next"
        echo "ok: 60 frames and their timestamps through the ring, zero-copy at both ends"
}

case_fanout() {
        local i
        reference ref "${SRC[@]}" num-buffers=40 ! "$CAPS"
        for i in 1 2 3 4; do
                consumer "c$i" r4
        done
        producer p 40 r4 wait-members=4 max-members=4 pool=false
        expect_ok p
        for i in 1 2 3 4; do
                expect_ok "c$i"
                check_consumer "c$i" "$dir/p.log" ref
                (($(stat_of "$dir/c$i.log" "copied out") > 0)) ||
                        fail "c$i copied no frame although filesink kept the last one"
        done
        [[ $(stat_of "$dir/p.log" "copied into") == 40 ]] || fail "pool=false: the sink should copy every frame"
        echo "ok: 4 sources in 4 PID namespaces got all 40 frames and their timestamps"
}

case_kill_source() {
        local i
        for i in 1 2 3; do
                consumer "c$i" rk
        done
        # Paced (a live source), so that the stream is still going when the victim dies.
        start_ns p "${SRC[@]}" is-live=true num-buffers=150 ! "$CAPS_NO_RATE,framerate=100/1" ! gpuipcsink ring=rk \
                sync=false wait-members=3
        reference ref "${SRC[@]}" num-buffers=150 ! "$CAPS_NO_RATE,framerate=100/1"
        wait_bytes "$dir/c2.raw" $((10 * FRAME))
        kill_ns c2
        expect_ok p
        for i in 1 3; do
                expect_ok "c$i"
                cmp "$dir/ref.raw" "$dir/c$i.raw" || fail "c$i's frames differ after c2 died"
        done
        echo "ok: a source killed mid-stream; the others got all 150 frames"
}

case_kill_sink() {
        reference ref2 videotestsrc pattern=smpte num-buffers=20 ! "$CAPS"
        start_ns strict gpuipcsrc ring=rs timeout=60000 ! fakesink
        start_ns patient gpuipcsrc ring=rs timeout=60000 reconnect=true ! "${TAP[@]}" ! filesink \
                location="$dir/patient.raw"
        start_ns p1 "${SRC[@]}" is-live=true num-buffers=100000 ! "$CAPS" ! gpuipcsink ring=rs sync=false \
                wait-members=2
        wait_bytes "$dir/patient.raw" $((5 * FRAME))
        kill_ns p1
        finish strict 30
        [[ $status != 0 && $status != 124 ]] || fail "the source without reconnect carried on after its producer died"
        grep -qE "ERROR: .*ring 'rs' ended \(producer: gst-launch-1.0:gpuipcsink0, pid [0-9]+\): ring 'rs': the producer \(peer [0-9]+, pid [0-9]+, uid [0-9]+\) disconnected" \
                "$dir/strict.log" || fail "the source's error does not name the producer and its end"
        # Its fix is the ring's, not the library's text for a revoked buffer ("publish broker-held").
        grep -q "gpuipc error revoked (-1017): the ring ended for this source" "$dir/strict.log" &&
                ! grep -q "broker-held" "$dir/strict.log" || fail "the source's error gives a buffer's hint, not the ring's"
        # The patient one waits for the next producer of rs and carries on with its frames.
        wait_log "$dir/patient.log" "waiting for a new producer"
        start_ns p2 videotestsrc pattern=smpte num-buffers=20 ! "$CAPS" ! gpuipcsink ring=rs sync=false \
                wait-members=1
        expect_ok p2
        expect_ok patient
        cmp <(tail -c $((20 * FRAME)) "$dir/patient.raw") "$dir/ref2.raw" ||
                fail "after reconnecting, the source did not get the new producer's 20 frames"
        echo "ok: a killed sink: an error naming it without reconnect, the next producer's frames with it"
}

case_caps_change() {
        local big=$((640 * 480 * 4))
        local two=(concat name=c ! "${TAP[@]}" ! gpuipcsink ring=rc sync=false wait-members=1 slot-size=$big
                "${SRC[@]}" num-buffers=8 ! "$CAPS" ! c.
                "${SRC[@]}" num-buffers=8 ! video/x-raw,format=RGBA,width=640,height=480,framerate=30/1 ! c.
                "${SRC[@]}" num-buffers=8 ! video/x-raw,format=I420,width=160,height=120,framerate=15/1 ! c.)
        consumer c1 rc
        start_ns p "${two[@]}"
        expect_ok p
        expect_ok c1
        [[ $(grep -c '^event caps' <(taps "$dir/p.log")) == 3 ]] || fail "the producer saw no 3 caps"
        same_taps "$dir/p.log" "$dir/c1.log"
        gst-launch-1.0 -q concat name=c ! filesink location="$dir/ref.raw" \
                "${SRC[@]}" num-buffers=8 ! "$CAPS" ! c. \
                "${SRC[@]}" num-buffers=8 ! video/x-raw,format=RGBA,width=640,height=480,framerate=30/1 ! c. \
                "${SRC[@]}" num-buffers=8 ! video/x-raw,format=I420,width=160,height=120,framerate=15/1 ! c.
        cmp "$dir/ref.raw" "$dir/c1.raw" || fail "the frames differ across the caps changes"

        # Without slot-size the ring's slots fit the first caps only: growing is refused, with the fix.
        consumer c2 rc2
        start_ns p2 concat name=c ! gpuipcsink ring=rc2 sync=false wait-members=1 \
                "${SRC[@]}" num-buffers=2 ! "$CAPS" ! c. \
                "${SRC[@]}" num-buffers=2 ! video/x-raw,format=RGBA,width=640,height=480 ! c.
        finish p2
        [[ $status != 0 && $status != 124 ]] || fail "a caps change to larger frames than the slots was accepted"
        grep -q "its slots hold $FRAME" "$dir/p2.log" && grep -q "set slot-size" "$dir/p2.log" ||
                fail "the refusal does not say what the slots hold and what to set"
        kill_ns c2
        echo "ok: 3 caps (and their segments) in order, every frame intact; a change past the slot size refused"
}

case_latest() {
        local slow
        reference ref "${SRC[@]}" num-buffers=300 ! "$CAPS_NO_RATE,framerate=100/1"
        consumer fast rl
        consumer slow rl
        # 3 s of frames: the slow one is stopped long before they end.
        start_ns p "${SRC[@]}" is-live=true num-buffers=300 ! "$CAPS_NO_RATE,framerate=100/1" ! gpuipcsink ring=rl \
                sync=false mode=latest slots=4 max-members=2 wait-members=2 linger=60000
        wait_bytes "$dir/slow.raw" "$FRAME"
        slow=$(inner_pid slow)
        [[ -n $slow ]] || fail "cannot find the slow consumer's gst-launch-1.0"
        kill -STOP "$slow"
        # The sink never waits for a member: the fast one gets to the end while the slow one is stopped.
        expect_ok fast 60
        kill -CONT "$slow"
        expect_ok slow
        expect_ok p
        (($(stat_of "$dir/slow.log" skipped) > 0)) || fail "the stopped member skipped no frame"
        # Every frame a member got is the producer's frame of that offset, byte for byte.
        for c in fast slow; do
                local i=0 off
                while read -r off; do
                        cmp -s -n "$FRAME" -i $((off * FRAME)):$((i * FRAME)) "$dir/ref.raw" "$dir/$c.raw" ||
                                fail "$c's frame $i (offset $off) differs from the producer's"
                        i=$((i + 1))
                done < <(taps "$dir/$c.log" | sed -nE 's/^buffer .* offset: ([0-9]+),.*/\1/p')
                ((i > 0)) || fail "$c got no frame"
        done
        echo "ok: latest mode: a stopped member skipped $(stat_of "$dir/slow.log" skipped) frames, none held the sink"
}

case_flush() {
        local n_after n_before first
        [[ -x ${GPUIPC_GST_FLUSH_PRODUCER:-} ]] || skip "flush-producer was not built"
        consumer c1 rf
        # After the seek videotestsrc draws its frames anew (not as a fresh run would), so the producer
        # also keeps what it sent after the tap, in sent.raw.
        san_prefix p
        GST_DEBUG=gpuipcsink:4 GST_DEBUG_NO_COLOR=1 "${ns[@]}" "${pre[@]}" "$GPUIPC_GST_FLUSH_PRODUCER" \
                "videotestsrc pattern=ball num-buffers=40 ! $CAPS ! identity name=tap silent=false ! tee name=t
                 t. ! queue max-size-buffers=2 ! gpuipcsink name=sink ring=rf sync=false wait-members=1
                 t. ! queue ! filesink location=$dir/sent.raw" \
                15 >"$dir/p.log" 2>&1 &
        pids[p]=$!
        logs+=("$dir/p.log")
        expect_ok p
        expect_ok c1
        taps "$dir/p.log" >"$dir/p.taps"
        taps "$dir/c1.log" >"$dir/c1.taps"
        grep -q '^event flush-stop' "$dir/p.taps" || fail "the producer did not flush"
        # The flush reaches the consumer as one, after the frames before it and before a new segment
        # and the frames after it, which start again at 0.
        grep -A1 '^event flush-start' "$dir/c1.taps" | sed -n '2p' | grep -q '^event flush-stop' ||
                fail "the source did not replay flush-start, flush-stop: $(grep -n flush "$dir/c1.taps")"
        grep -A1 '^event flush-stop' "$dir/c1.taps" | sed -n '2p' | grep -q '^event segment' ||
                fail "no segment after the replayed flush"
        # (no grep -m1 or -q inside a pipe under pipefail: the writer's SIGPIPE would fail the pipe)
        first=$(sed -n '/^event flush-stop/,$p' "$dir/c1.taps" | grep '^buffer')
        [[ ${first%%$'\n'*} == *'pts: 0:00:00.000000000'* ]] ||
                fail "the first frame after the flush is not the producer's frame at 0"
        # The consumer's buffers are the producer's, in order, less those the flush dropped at the sink
        # (a subsequence: the diff from the producer's list to the consumer's only deletes lines).
        grep '^buffer' "$dir/c1.taps" >"$dir/c1.buffers"
        grep '^buffer' "$dir/p.taps" >"$dir/p.buffers"
        diff "$dir/p.buffers" "$dir/c1.buffers" >"$dir/buffers.diff"
        ! grep -q '^>' "$dir/buffers.diff" || fail "the source's buffers are not the producer's in order"
        n_after=$(sed -n '/^event flush-stop/,$p' "$dir/c1.taps" | grep -c '^buffer')
        [[ $n_after == $(sed -n '/^event flush-stop/,$p' "$dir/p.taps" | grep -c '^buffer') && $n_after -gt 0 ]] ||
                fail "$n_after frames after the flush, not the producer's number"
        # filesink truncates its file at a flush-stop, so c1.raw and sent.raw hold the frames after the
        # flush only (the frames before it are compared byte for byte by the other cases): exactly
        # those, and the producer's.
        [[ $(stat -c %s "$dir/c1.raw") == $((n_after * FRAME)) ]] ||
                fail "c1.raw holds $(stat -c %s "$dir/c1.raw") bytes, not the $n_after frames after the flush"
        cmp <(tail -c $((n_after * FRAME)) "$dir/sent.raw") "$dir/c1.raw" ||
                fail "the frames after the flush differ from those the producer sent"
        n_before=$(sed -n '/^event flush-start/q; /^buffer/p' "$dir/c1.taps" | wc -l)
        echo "ok: a flush mid-stream replayed downstream; $n_before frames before it and $n_after after, each the producer's"
}

case_errors() {
        start_ns nobroker gpuipcsrc ring=x socket="$dir/nothing.sock" ! fakesink
        finish nobroker
        [[ $status != 0 && $status != 124 ]] || fail "a source without a broker did not fail"
        grep -qE "ERROR: .*cannot connect to the gpuipc broker: .*nothing.sock" "$dir/nobroker.log" ||
                fail "the error does not say it could not connect, and where"
        start_ns noname videotestsrc num-buffers=1 ! gpuipcsink
        finish noname
        [[ $status != 0 && $status != 124 ]] || fail "a sink without a ring name did not fail"
        grep -q "ERROR: .*no ring name: set the ring property" "$dir/noname.log" || fail "no ring name: no error saying so"
        start_ns noproducer gpuipcsrc ring=nobody timeout=300 ! fakesink
        finish noproducer
        [[ $status != 0 && $status != 124 ]] || fail "a source whose ring never came did not fail"
        grep -q "ERROR: .*ring 'nobody' did not let this member in within 300 ms" "$dir/noproducer.log" ||
                fail "a ring that never came: no error saying so"
        echo "ok: errors name their cause"
}

case_inspect() {
        local e p line desc
        declare -A props=(
                [gpuipcsink]="ring socket mode slots max-members slot-size lease-ms wait-members wait-timeout linger pool device frames copies"
                [gpuipcsrc]="ring socket timeout reconnect is-live frames copies skipped"
        )
        for e in gpuipcsink gpuipcsrc; do
                "${inspect[@]}" gst-inspect-1.0 "$e" >"$dir/$e.inspect" 2>&1 || fail "gst-inspect-1.0 $e failed"
                for p in ${props[$e]}; do
                        line=$(grep -E "^  $p +: " "$dir/$e.inspect") || fail "gst-inspect-1.0 $e does not list $p"
                        desc=${line#*: }
                        ((${#desc} >= 15)) || fail "$e's property $p has no real description: '$desc'"
                        grep -qE "^\| \`$p\` +\|" "$GPUIPC_SOURCE_ROOT/docs/gstreamer.md" ||
                                fail "docs/gstreamer.md's table of properties lacks $e's $p"
                done
        done
        echo "ok: every property described by gst-inspect-1.0 and in docs/gstreamer.md"
}

case_cuda() {
        local i
        "${inspect[@]}" gst-inspect-1.0 cudaupload >/dev/null 2>&1 && "${inspect[@]}" gst-inspect-1.0 cudadownload >/dev/null 2>&1 ||
                skip "no cudaupload/cudadownload: needs a GPU, its driver and gstreamer1.0-plugins-bad (nvcodec)"
        # Into a file first: under pipefail, grep -q stopping at the first match made gst-inspect-1.0
        # die of SIGPIPE, and the case skipped although the variant was there.
        "${inspect[@]}" gst-inspect-1.0 gpuipcsink >"$dir/gpuipcsink.inspect" 2>&1
        grep -q 'memory:CUDAMemory' "$dir/gpuipcsink.inspect" ||
                skip "the plugin was built without its CUDA variant (libgstreamer-plugins-bad1.0-dev, cuda.h)"
        reference ref "${SRC[@]}" num-buffers=60 ! "$CAPS"
        for i in 1 2; do
                start_ns "c$i" gpuipcsrc ring=rcu timeout=60000 ! "${TAP[@]}" ! cudadownload ! video/x-raw ! \
                        filesink location="$dir/c$i.raw"
        done
        start_ns p "${SRC[@]}" num-buffers=60 ! "$CAPS" ! cudaupload ! "video/x-raw(memory:CUDAMemory)" ! "${TAP[@]}" ! \
                gpuipcsink ring=rcu sync=false wait-members=2
        expect_ok p
        grep -q "cuda-vmm slots" "$dir/p.log" || fail "the ring's slots are not cuda-vmm"
        for i in 1 2; do
                expect_ok "c$i"
                check_consumer "c$i" "$dir/p.log" ref
        done
        echo "ok: 60 CUDA frames to 2 sources through cuda-vmm slots, byte for byte, with their timestamps"
}

# hostile NAME MEMBERS HOW: hostile-producer's ring NAME (latest mode), once MEMBERS members wait
# in it; its output in $dir/hostile-NAME.log.
hostile() {
        "$GPUIPC_GST_HOSTILE_PRODUCER" "$@" >"$dir/hostile-$1.log" 2>&1 &
        pids[hostile-$1]=$!
        logs+=("$dir/hostile-$1.log")
}

# stop_on_sigint NAME...: SIGINT to each pipeline, which must end with status 0 (a generous bound:
# the source notices within a slice of its wait).
stop_on_sigint() {
        local n
        for n in "$@"; do
                kill -INT "$(inner_pid "$n")"
        done
        for n in "$@"; do
                finish "$n" 30
                [[ $status == 0 ]] || fail "$n did not stop on SIGINT (status $status; 124: still running after 30 s)"
        done
}

case_hostile() {
        local n t0 ends
        [[ -x ${GPUIPC_GST_HOSTILE_PRODUCER:-} ]] || skip "hostile-producer was not built"
        # ahead: the newest frame is never in its slot, and the producer stays.
        start_ns ahead-eos -e gpuipcsrc ring=ahead timeout=60000 ! fakesink
        start_ns ahead-int gpuipcsrc ring=ahead timeout=60000 ! fakesink
        # max: a head past any frame ends the membership (hostile producer); reconnect=true then waits
        # for another producer of the ring.
        start_ns max-err gpuipcsrc ring=max timeout=60000 ! fakesink
        start_ns max-again -e gpuipcsrc ring=max timeout=60000 reconnect=true ! fakesink
        t0=$SECONDS
        # gone: as ahead, then the ring closed and its producer gone.
        start_ns gone-again -e gpuipcsrc ring=gone timeout=60000 reconnect=true ! fakesink
        hostile ahead 2 ahead
        hostile max 2 max
        hostile gone 1 gone
        for n in ahead max gone; do
                wait_log "$dir/hostile-$n.log" '^hostile$'
        done
        stop_on_sigint ahead-eos ahead-int
        finish max-err 30
        [[ $status != 0 && $status != 124 ]] || fail "the source without reconnect did not end with an error on a head past any frame (status $status)"
        grep -q 'gpuipc error revoked (-1017)' "$dir/max-err.log" || fail "max-err's error is not the library's revoked"
        wait_log "$dir/hostile-gone.log" '^gone$'
        for n in max-again gone-again; do
                wait_log "$dir/$n.log" "WARNING: from element .*gpuipcsrc0: ring '${n%-again}' ended"
        done
        sleep 2 # waiting for a producer again: a join, or a rejoin's pause
        # Each membership of max ends before its first frame: the rejoins pause, longer each time (0.2 s,
        # doubling up to 5 s), rather than end in a loop (hundreds a second). A slow machine only
        # makes fewer.
        ends=$(grep -c "WARNING: from element .*gpuipcsrc0: ring 'max' ended" "$dir/max-again.log")
        ((ends <= 8 + SECONDS - t0)) ||
                fail "max-again rejoined the hostile producer's ring $ends times in $((SECONDS - t0)) s: no pause between"
        stop_on_sigint max-again gone-again
        for n in ahead-eos max-again gone-again; do
                grep -q 'Got EOS from element' "$dir/$n.log" || fail "with -e, $n did not end with its end of stream"
        done
        kill_ns hostile-ahead
        kill_ns hostile-max
        echo "ok: sources waiting on a hostile ring's frame, or for another producer after one, stop on SIGINT"
}

# A source waiting for its ring when the sink makes it takes its seat within moments (it asks every
# 20 ms): a member seated while the ring is young starts at its first frame, so it misses none,
# wait-members=0 or not. 32 slots at 30 fps give it about a second to come, however busy the machine.
case_waiting_source() {
        reference ref "${SRC[@]}" num-buffers=120 ! "$CAPS"
        consumer c1 rw enable-last-sample=false
        wait_log "$dir/c1.log" "Setting pipeline to PAUSED"
        sleep 0.5 # its join is asking for the ring now
        producer p 120 rw sync=true slots=32
        expect_ok p
        expect_ok c1
        [[ $(stat_of "$dir/p.log" "frames published") == 120 ]] || fail "the sink did not publish 120 frames"
        [[ $(stat_of "$dir/c1.log" "frames pushed") == 120 ]] ||
                fail "the waiting source pushed $(stat_of "$dir/c1.log" "frames pushed") of 120 frames"
        check_consumer c1 "$dir/p.log" ref
        echo "ok: a source waiting for the ring got all 120 frames, the first among them, without wait-members"
}

[[ $# == 1 ]] || { sed -n '2,34p' "$0"; exit 2; }
setup
trap cleanup EXIT
case $1 in
one) case_one ;;
fanout) case_fanout ;;
kill-source) case_kill_source ;;
kill-sink) case_kill_sink ;;
caps-change) case_caps_change ;;
latest) case_latest ;;
flush) case_flush ;;
errors) case_errors ;;
inspect) case_inspect ;;
hostile) case_hostile ;;
waiting-source) case_waiting_source ;;
cuda) case_cuda ;;
*) echo "unknown case $1"; exit 2 ;;
esac
sanitizer_verdict
