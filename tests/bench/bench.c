/* gpuipc-bench: how gpuipc-broker performs next to baselines measured in the same run.
 *
 * Sections (flags select them; none selects every CPU section):
 *   --latency     round trips of publish, attach (cached, uncached), release, ping vs a raw
 *                 SOCK_SEQPACKET ping-pong of the same sizes, with and without an fd
 *   --throughput  ops/s and broker CPU per op with 1..256 client processes vs an epoll echo server
 *   --fanout      publish until N waiting consumers hold a mapping vs sending the fd to N sockets
 *   --scale       100k buffers and 1k peers: broker RSS, lookups, cleanup after a dead peer
 *   --seed        the handle file polled every 2 s (and an inotify variant) vs attach-with-wait
 *   --ring        frames through a ring's shared memory (handoff latency, frames/s) vs a round trip
 *   --fairness    8 normal clients' p50/p99 next to floods (pings, listings, another uid's) vs
 *                 without one, with no CPU quota and under one (250m)
 *   --gpu         CUDA attach, bandwidth through a mapping, and PyTorch's IPC (torch_compare.py)
 * Not a test: it prints a table, states the machine, and writes raw numbers with --out DIR. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "config.h"
#include "macro.h"

static char command_line[1024];

static void usage(FILE *f)
{
        fprintf(f, "Usage: gpuipc-bench [OPTIONS]\n"
                   "Measures gpuipc-broker against baselines taken in the same run and prints one table.\n\n"
                   "Sections (none given: every CPU section):\n"
                   "      --latency           round-trip latency, p50/p99, vs raw ping-pong\n"
                   "      --throughput        ops/s with 1, 8, 64, 256 clients, broker CPU per op\n"
                   "      --fanout            publish -> N waiting consumers mapped (N = 1, 16, 128)\n"
                   "      --scale             100k buffers, 1k peers: RSS, lookup, dead-peer cleanup\n"
                   "      --seed              handle file polled every 2 s / inotify vs attach-with-wait\n"
                   "      --ring              ring handoff p50/p99 (futex wake, spin), frames/s vs a round trip\n"
                   "      --fairness          8 clients' p99 next to a flood vs alone, without and with a CPU quota\n"
                   "      --gpu               CUDA kinds and PyTorch's IPC (skips without a GPU)\n"
                   "      --gpu-rings         only --gpu's ring rows: C and Python rings, floors, torch's ring\n"
                   "      --all               every section, --gpu included\n\n"
                   "Options:\n"
                   "  -q, --quick             a smoke run (under a minute for the CPU sections)\n"
                   "  -o, --out DIR           write raw numbers (CSV) and results.json to DIR\n"
                   "      --broker PATH       gpuipc-broker to run (default: this build's; $GPUIPC_BROKER)\n"
                   "      --seccomp MODE      the broker's --seccomp (default enforce, as deployed)\n"
                   "      --python PATH       interpreter for torch_compare.py (default python3)\n"
                   "      --no-torch          skip the PyTorch comparison in --gpu\n"
                   "      --no-mps            skip --gpu's second pass of the ring rows under an MPS daemon\n"
                   "      --fair-quota CPUS   fairness: the broker's cgroup quota (default 250m; none: no quota run)\n"
                   "      --old-broker PATH   fairness: run every pass on this broker too (an older build)\n"
                   "      --fair-repeat N     fairness: passes of each flood per broker, as medians (default 3)\n"
                   "      --fair-rate N       fairness: each normal client pings N times a second, its latency\n"
                   "                          counted from when each ping was due (default 0: a closed loop)\n"
                   "      --pin same|split    latency: client and server on one CPU, or on two; ring: producer\n"
                   "                          and members (and the raw floors) on CPU 0, or members on the\n"
                   "                          others (default: wherever the scheduler puts them)\n"
                   "  -h, --help\n");
}

/* mkdir -p */
static int make_dirs(const char *path)
{
        char buf[4096];

        snprintf(buf, sizeof(buf), "%s", path);
        for (char *p = buf + 1; *p; p++) {
                if (*p != '/')
                        continue;
                *p = 0;
                if (mkdir(buf, 0755) < 0 && errno != EEXIST)
                        return -errno;
                *p = '/';
        }
        return mkdir(buf, 0755) < 0 && errno != EEXIST ? -errno : 0;
}

/* "250m", "0.25" or "none" in thousandths of a CPU. */
static int parse_quota(const char *s, unsigned *ret)
{
        char *end;
        double v;

        if (strcmp(s, "none") == 0) {
                *ret = 0;
                return 0;
        }
        errno = 0;
        v = strtod(s, &end);
        if (errno || end == s || v < 0 || v > 1000000)
                return -EINVAL;
        if (strcmp(end, "m") == 0)
                v /= 1000;
        else if (*end)
                return -EINVAL;
        *ret = (unsigned)(v * 1000 + 0.5);
        return 0;
}

static void parse_args(int argc, char **argv)
{
        enum {
                O_LAT = 256,
                O_TP,
                O_FAN,
                O_SCALE,
                O_SEED,
                O_GPU,
                O_RING,
                O_ALL,
                O_BROKER,
                O_SECCOMP,
                O_PYTHON,
                O_NO_TORCH,
                O_NO_MPS,
                O_GPU_RINGS,
                O_PIN,
                O_FAIR,
                O_FAIR_QUOTA,
                O_OLD_BROKER,
                O_FAIR_REPEAT,
                O_FAIR_RATE
        };
        static const struct option opts[] = {
                {"latency", no_argument, NULL, O_LAT},
                {"throughput", no_argument, NULL, O_TP},
                {"fanout", no_argument, NULL, O_FAN},
                {"scale", no_argument, NULL, O_SCALE},
                {"seed", no_argument, NULL, O_SEED},
                {"gpu", no_argument, NULL, O_GPU},
                {"ring", no_argument, NULL, O_RING},
                {"all", no_argument, NULL, O_ALL},
                {"quick", no_argument, NULL, 'q'},
                {"out", required_argument, NULL, 'o'},
                {"broker", required_argument, NULL, O_BROKER},
                {"seccomp", required_argument, NULL, O_SECCOMP},
                {"python", required_argument, NULL, O_PYTHON},
                {"no-torch", no_argument, NULL, O_NO_TORCH},
                {"no-mps", no_argument, NULL, O_NO_MPS},
                {"gpu-rings", no_argument, NULL, O_GPU_RINGS},
                {"help", no_argument, NULL, 'h'},
                {"pin", required_argument, NULL, O_PIN},
                {"fairness", no_argument, NULL, O_FAIR},
                {"fair-quota", required_argument, NULL, O_FAIR_QUOTA},
                {"old-broker", required_argument, NULL, O_OLD_BROKER},
                {"fair-repeat", required_argument, NULL, O_FAIR_REPEAT},
                {"fair-rate", required_argument, NULL, O_FAIR_RATE},
                {},
        };
        BenchOpts *o = &bench_opts;
        size_t len = 0;
        int c;

        for (int i = 0; i < argc && len < sizeof(command_line) - 1; i++)
                len += (size_t)snprintf(command_line + len, sizeof(command_line) - len, "%s%s", i ? " " : "",
                                        argv[i]);
        o->broker = getenv("GPUIPC_BROKER") ? getenv("GPUIPC_BROKER") : BENCH_BROKER;
        o->seccomp = "enforce";
        o->fair_quota_milli = 250;
        o->fair_repeat = 3;
        o->python = "python3";
        o->torch_script = BENCH_SOURCE_ROOT "/tests/bench/torch_compare.py";
        o->libgpuipc_path = BENCH_BUILD_ROOT "/client/libgpuipc.so";
        o->python_path = BENCH_SOURCE_ROOT "/python";
        while ((c = getopt_long(argc, argv, "qo:h", opts, NULL)) != -1) {
                switch (c) {
                case O_LAT:
                        o->sections |= SEC_LATENCY;
                        break;
                case O_TP:
                        o->sections |= SEC_THROUGHPUT;
                        break;
                case O_FAN:
                        o->sections |= SEC_FANOUT;
                        break;
                case O_SCALE:
                        o->sections |= SEC_SCALE;
                        break;
                case O_SEED:
                        o->sections |= SEC_SEED;
                        break;
                case O_GPU:
                        o->sections |= SEC_GPU;
                        break;
                case O_RING:
                        o->sections |= SEC_RING;
                        break;
                case O_ALL:
                        o->sections |= SEC_CPU_ALL | SEC_GPU;
                        break;
                case 'q':
                        o->quick = true;
                        break;
                case 'o':
                        o->out_dir = optarg;
                        break;
                case O_BROKER:
                        o->broker = optarg;
                        break;
                case O_SECCOMP:
                        o->seccomp = optarg;
                        break;
                case O_PYTHON:
                        o->python = optarg;
                        break;
                case O_NO_TORCH:
                        o->torch_script = NULL;
                        break;
                case O_NO_MPS:
                        o->no_mps = true;
                        break;
                case O_GPU_RINGS:
                        o->gpu_rings_only = true;
                        o->sections |= SEC_GPU;
                        break;
                case O_PIN:
                        o->pin = optarg;
                        break;
                case O_FAIR:
                        o->sections |= SEC_FAIRNESS;
                        break;
                case O_FAIR_QUOTA:
                        if (parse_quota(optarg, &o->fair_quota_milli) < 0)
                                die("--fair-quota is thousandths of a CPU (250m), CPUs (0.25) or none");
                        break;
                case O_OLD_BROKER:
                        o->old_broker = optarg;
                        break;
                case O_FAIR_REPEAT:
                        o->fair_repeat = atoi(optarg);
                        if (o->fair_repeat < 1 || o->fair_repeat > FAIR_REPEAT_MAX)
                                die("--fair-repeat is 1 to %d", FAIR_REPEAT_MAX);
                        break;
                case O_FAIR_RATE: {
                        char *end;

                        errno = 0;
                        o->fair_rate = strtoul(optarg, &end, 10);
                        if (errno || end == optarg || *end || o->fair_rate > 1000000)
                                die("--fair-rate is pings a second per client, 0 (a closed loop) to 1000000");
                        break;
                }
                case 'h':
                        usage(stdout);
                        exit(0);
                default:
                        usage(stderr);
                        exit(2);
                }
        }
        if (optind < argc) {
                usage(stderr);
                exit(2);
        }
        if (!o->sections)
                o->sections = SEC_CPU_ALL;
        if (o->pin && strcmp(o->pin, "same") != 0 && strcmp(o->pin, "split") != 0)
                die("--pin is same or split");
        if (o->pin && strcmp(o->pin, "split") == 0 && sysconf(_SC_NPROCESSORS_ONLN) < 2)
                die("--pin split needs two CPUs");
        if (o->out_dir && make_dirs(o->out_dir) < 0)
                die("cannot create %s: %s", o->out_dir, strerror(errno));
        if (o->old_broker && access(o->old_broker, X_OK) < 0)
                die("cannot run the broker %s (--old-broker PATH)", o->old_broker);
        if (access(o->broker, X_OK) < 0)
                die("cannot run the broker %s (--broker PATH)", o->broker);
}

/* ---- the machine ---- */

static void describe_machine(Machine *m)
{
        char line[512];
        struct utsname u;
        FILE *f;

        snprintf(m->cpu, sizeof(m->cpu), "unknown CPU");
        f = fopen("/proc/cpuinfo", "re");
        while (f && fgets(line, sizeof(line), f)) {
                if (strncmp(line, "model name", 10) == 0 && strchr(line, ':')) {
                        snprintf(m->cpu, sizeof(m->cpu), "%s", strchr(line, ':') + 2);
                        m->cpu[strcspn(m->cpu, "\n")] = 0;
                        break;
                }
        }
        if (f)
                fclose(f);
        m->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (uname(&u) == 0)
                snprintf(m->kernel, sizeof(m->kernel), "%.40s %.80s %.20s", u.sysname, u.release, u.machine);
        f = fopen("/proc/meminfo", "re");
        while (f && fgets(line, sizeof(line), f)) {
                if (strncmp(line, "MemTotal:", 9) == 0)
                        m->mem_mib = strtoull(line + 9, NULL, 10) / 1024;
        }
        if (f)
                fclose(f);
        gpu_describe(m->gpus, sizeof(m->gpus));
}

/* ---- running sections ---- */

typedef struct Section {
        unsigned bit;
        const char *name;
        void (*fn)(void);
} Section;

static const Section sections[] = {
        {SEC_LATENCY, "latency", section_latency}, {SEC_THROUGHPUT, "throughput", section_throughput},
        {SEC_FANOUT, "fanout", section_fanout},    {SEC_SCALE, "scale", section_scale},
        {SEC_SEED, "seed", section_seed},          {SEC_RING, "ring", section_ring},
        {SEC_FAIRNESS, "fairness", section_fairness}, {SEC_GPU, "gpu", section_gpu},
};

/* Runs a section in its own process group, so whatever it started goes with it. */
static int run_section(const Section *s)
{
        uint64_t t0 = monotonic_ns();
        pid_t pid;
        int rc;

        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid < 0)
                die("fork: %s", strerror(errno));
        if (pid == 0) {
                setpgid(0, 0);
                section_name = s->name;
                s->fn();
                fflush(stdout);
                exit(0);
        }
        setpgid(pid, pid);
        rc = child_wait(pid);
        kill(-pid, SIGKILL);
        while (waitpid(-pid, NULL, WNOHANG) > 0)
                ;
        fprintf(stderr, "[%s] %s in %.1f s\n", s->name, rc == 0 ? "done" : "FAILED",
                (double)(monotonic_ns() - t0) / 1e9);
        return rc;
}

/* ---- output ---- */

static const char *fmt_num(double v, char *buf, size_t cap)
{
        double a = fabs(v);

        if (isnan(v))
                snprintf(buf, cap, "-");
        else if (a >= 1000)
                snprintf(buf, cap, "%.0f", v);
        else if (a >= 10)
                snprintf(buf, cap, "%.1f", v);
        else if (a >= 0.1)
                snprintf(buf, cap, "%.2f", v);
        else
                snprintf(buf, cap, "%.3g", v);
        return buf;
}

static const char *verdict_name(Verdict v)
{
        return v == VERDICT_MET ? "met" : v == VERDICT_MISSED ? "MISSED" : "";
}

static void print_table(FILE *f)
{
        const char *last = "";
        char a[32], b[32], r[32];

        fprintf(f, "\n%-56s %14s  %-34s %10s %9s  %-12s %-7s %s\n", "metric", "value", "baseline (same run)",
                "baseline", "ratio", "target", "verdict", "note");
        for (int i = 0; i < table->n; i++) {
                const Row *x = &table->rows[i];
                char value[48], base[48], ratio[32];

                if (strcmp(last, x->section) != 0) {
                        fprintf(f, "-- %s --\n", x->section);
                        last = x->section;
                }
                snprintf(value, sizeof(value), "%s %s", fmt_num(x->value, a, sizeof(a)), x->unit);
                snprintf(base, sizeof(base), "%s", isnan(x->base) ? "-" : fmt_num(x->base, b, sizeof(b)));
                if (!isnan(x->ratio) && x->ratio > 0 && x->ratio < 0.01)
                        snprintf(ratio, sizeof(ratio), "1/%.0fx", 1 / x->ratio);
                else
                        snprintf(ratio, sizeof(ratio), "%s%s", fmt_num(x->ratio, r, sizeof(r)),
                                 isnan(x->ratio) ? "" : "x");
                fprintf(f, "%-56s %14s  %-34s %10s %9s  %-12s %-7s %s\n", x->metric, value, x->baseline,
                        base, ratio, x->target, verdict_name(x->verdict), x->note);
        }
}

static void json_str(FILE *f, const char *s)
{
        fputc('"', f);
        for (; *s; s++) {
                if (*s == '"' || *s == '\\')
                        fprintf(f, "\\%c", *s);
                else if ((unsigned char)*s < 0x20)
                        fprintf(f, "\\u%04x", *s);
                else
                        fputc(*s, f);
        }
        fputc('"', f);
}

static void json_num(FILE *f, double v)
{
        if (isnan(v) || isinf(v))
                fprintf(f, "null");
        else
                fprintf(f, "%.6g", v);
}

static void write_results(const Machine *m)
{
        FILE *f = out_open("results.json", NULL), *csv = out_open("table.csv", NULL);

        if (!f || !csv)
                return;
        fprintf(f, "{\n  \"command\": ");
        json_str(f, command_line);
        fprintf(f, ",\n  \"quick\": %s,\n  \"machine\": {\"cpu\": ", bench_opts.quick ? "true" : "false");
        json_str(f, m->cpu);
        fprintf(f, ", \"cores\": %d, \"kernel\": ", m->cores);
        json_str(f, m->kernel);
        fprintf(f, ", \"memory_mib\": %llu, \"gpus\": ", (unsigned long long)m->mem_mib);
        json_str(f, m->gpus);
        fprintf(f, "},\n  \"rows\": [\n");
        fprintf(csv, "section,metric,value,unit,baseline,baseline_value,ratio,target,verdict,note\n");
        for (int i = 0; i < table->n; i++) {
                const Row *x = &table->rows[i];
                const char *keys[] = {"section", "metric", "unit", "baseline", "target", "verdict", "note"};
                const char *vals[] = {x->section,  x->metric, x->unit,
                                      x->baseline, x->target, verdict_name(x->verdict),
                                      x->note};

                fprintf(f, "    {");
                for (size_t k = 0; k < 7; k++) {
                        fprintf(f, "%s\"%s\": ", k ? ", " : "", keys[k]);
                        json_str(f, vals[k]);
                }
                fprintf(f, ", \"value\": ");
                json_num(f, x->value);
                fprintf(f, ", \"baseline_value\": ");
                json_num(f, x->base);
                fprintf(f, ", \"ratio\": ");
                json_num(f, x->ratio);
                fprintf(f, "}%s\n", i + 1 < table->n ? "," : "");
                fprintf(csv, "%s,\"%s\",%.6g,%s,\"%s\",%.6g,%.6g,\"%s\",%s,\"%s\"\n", x->section, x->metric,
                        x->value, x->unit, x->baseline, x->base, x->ratio, x->target,
                        verdict_name(x->verdict), x->note);
        }
        fprintf(f, "  ]\n}\n");
        fclose(f);
        fclose(csv);
}

int main(int argc, char **argv)
{
        int failed = 0, met = 0, missed = 0;

        signal(SIGPIPE, SIG_IGN);
        if (argc > 1 && strcmp(argv[1], "--victim") == 0)
                return victim_main(argc, argv);
        parse_args(argc, argv);
        table = shared_alloc(sizeof(*table));
        machine = shared_alloc(sizeof(*machine));
        describe_machine(machine);

        printf("gpuipc-bench %s%s\n", GPUIPC_VERSION, bench_opts.quick ? " (quick)" : "");
        printf("machine: %s, %d cores, %llu MiB, %s\n", machine->cpu, machine->cores,
               (unsigned long long)machine->mem_mib, machine->kernel);
        printf("GPUs:    %s\n", machine->gpus[0] ? machine->gpus : "none");
        printf("broker:  %s --seccomp %s\n", bench_opts.broker, bench_opts.seccomp);
        if (bench_opts.pin)
                printf("latency: client and servers pinned to %s\n",
                       strcmp(bench_opts.pin, "same") == 0 ? "CPU 0 together"
                                                           : "CPU 0 (client) and CPU 1 (broker, echo)");
        printf("command: %s\n", command_line);
        fflush(stdout);

        for (size_t i = 0; i < ARRAY_SIZE(sections); i++) {
                if (bench_opts.sections & sections[i].bit)
                        failed += run_section(&sections[i]) != 0;
        }

        print_table(stdout);
        for (int i = 0; i < table->n; i++) {
                met += table->rows[i].verdict == VERDICT_MET;
                missed += table->rows[i].verdict == VERDICT_MISSED;
        }
        printf("\ntargets: %d met, %d missed; %d section(s) failed\n", met, missed, failed);
        write_results(machine);
        return failed ? 1 : 0;
}
