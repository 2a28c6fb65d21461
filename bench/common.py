"""Shared harness of the vale benchmarks (Python 3 standard library only).

What every bench/*.py script uses: the description of the machine and the date, medians with
min and max, the command-line options they all have (--runs, --seconds, --quick, --layout,
--out, --no-peers), CPU layouts, clean-up on exit / error / Ctrl-C / SIGTERM, apt-get for
missing tools, CPU time of a process from /proc, and a valed of our own with vale-pktgen
senders and receivers around it. The peers (Linux bridge, Open vSwitch, DPDK testpmd over memif)
are in peers.py.
"""
import argparse, atexit, json, os, platform, shutil, signal, statistics, subprocess, sys, tempfile, time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# VALE_BIN_DIR: another build's binaries (to compare two builds in alternate runs).
BIN = os.environ.get("VALE_BIN_DIR") or os.path.join(ROOT, "target", "release")
RESULTS = os.path.join(ROOT, "bench", "results")
CMD_TIMEOUT = 30          # seconds, for every short command
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOAD_AT_START = os.getloadavg()   # 1, 5, 15-minute load averages when the script started
# Slots per ring of vale-pktgen in the benchmarks (--slots; None: its default).
SLOTS = None

# CPU layouts for vale: which vCPUs valed, the sender(s) and the receiver(s) may run on
# (`taskset -c`). The machine this was written for has 2 vCPUs; "own" (a CPU each for sender,
# valed and receiver, on distinct cores where it can) needs 3 and is None with fewer.
LAYOUTS = {
    "split": {"valed": "1", "tx": "0", "rx": "0"},        # switch alone on cpu1; clients share cpu0
    "shared": {"valed": "0,1", "tx": "0,1", "rx": "0,1"},  # no pinning: the scheduler decides
    "own": None,                                           # filled in below from the topology
}


def cpu_topology():
    """[(cpu, (package, core))] of the online CPUs, from /sys (cpu, (0, cpu)) where it says nothing."""
    out = []
    for cpu in sorted(os.sched_getaffinity(0)):
        t = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{t}/physical_package_id") as f, open(f"{t}/core_id") as g:
                out.append((cpu, (int(f.read()), int(g.read()))))
        except (OSError, ValueError):
            out.append((cpu, (0, cpu)))
    return out


def spread_cpus(n):
    """n CPUs we may run on, one per physical core as long as there are cores (hyperthread
    siblings last); fewer when there are fewer CPUs."""
    seen, first, rest = set(), [], []
    for cpu, core in cpu_topology():
        (rest if core in seen else first).append(cpu)
        seen.add(core)
    return (first + rest)[:n]


def cpu_set(spec):
    """The CPUs a taskset list names ("0,2-4" -> {0, 2, 3, 4})."""
    out = set()
    for part in str(spec).split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


_own = spread_cpus(3)
if len(_own) == 3:
    LAYOUTS["own"] = {"tx": str(_own[0]), "valed": str(_own[1]), "rx": str(_own[2])}


# ---------------------------------------------------------------- reports

def machine_info():
    """The machine every figure was taken on: {model (from /proc/cpuinfo), cpus (online,
    usable by us), cores (physical: distinct package and core ids), threads_per_core, kernel}.
    Every JSON carries it (`cpu`) and every table names it (describe())."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    topo = cpu_topology()
    cores = len({core for _, core in topo})
    return {"model": model, "cpus": len(topo), "cores": cores,
            "threads_per_core": round(len(topo) / cores) if cores else None, "kernel": platform.release()}


def machine():
    """CPU model, vCPU count, cores and kernel: the same string in every JSON of a machine."""
    m = machine_info()
    return f"{m['model']}, {m['cpus']} vCPU ({m['cores']} cores), Linux {m['kernel']}"


def describe(layout=None):
    """One line for the top of a printed table: the machine, and the CPU layout if given."""
    return f"machine: {machine()}" + (f"; layout: {layout}" if layout else "")


def utc_now():
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def summary(values):
    """{median, min, max, runs} of a list of numbers (None when the list is empty)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def ratio(a, b):
    """Ratio of two summaries' medians, or None."""
    if not a or not b or not b["median"]:
        return None
    return a["median"] / b["median"]


def mpps(s, digits=2):
    """'median (min-max)' in Mpps of a pps summary."""
    if not s:
        return "-"
    return f"{s['median']/1e6:.{digits}f} ({s['min']/1e6:.{digits}f}-{s['max']/1e6:.{digits}f})"


def fmt_ratio(r):
    if r is None:
        return "-"
    return f"{r:.0f}x" if r >= 10 else f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


def table(headers, rows):
    """Prints rows (lists of strings) under headers, columns aligned."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)), flush=True)


def write_report(path, experiment, args, cpu_layout, results, **extra):
    """Writes the JSON every script writes; returns the dict."""
    report = {
        "experiment": experiment,
        "date": utc_now(),
        "machine": machine(),
        "cpu": machine_info(),
        # Anything else running moves the figures: the load averages when the script started and ended.
        "loadavg": {"start": LOAD_AT_START, "end": os.getloadavg()},
        "cpu_layout": cpu_layout,
        "runs": args.runs,
        "seconds": args.seconds,
        # Slots per ring of vale's clients (vale-pktgen's default when null: 1024).
        "slots": getattr(args, "slots", None),
        "quick": args.quick,
        "results": results,
    }
    report.update(extra)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"JSON: {os.path.relpath(path)}")
    return report


def load_result(results, name):
    """The JSON an experiment wrote to `results`/`name`.json, or None if there is none."""
    try:
        with open(os.path.join(results, f"{name}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- command line

def parser(doc, name, runs=5, seconds=2.0, peers=True, layouts=None):
    """The options every experiment has; `name` names its JSON file; `layouts`: the names
    --layout takes when an experiment has its own (default LAYOUTS')."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=runs, help=f"runs per point; the median is reported (default {runs})")
    ap.add_argument("--seconds", type=float, default=seconds,
                    help=f"measured seconds per run (default {seconds:g})")
    ap.add_argument("--quick", action="store_true",
                    help="a short check that everything works: 2 runs of 0.5 s and fewer points; "
                         "the figures are not worth quoting")
    ap.add_argument("--layout", choices=sorted(layouts or LAYOUTS), default="split",
                    help="where vale's processes run: split = valed alone on cpu1, senders and "
                         "receivers on cpu0; shared = nothing pinned; own = sender, valed and "
                         "receiver a CPU each (3 or more CPUs) (default split)"
                         if not layouts else "CPU layout (default split; see above)")
    if peers:
        ap.add_argument("--no-peers", action="store_true",
                        help="measure vale only (no Linux bridge, Open vSwitch or DPDK): no ratios")
    ap.add_argument("--slots", type=int, default=None,
                    help="slots per ring of vale's benchmark clients (vale-pktgen --slots, a power of "
                         "two 64-4096; default vale-pktgen's, 1024). Deeper rings let a sender and a "
                         "receiver that share a CPU move more frames per context switch")
    ap.add_argument("--out", default=os.path.join(RESULTS, f"{name}.json"),
                    help=f"JSON output (default bench/results/{name}.json)")
    return ap


def parse(ap, argv=None):
    global SLOTS
    a = ap.parse_args(argv)
    SLOTS = a.slots
    if a.quick:
        a.runs, a.seconds = min(a.runs, 2), min(a.seconds, 0.5)
    if a.runs < 1 or a.seconds <= 0:
        ap.error("--runs must be >= 1 and --seconds > 0")
    if getattr(a, "layout", None) in LAYOUTS and LAYOUTS[a.layout] is None:
        ap.error(f"--layout {a.layout} gives sender, valed and receiver a CPU each: it needs 3 CPUs, "
                 f"this machine has {len(cpu_topology())}")
    return a


def int_list(s):
    return [int(x) for x in s.split(",") if x.strip()]


def float_list(s):
    return [float(x) for x in s.split(",") if x.strip()]


# ---------------------------------------------------------------- clean-up and processes

_cleanups = []


def on_exit(fn):
    """Registers fn to run at exit, last registered first (also on errors and signals)."""
    _cleanups.append(fn)
    return fn


def cleanup():
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - clean-up goes on whatever failed
            print(f"cleanup: {e}", file=sys.stderr)


def _on_signal(signum, _frame):
    raise SystemExit(f"stopped by signal {signum}")   # unwinds through finally blocks, then atexit


def install_cleanup():
    """Clean-up on normal exit, on an exception, on Ctrl-C, SIGTERM and SIGHUP."""
    atexit.register(cleanup)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)


def main_guard(main):
    """Runs main() so that Ctrl-C gives one line and every clean-up runs."""
    install_cleanup()
    try:
        main()
    except KeyboardInterrupt:
        cleanup()
        sys.exit("interrupted; everything started was stopped")
    finally:
        cleanup()


def sh(args, timeout=CMD_TIMEOUT, check=True, env=None):
    """Runs a command and returns its stdout; on failure raises with its stderr."""
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p.stdout


def spawn(args, **kw):
    """Starts a process in its own process group; it is killed at clean-up if still running."""
    kw.setdefault("stdin", subprocess.DEVNULL)
    p = subprocess.Popen(args, start_new_session=True, **kw)
    on_exit(lambda: stop(p, signal.SIGKILL, 2))
    return p


def pktgen_reports(procs, what):
    """The JSON report each finished vale-pktgen of `procs` ((process, log file) pairs) printed;
    an error quoting the log of one that printed none."""
    out = []
    for p, log in procs:
        text = p.stdout.read()
        try:
            out.append(json.loads(text))
        except ValueError:
            log.seek(0)
            raise RuntimeError(f"vale-pktgen {what} gave no report (exit {p.returncode}): {log.read()[-2000:]}")
    return out


def stop(p, sig=signal.SIGINT, wait=5):
    """Signals p's process group, then SIGKILLs it if it lingers; returns its exit code."""
    for s in (sig, signal.SIGKILL):
        if p.poll() is not None:
            break
        try:
            os.killpg(p.pid, s)
        except ProcessLookupError:
            break
        try:
            p.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    return p.poll()


def cpu_seconds(pid):
    """User + system CPU seconds of a process (all its threads) so far, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK   # utime, stime (fields 14, 15)


def thread_times(pid):
    """{tid: {name, run_ns, delay_ns, nonvoluntary}} of every live thread of a process: the
    time each has run on a CPU and waited runnable for one (/proc/PID/task/TID/schedstat, in
    ns; from stat's utime + stime, in clock ticks, where there is no schedstat) and how often
    it was preempted (nonvoluntary_ctxt_switches). A thread that ends between two reads takes
    its time with it: read around a stretch where the threads that matter live throughout."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        t = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{t}/comm") as f:
                name = f.read().strip()
            try:
                with open(f"{t}/schedstat") as f:
                    run, delay = (int(x) for x in f.read().split()[:2])
            except OSError:
                with open(f"{t}/stat") as f:
                    stat = f.read()
                fields = stat[stat.rindex(")") + 2:].split()
                run, delay = (int(fields[11]) + int(fields[12])) * 10**9 // CLK_TCK, 0
            nonvol = 0
            with open(f"{t}/status") as f:
                for line in f:
                    if line.startswith("nonvoluntary_ctxt_switches:"):
                        nonvol = int(line.split()[1])
        except (OSError, ValueError):
            continue    # the thread ended while we read it
        out[int(tid)] = {"name": name, "run_ns": run, "delay_ns": delay, "nonvoluntary": nonvol}
    return out


def thread_delta(before, after):
    """What the threads of two thread_times() reads did between them: {total_ns, by_name: {name:
    {run_ns, delay_ns, nonvoluntary, threads}}, ended: threads of `before` gone from `after`}."""
    by_name, total = {}, 0
    for tid, x in after.items():
        b = before.get(tid, {"run_ns": 0, "delay_ns": 0, "nonvoluntary": 0})
        d = by_name.setdefault(x["name"], {"run_ns": 0, "delay_ns": 0, "nonvoluntary": 0, "threads": 0})
        for k in ("run_ns", "delay_ns", "nonvoluntary"):
            d[k] += x[k] - b[k]
        d["threads"] += 1
        total += x["run_ns"] - b["run_ns"]
    return {"total_ns": total, "by_name": by_name, "ended": len(set(before) - set(after))}


_tsc = {}


def _rdtsc():
    """A callable that returns the CPU's time-stamp counter (x86-64 only): ten bytes of machine
    code (rdtsc; shl rdx, 32; or rax, rdx; ret) in an executable page of our own."""
    import ctypes, mmap
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(bytes([0x0F, 0x31, 0x48, 0xC1, 0xE2, 0x20, 0x48, 0x09, 0xD0, 0xC3]))
    fn = ctypes.CFUNCTYPE(ctypes.c_uint64)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    fn.page = page     # the page lives as long as the function
    return fn


def tsc_rate():
    """{hz, source, cpuinfo_mhz}: the rate of the time-stamp counter, which DPDK counts cycles
    in (rte_rdtsc). Calibrated: rdtsc read against CLOCK_MONOTONIC 0.25 s apart, three times,
    the median (the kernel's clock here is itself the TSC scaled by the kernel's tsc_khz, so
    this converts the kernel's CPU nanoseconds to the cycles DPDK counts). Where rdtsc cannot
    run (not x86-64), /proc/cpuinfo's "cpu MHz" (the TSC's rate on a CPU with constant_tsc and
    tsc_known_freq; a guess elsewhere)."""
    if _tsc:
        return _tsc
    mhz = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    mhz = float(line.split(":", 1)[1])
                    break
    except (OSError, ValueError):
        pass
    try:
        if platform.machine() not in ("x86_64", "AMD64"):
            raise OSError(f"no rdtsc on {platform.machine()}")
        rd = _rdtsc()

        def pair():
            t0 = time.monotonic_ns()
            c = rd()
            t1 = time.monotonic_ns()
            return (t0 + t1) / 2, c
        rates = []
        for _ in range(3):
            t0, c0 = pair()
            time.sleep(0.25)
            t1, c1 = pair()
            rates.append((c1 - c0) / (t1 - t0) * 1e9)
        _tsc.update(hz=statistics.median(rates), source="rdtsc against CLOCK_MONOTONIC, 3 x 0.25 s, median",
                    cpuinfo_mhz=mhz)
    except (OSError, ValueError, AttributeError) as e:
        if not mhz:
            raise RuntimeError(f"no TSC rate: rdtsc failed ({e}) and /proc/cpuinfo has no cpu MHz")
        _tsc.update(hz=mhz * 1e6, source=f"/proc/cpuinfo cpu MHz (rdtsc: {e})", cpuinfo_mhz=mhz)
    return _tsc


def need_root(what):
    if os.geteuid() != 0:
        sys.exit(f"{what} needs root (network namespaces, veth, packet sockets, apt-get)")


def ensure_packages(tools, packages):
    """apt-get installs `packages` when one of `tools` (commands or absolute paths) is missing."""
    def missing():
        return [t for t in tools if not (os.path.exists(t) if t.startswith("/") else shutil.which(t))]
    if not missing():
        return
    print(f"installing {' '.join(packages)} (missing: {', '.join(missing())})", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    if subprocess.run(cmd, env=env, timeout=1200, stdin=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, timeout=1200, check=True, stdin=subprocess.DEVNULL)
        subprocess.run(cmd, env=env, timeout=1200, check=True, stdin=subprocess.DEVNULL)
    if missing():
        sys.exit(f"still missing after apt-get install {' '.join(packages)}: {', '.join(missing())}")


# ---------------------------------------------------------------- vale

def need_binaries():
    for b in ("valed", "vale-pktgen", "vale-ctl"):
        if not os.path.exists(os.path.join(BIN, b)):
            sys.exit(f"{BIN}/{b} missing: run cargo build --release first")


def mac_of(i):
    """A locally administered MAC for receiver number i."""
    return f"02:00:00:00:{(i >> 8) & 0xff:02x}:{i & 0xff:02x}"


class Valed:
    """A valed of our own, in a temporary run directory, pinned as the layout says."""

    def __init__(self, layout="split", workers=1, netns=None, cpus=None, persistent=True, extra=(), wrapper=()):
        """`layout`: a name of LAYOUTS, or an experiment's own {valed, tx, rx} CPU sets;
        `cpus`: valed's CPUs other than the layout's; `extra`: more valed arguments;
        `wrapper`: a command valed runs under (valgrind, say), which may take a while to start it."""
        need_binaries()
        if isinstance(layout, dict):
            self.layout, self.layout_name = dict(layout), layout.get("name", "custom")
        else:
            self.layout, self.layout_name = dict(LAYOUTS[layout]), layout
        if cpus:
            self.layout["valed"] = cpus
        self.workers = workers
        self.run_dir = tempfile.mkdtemp(prefix="vale-bench-")
        on_exit(lambda: shutil.rmtree(self.run_dir, ignore_errors=True))
        self.env = dict(os.environ, VALE_RUN_DIR=self.run_dir, VALE_NO_AUTOSTART="1")
        self.log = tempfile.TemporaryFile(mode="w+")
        # In network namespace `netns` (ip netns exec execs: the pid stays valed's), the
        # interfaces valed binds and the TAP devices it creates live there.
        prefix = ["ip", "netns", "exec", netns] if netns else []
        self.proc = spawn([*prefix, "taskset", "-c", self.layout["valed"], *wrapper, f"{BIN}/valed", "--run-dir",
                           self.run_dir, "--workers", str(workers), *extra], stdout=self.log,
                          stderr=subprocess.STDOUT)
        on_exit(lambda: stop(self.proc, signal.SIGTERM))
        sock = os.path.join(self.run_dir, "valed.sock")
        deadline = time.monotonic() + (60 if wrapper else 10)
        while not os.path.exists(sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"valed did not start: {self.log.read()[-2000:]}")
            time.sleep(0.02)
        # The sender's port is persistent, so switch vale0 (and its knobs, such as the batch)
        # lives between runs: a switch goes away with its last port.
        if persistent:
            self.ctl("create", "vale0:a")

    @property
    def pid(self):
        return self.proc.pid

    def cpu_layout(self, **more):
        d = {"name": self.layout_name, "valed": self.layout["valed"], "valed_workers": self.workers,
             "tx": self.layout["tx"], "rx": self.layout["rx"],
             "cpus": len(set().union(*(cpu_set(self.layout[k]) for k in ("valed", "tx", "rx"))))}
        d.update(more)
        return d

    def ctl(self, *args):
        return sh([f"{BIN}/vale-ctl", "--run-dir", self.run_dir, *args])

    def ports(self):
        """{port name: PortInfo dict} of every switch, from vale-ctl list --json."""
        out = {}
        for sw in json.loads(self.ctl("list", "--json")):
            for p in sw["ports"]:
                out[p["name"]] = p
        return out

    def pktgen(self, port, function, cpus, *args):
        # --slots given here (a receiver that must not drop, say) wins over the experiment's.
        slots = ["--slots", str(SLOTS)] if SLOTS and "--slots" not in map(str, args) else []
        return ["taskset", "-c", cpus, f"{BIN}/vale-pktgen", "-i", port, "-f", function, "-q", "--json",
                *slots, *[str(a) for a in args]]

    def wait_ports(self, ports, announced=False, limit=10.0):
        """Waits until every port is held by a client (and, if announced, has sent its frame)."""
        deadline = time.monotonic() + limit
        while True:
            info = self.ports()
            ok = all(p in info and info[p].get("owner_pid") and
                     (not announced or info[p]["counters"]["tx_packets"] >= 1) for p in ports)
            if ok:
                return info
            if time.monotonic() > deadline:
                raise RuntimeError(f"ports not ready after {limit} s: "
                                   f"{ {p: info.get(p) for p in ports} }")
            time.sleep(0.02)

    def run(self, size, seconds, rx_ports=("vale0:b",), tx_port="vale0:a", tx_args=(), rx_args=(),
            dst=None, announce=False):
        """One run: receivers on rx_ports, then a sender on tx_port for `seconds`.

        Returns {tx: pktgen report, rx: [reports], valed_cpu_s: CPU seconds valed used while the
        sender ran, wall_s, ports_listed: ports valed listed once the receivers were ready}. With announce, each receiver gets MAC mac_of(i) and announces it.
        """
        rxs = []
        for i, port in enumerate(rx_ports):
            extra = list(rx_args)
            if announce:
                extra += ["--announce", "-S", mac_of(i + 1)]
            log = tempfile.TemporaryFile(mode="w+")
            p = spawn(self.pktgen(port, "rx", self.layout["rx"], "-T", seconds + 30, *extra),
                      env=self.env, stdout=subprocess.PIPE, stderr=log, text=True)
            rxs.append((p, log))
        try:
            listed = len(self.wait_ports(rx_ports, announced=announce))
            cmd = self.pktgen(tx_port, "tx", self.layout["tx"], "-l", size, "-T", seconds, *tx_args)
            if dst:
                cmd += ["-D", dst]
            c0, t0 = cpu_seconds(self.pid), time.monotonic()
            tx = subprocess.run(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                timeout=seconds + 30, stdin=subprocess.DEVNULL)
            c1, t1 = cpu_seconds(self.pid), time.monotonic()
            if tx.returncode != 0:
                raise RuntimeError(f"vale-pktgen tx failed: {tx.stderr.strip()[-2000:]}")
            time.sleep(0.1)   # let the receivers read the last delivered frames
        finally:
            for p, _ in rxs:
                stop(p)
        return {"tx": json.loads(tx.stdout), "rx": pktgen_reports(rxs, "rx"), "valed_cpu_s": c1 - c0, "wall_s": t1 - t0,
                "ports_listed": listed}

    def set_batch(self, n):
        self.ctl("set", "vale0", "batch", str(n))

    def idle_cpu(self, seconds):
        """Fraction of a core valed used over `seconds` of doing nothing."""
        c0, t0 = cpu_seconds(self.pid), time.monotonic()
        time.sleep(seconds)
        return (cpu_seconds(self.pid) - c0) / (time.monotonic() - t0)


def rx_pps(run):
    """Sum of the receivers' pps of one Valed.run."""
    return sum(r["pps"] for r in run["rx"])


def cpu_per_mpkt(cpu_s, packets):
    """CPU seconds per million packets, or None when nothing moved."""
    return cpu_s / (packets / 1e6) if packets else None
