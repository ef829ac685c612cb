# Plots gpuipc-bench's raw numbers: latency percentiles of four operations against their
# baselines, and fan-out time against the number of consumers.
#   gnuplot -c tests/bench/plot.gp OUT_DIR PNG_PREFIX
# OUT_DIR is what gpuipc-bench --out wrote; writes PNG_PREFIX-latency.png and PNG_PREFIX-fanout.png
# (docs/performance uses PNG_PREFIX = docs/performance). Needs gnuplot with the pngcairo terminal
# (Debian: gnuplot-nox).

dir = ARG1
prefix = ARG2
lat = dir . "/latency_percentiles.csv"
fan = dir . "/fanout_summary.csv"
set datafile separator ","

# ---- latency: x is the percentile on a "nines" scale ----
set terminal pngcairo size 1400,900 font "sans,10" noenhanced
set output prefix . "-latency.png"
set multiplot layout 2,2 title "gpuipc round trips vs a raw SOCK_SEQPACKET ping-pong of the same sizes (same run)"
nines(p) = -log10(1 - p / 100.0)
set xtics ("50" nines(50), "90" nines(90), "99" nines(99), "99.9" nines(99.9))
set xrange [nines(1):nines(99.9)]
set xlabel "percentile"
set ylabel "microseconds"
set logscale y
set grid
set key top left

series(op, s) = sprintf("< awk -F, '$1==\"%s\" && $2==\"%s\"' %s", op, s, lat)

set title "ping"
plot series("ping", "gpuipc") using (nines($3)):4 with linespoints lw 2 title "libgpuipc", \
     series("ping", "direct") using (nines($3)):4 with linespoints title "raw client -> broker", \
     series("ping", "raw") using (nines($3)):4 with linespoints title "raw ping-pong"

set title "attach, cached (no fd, no mmap)"
plot series("attach_cached", "gpuipc") using (nines($3)):4 with linespoints lw 2 title "libgpuipc", \
     series("attach_cached", "direct") using (nines($3)):4 with linespoints title "raw client -> broker", \
     series("attach_cached", "raw") using (nines($3)):4 with linespoints title "raw ping-pong"

set title "attach, uncached (the fd travels, the client maps it)"
plot series("attach_uncached", "gpuipc") using (nines($3)):4 with linespoints lw 2 title "libgpuipc", \
     series("attach_uncached", "direct") using (nines($3)):4 with linespoints title "raw client -> broker (fd closed)", \
     series("attach_uncached", "raw_fd") using (nines($3)):4 with linespoints title "raw ping-pong + fd", \
     series("attach_uncached", "raw") using (nines($3)):4 with linespoints title "raw ping-pong"

set title "publish new memfd (the fd travels to the broker)"
plot series("publish", "gpuipc") using (nines($3)):4 with linespoints lw 2 title "libgpuipc", \
     series("publish", "raw_fd") using (nines($3)):4 with linespoints title "raw ping-pong + fd", \
     series("publish", "raw") using (nines($3)):4 with linespoints title "raw ping-pong"
unset multiplot

# ---- fan-out: p50 over trials, bars from p10 to p90 ----
set terminal pngcairo size 900,600 font "sans,10" noenhanced
set output prefix . "-fanout.png"
set title "publish until all N waiting consumers hold a mapping (p50 of trials, bars p10..p90)"
unset xtics
set xtics ("1" 1, "16" 16, "128" 128)
set xrange [0.7:180]
set logscale x
set logscale y
set xlabel "consumers (processes)"
set ylabel "microseconds after publish"
set key top left
fanseries(s) = sprintf("< awk -F, '$2==\"%s\"' %s", s, fan)
plot fanseries("gpuipc") using 1:4:3:5 with yerrorlines lw 2 lc rgb "#8000c0" title "gpuipc: consumers waiting in attach", \
     fanseries("raw") using 1:4:3:5 with yerrorlines lw 2 lc rgb "#008060" title "raw: fd sent to N sockets by hand", \
     fanseries("gpuipc") using 1:6 with linespoints dt 2 lc rgb "#8000c0" title "gpuipc, median consumer", \
     fanseries("raw") using 1:6 with linespoints dt 2 lc rgb "#008060" title "raw, median consumer"
