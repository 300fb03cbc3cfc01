#!/usr/bin/env python3
"""Bigger than memory, side by side: llama.cpp (mmap; CPU and Vulkan backends) and moestream
(experts streamed from experts.bin) on the same model under the same memory bound, in one run.

    sudo python3 benches/bigmem/side_by_side.py [--data target/bigmem] [--bound 480M] [--slots 32]
        [--decode 12] [--prompt 8] [--llama-bin DIR] [--llama-cpu-bin DIR] [--json OUT]
        [--gguf FILE] [--store DIR] [--llama-configs cpu-mmap,...] [--policies lru,lfu,eamc]
        [--prefetch none,eamc] [--io-threads 1,8] [--no-buffered] [--no-resident] [--prefill N]
    python3 benches/bigmem/side_by_side.py --print JSON     (the tables of an earlier run)

The defaults are the 4-layer bigmem bench's (benches/bigmem/run.sh); benches/fullsize/run.sh
runs the full-size model through the same code with its own files and a subset of the rows.

The bound is a memory cgroup (v1 `memory.limit_in_bytes`, or v2 `memory.max`) that every
measured process runs in; its limit counts the process's own memory *and the page cache it
fills*, so llama.cpp's mmap of the GGUF (and a buffered read of experts.bin) cannot keep more
of the model in memory than the bound. Before each run the model files are dropped from the
page cache (posix_fadvise DONTNEED), so every run starts cold. The cgroup is made inside this
process's own memory cgroup. Bytes read from the device are the child's block-input count
(`wait4`'s `ru_inblock` × 512: reads submitted by the process, O_DIRECT reads and page faults
of its mapping included); llama.cpp's per-token figure counts from the start of its measured
generation (the `--progress` line; /proc/PID/io then) to its exit, so the model load's reads are
left out; moestream's are its own counters over the decode steps. Peak memory is the cgroup's
high-water mark (the page cache fills it), beside the highest anonymous memory sampled every
0.1 s (the process's own).

llama.cpp comes from `benches/peer/build_llama_cpp.sh`: its build with the Vulkan backend in
`target/peer/build/bin` (`--llama-bin`, or `PEER_BIN`) and its CPU-only build in
`target/peer/build-cpu/bin` (`--llama-cpu-bin`).

Rows: llama.cpp `llama-bench` (one warmup token, then the measured decode), CPU-only build and
Vulkan build, on the CPU with the weights left on the mapping (`--repack 0`) and with its
default repacking (a copy of the weights in anonymous memory), Vulkan (every layer offloaded; lavapipe here, so the "device"
copy of the weights is host memory inside the bound too), Vulkan with the experts left on the
CPU (`--n-cpu-moe`, llama.cpp's own recipe for MoE models bigger than memory), also with
`--no-host 1` (the CPU's weights kept out of the Vulkan backend's host buffer type); then
`moestream bench ssd` (LRU, LFU and EAMC × no prefetch and EAMC prefetch with 4 reader threads,
EAMC/EAMC with other reader counts, all uncached), one buffered run, each configuration in a
process of its own (cold, as llama.cpp's), their tokens checked equal; and for reference the
same model fully resident without a bound (`bench model`, outside the cgroup).
Make the model first: benches/bigmem/make.sh. Needs root (cgroup) and Linux.
"""

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where benches/peer/build_llama_cpp.sh puts its two builds by default.
PEER_VULKAN = Path(os.environ.get("PEER_BIN", ROOT / "target/peer/build/bin"))
PEER_CPU = ROOT / "target/peer/build-cpu/bin"
CGROUP_NAME = "moestream-bigmem"


# llama.cpp configurations: key → (label, build ("cpu": the CPU-only build, "vk": the Vulkan
# one), llama-bench flags, whether the Vulkan device is visible).
LLAMA_CONFIGS = {
    "cpu-mmap": ("CPU-only build, weights on the mapping (--repack 0)", "cpu", ["--repack", "0"], False),
    "cpu-repack": ("CPU-only build, default (weights repacked)", "cpu", [], False),
    "vk-cpu-mmap": ("Vulkan build on the CPU, weights on the mapping (--repack 0)", "vk",
                    ["-ngl", "0", "-dev", "none", "--repack", "0"], False),
    "vk-cpu-repack": ("Vulkan build on the CPU, default (weights repacked)", "vk", ["-ngl", "0", "-dev", "none"],
                      False),
    "vk-all": ("Vulkan (all layers)", "vk", ["-ngl", "99"], True),
    "vk-ncmoe": ("Vulkan, experts on CPU (--n-cpu-moe, --repack 0)", "vk",
                 ["-ngl", "99", "-ncmoe", "99", "--repack", "0"], True),
    "vk-ncmoe-nohost": ("Vulkan, experts on the CPU mapping (--n-cpu-moe, --repack 0, --no-host 1)", "vk",
                        ["-ngl", "99", "-ncmoe", "99", "--repack", "0", "--no-host", "1"], True),
}


def parse_bytes(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def own_cgroup(v1):
    """This process's memory cgroup, relative to the hierarchy's root (from /proc/self/cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v1 and "memory" in controllers.split(",")) or (not v1 and controllers == ""):
            return path.lstrip("/")
    return ""


class Cgroup:
    """A memory cgroup with a hard limit (v1 or v2), joined by each child before it execs. It is
    made as a child of this process's own memory cgroup, so the runs stay inside whatever limit
    and accounting the caller already has (a container's, a session's)."""

    def __init__(self, limit):
        v1 = Path("/sys/fs/cgroup/memory")
        self.v1 = v1.is_dir()
        root = v1 if self.v1 else Path("/sys/fs/cgroup")
        self.dir = root / own_cgroup(self.v1) / CGROUP_NAME
        self.dir.mkdir(exist_ok=True)
        limit_file = "memory.limit_in_bytes" if self.v1 else "memory.max"
        (self.dir / limit_file).write_text(str(limit))
        self.limit = int((self.dir / limit_file).read_text())
        self.peak_anon = 0

    def reset_peak(self):
        if self.v1:
            (self.dir / "memory.max_usage_in_bytes").write_text("0")

    def peak(self):
        f = self.dir / ("memory.max_usage_in_bytes" if self.v1 else "memory.peak")
        return int(f.read_text()) if f.exists() else None

    def anon(self):
        """Anonymous memory charged to the cgroup now (the process's own, page cache excluded)."""
        stat = dict(line.split() for line in (self.dir / "memory.stat").read_text().splitlines())
        return int(stat["rss"] if self.v1 else stat["anon"])

    def join(self):
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))


def drop_cache(paths):
    for p in paths:
        for f in ([p] if p.is_file() else sorted(p.rglob("*"))):
            if f.is_file():
                fd = os.open(f, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)


def proc_read_bytes(pid):
    """Bytes the process has read from block devices so far (/proc/PID/io `read_bytes`)."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def run_capped(cg, cmd, env=None, files=(), mark=None):
    """Runs cmd inside the cgroup, cold; returns (rc, stdout, stderr, seconds, bytes read by the
    child in all, bytes it had read when a line of its stderr first contained `mark`)."""
    drop_cache(files)
    cg.reset_peak()
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    before = rusage_children_inblock()
    start = time.time()
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, preexec_fn=cg.join)
    out, err, at_mark, anon = [], [], [], [0]
    reader = threading.Thread(target=lambda: out.append(p.stdout.read()))
    reader.start()

    def sample():
        while p.poll() is None:
            anon[0] = max(anon[0], cg.anon())
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for line in p.stderr:
        err.append(line)
        if mark and not at_mark and mark in line:
            at_mark.append(proc_read_bytes(p.pid))
    reader.join()
    p.wait()  # reaps the child: its block input joins RUSAGE_CHILDREN
    sampler.join()
    cg.peak_anon = anon[0]
    read = (rusage_children_inblock() - before) * 512
    return p.returncode, out[0], "".join(err), time.time() - start, read, (at_mark or [None])[0]


def rusage_children_inblock():
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock


def llama_row(cg, label, bin_dir, gguf, args, extra, env):
    """llama-bench's decode (after its one-token warmup); bytes read per token counted from the
    start of the measured generation (its `--progress` line) to the exit, so the model load's
    reads are left out."""
    cmd = [Path(bin_dir) / "llama-bench", "-m", gguf, "-p", "0", "-n", str(args.decode), "-r", "1", "--progress",
           "-t", str(args.threads), "-o", "json", "-lm", "mmap", *extra]
    rc, out, err, secs, read, at_decode = run_capped(cg, cmd, env, [gguf], mark="generation run")
    row = {"engine": "llama.cpp", "backend": label, "peak_bytes": cg.peak(), "peak_anon_bytes": cg.peak_anon,
           "bytes_read": read, "seconds": secs,
           "command": " ".join(str(c) for c in cmd)}
    if rc != 0:
        reason = "killed (out of memory at the bound)" if rc < 0 or "memory" in err.lower() else f"exit {rc}"
        print(err[-2000:], file=sys.stderr)
        return {**row, "decode_tokens_per_s": None, "bytes_read_per_token": None, "note": reason}
    r = json.loads(out)[0]
    decode_read = None if at_decode is None else read - at_decode
    per_token = None if decode_read is None else decode_read / r["n_gen"]
    return {**row, "decode_tokens_per_s": r["avg_ts"], "bytes_read_decode": decode_read,
            "bytes_read_per_token": per_token, "note": ""}


def moestream_configs(cg, args, label, io_threads, policies, prefetchers, direct_io):
    """`bench ssd` once per configuration, each in a process of its own; returns the first
    report (device figures) and the rows."""
    first, rows = None, []
    for threads in io_threads.split(","):
        for policy in policies.split(","):
            for prefetch in prefetchers.split(","):
                extra = ["--io-threads", threads, "--policies", policy, "--prefetch", prefetch,
                         "--direct-io", direct_io]
                rep, ours = moestream_rows(cg, args, extra, label)
                rows += ours
                first = first or rep
    return first, rows


def moestream_rows(cg, args, extra, label):
    converted = Path(args.store)
    cmd = [args.moestream, "bench", "ssd", "--model", converted, "--expert-slots",
           str(args.slots), "--prompt-tokens", str(args.prompt), "--decode-tokens", str(args.decode),
           "--device-seconds", "2", "--json", *extra]
    rc, out, err, secs, read, _ = run_capped(cg, cmd, dict(os.environ, RUST_LOG="info"), [converted, args.gguf])
    print(err[-3000:], file=sys.stderr)
    if rc != 0:
        return None, [{"engine": "moestream", "backend": label, "decode_tokens_per_s": None, "note": f"exit {rc}",
                       "peak_bytes": cg.peak(), "peak_anon_bytes": cg.peak_anon, "bytes_read": read}]
    rep = json.loads(out.strip().splitlines()[-1])
    rows = []
    for r in rep["runs"]:
        rows.append({"engine": "moestream", "backend": f"{label}, {r['io_threads']} I/O threads, {r['policy']} / "
                     f"{r['prefetch']}", "decode_tokens_per_s": r["decode_tokens_per_s"],
                     "bytes_read_per_token": r["bytes_read_per_token"], "peak_bytes": cg.peak(),
                     "peak_anon_bytes": cg.peak_anon, "run": r,
                     "command": " ".join(str(c) for c in cmd), "note": ""})
    return rep, rows


def prefill_rows(cg, args, gguf, llama):
    """Prefill of a `--prefill`-token prompt under the bound, cold: llama-bench `-p N -n 0` in
    each llama.cpp configuration of `llama` ((label, bin dir, extra flags, env)), and moestream's
    `generate --json` on the same number of seeded random ids (LRU, no prefetch, uncached), its
    prefill speed and bytes read from its own report."""
    rows = []
    for label, bin_dir, extra, env in llama:
        cmd = [Path(bin_dir) / "llama-bench", "-m", gguf, "-p", str(args.prefill), "-n", "0", "-r", "1",
               "-t", str(args.threads), "-o", "json", "-lm", "mmap", *extra]
        rc, out, err, secs, read, _ = run_capped(cg, cmd, env, [gguf])
        row = {"engine": "llama.cpp", "backend": label, "peak_bytes": cg.peak(), "peak_anon_bytes": cg.peak_anon,
               "bytes_read": read, "seconds": secs, "command": " ".join(str(c) for c in cmd)}
        if rc != 0:
            print(err[-2000:], file=sys.stderr)
            rows.append({**row, "prefill_tokens_per_s": None, "note": f"exit {rc}"})
            continue
        r = json.loads(out)[0]
        rows.append({**row, "prefill_tokens_per_s": r["avg_ts"], "bytes_read_per_token": read / args.prefill,
                     "note": "bytes read include the model load"})
    if not args.policies:
        return rows
    store = Path(args.store)
    ids = ",".join(str(i) for i in random.Random(0).choices(range(args.prefill_vocab), k=args.prefill))
    cmd = [args.moestream, "generate", "--model", store, "--tokens", ids, "-n", "1",
           "--temperature", "0", "--context", str(args.prefill + 64), "--expert-slots", str(args.slots),
           "--policy", "lru", "--prefetch", "none", "--direct-io", "on", "--json"]
    rc, out, err, secs, read, _ = run_capped(cg, cmd, dict(os.environ, RUST_LOG="info"), [store, gguf])
    row = {"engine": "moestream", "backend": "uncached, 4 I/O threads, lru / none", "peak_bytes": cg.peak(),
           "peak_anon_bytes": cg.peak_anon, "bytes_read": read, "seconds": secs,
           "command": " ".join(str(c) for c in cmd).replace(ids, f"<{args.prefill} seeded random ids>")}
    if rc != 0:
        print(err[-3000:], file=sys.stderr)
        return rows + [{**row, "prefill_tokens_per_s": None, "note": f"exit {rc}"}]
    stats = json.loads(out.strip().splitlines()[-1])["stats"]
    return rows + [{**row, "prefill_tokens_per_s": stats["prefill_tokens_per_s"], "stats": stats,
                    "bytes_read_per_token": stats["bytes_read"] / args.prefill,
                    "note": "bytes read: its own counter (prompt and one generated token)"}]


def resident_row(args):
    """moestream with every expert resident and no bound: the compute ceiling of the streamed rows
    (it needs memory for the whole model, so it runs outside the cgroup)."""
    converted = Path(args.store)
    cmd = [args.moestream, "bench", "model", "--model", converted, "--context", "256",
           "--prompt-tokens", str(args.prompt), "--decode-tokens", str(args.decode), "--runs", "1", "--json"]
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    row = {"engine": "moestream", "backend": "every expert resident, no bound (reference)", "peak_bytes": None,
           "peak_anon_bytes": None, "command": " ".join(str(c) for c in cmd), "bytes_read_per_token": 0}
    if p.returncode != 0:
        print(p.stderr[-2000:], file=sys.stderr)
        return {**row, "decode_tokens_per_s": None, "note": f"exit {p.returncode}"}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {**row, "decode_tokens_per_s": r["decode_tokens_per_s"], "peak_anon_bytes": r["peak_rss_bytes"],
            "note": "outside the bound; peak is its RSS"}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT / "target/bigmem"))
    p.add_argument("--bound", default="480M", help="memory cgroup limit (page cache included); experts.bin is 3.0x 480M")
    p.add_argument("--slots", type=int, default=32, help="moestream expert slots (GPU memory: host memory on lavapipe, inside the bound)")
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--decode", type=int, default=12)
    p.add_argument("--threads", type=int, default=2, help="llama.cpp CPU threads")
    p.add_argument("--io-threads", default="1,8", help="reader threads compared with 4 (eamc / eamc)")
    p.add_argument("--llama-bin", default=str(PEER_VULKAN),
                   help="llama.cpp built with its Vulkan backend (benches/peer/build_llama_cpp.sh)")
    p.add_argument("--llama-cpu-bin", default=str(PEER_CPU),
                   help="llama.cpp's CPU-only build (benches/peer/build_llama_cpp.sh)")
    p.add_argument("--moestream", default=os.environ.get("MOESTREAM_BIN", str(ROOT / "target/release/moestream")),
                   help="the moestream binary (env MOESTREAM_BIN)")
    p.add_argument("--gguf", default=None, help="the GGUF llama.cpp reads (default DATA/bigmem-q4_0.gguf)")
    p.add_argument("--store", default=None,
                   help="moestream's converted directory (default DATA/converted; a GGUF's holds only experts.bin)")
    p.add_argument("--llama-configs", default=",".join(LLAMA_CONFIGS),
                   help="llama.cpp rows to run, of: " + ", ".join(LLAMA_CONFIGS))
    p.add_argument("--policies", default="lru,lfu,eamc", help="moestream policies (x --prefetch, 4 I/O threads)")
    p.add_argument("--prefetch", default="none,eamc")
    p.add_argument("--no-buffered", action="store_true", help="skip the buffered moestream row")
    p.add_argument("--no-resident", action="store_true",
                   help="skip the resident reference row (it holds every expert in memory)")
    p.add_argument("--prefill", type=int, default=0,
                   help="also time the prefill of a prompt of this many tokens (llama-bench -p N; moestream generate)")
    p.add_argument("--prefill-llama-configs", default=None,
                   help="llama.cpp rows whose prefill is timed (default: every --llama-configs row)")
    p.add_argument("--prefill-vocab", type=int, default=4096, help="ids of the prefill prompt are below this")
    p.add_argument("--json", default=None)
    p.add_argument("--combine", metavar="JSON", nargs="+", default=None,
                   help="join the rows of earlier runs' JSON into one report (--json OUT) and print it")
    p.add_argument("--print", metavar="JSON", default=None,
                   help="print the tables of an earlier run's JSON and exit (nothing is run)")
    args = p.parse_args()
    if args.print:
        print_tables(json.loads(Path(args.print).read_text()))
        return
    if args.combine:
        # Runs made in separate spells (llama.cpp's rows in one, moestream's in another): one report.
        parts = [json.loads(Path(f).read_text()) for f in args.combine]
        report = dict(parts[0])
        report["rows"] = [r for p in parts for r in p["rows"]]
        report["prefill_rows"] = [r for p in parts for r in p.get("prefill_rows", [])]
        report["moestream"] = next((p["moestream"] for p in parts if p["moestream"]), None)
        report["combined_from"] = [str(f) for f in args.combine]
        compare(report)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        print_tables(report)
        return
    for d in (args.llama_bin, args.llama_cpu_bin):
        if not (Path(d) / "llama-bench").exists():
            sys.exit(f"{d}/llama-bench is missing: run benches/peer/build_llama_cpp.sh (or pass --llama-bin / "
                     "--llama-cpu-bin)")
    data = Path(args.data)
    gguf = Path(args.gguf or data / "bigmem-q4_0.gguf")
    args.gguf = gguf
    args.store = args.store or str(data / "converted")
    store = Path(args.store) / "experts.bin"
    for f in (gguf, store):
        if not f.exists():
            sys.exit(f"{f} is missing: run benches/bigmem/make.sh (or benches/fullsize/make.sh) first")
    cg = Cgroup(parse_bytes(args.bound))
    env_vk = dict(os.environ, GGML_VK_VISIBLE_DEVICES="0")
    bins = {"cpu": args.llama_cpu_bin, "vk": args.llama_bin}
    llama = []
    for key in filter(None, args.llama_configs.split(",")):
        if key not in LLAMA_CONFIGS:
            sys.exit(f"--llama-configs: unknown {key!r} (known: {', '.join(LLAMA_CONFIGS)})")
        label, build, extra, vulkan = LLAMA_CONFIGS[key]
        llama.append((label, bins[build], extra, env_vk if vulkan else os.environ))
    rows = [llama_row(cg, label, bin_dir, gguf, args, extra, env) for label, bin_dir, extra, env in llama]
    rep, ours = (None, [])
    if args.policies:
        rep, ours = moestream_configs(cg, args, "uncached", "4", args.policies, args.prefetch, "auto")
    rows += ours
    if args.io_threads and args.policies:
        rows += moestream_configs(cg, args, "uncached", args.io_threads, "eamc", "eamc", "auto")[1]
    if not args.no_buffered and args.policies:
        rows += moestream_configs(cg, args, "buffered", "4", "eamc", "eamc", "off")[1]
    tokens = [r["run"]["tokens"] for r in rows if "run" in r]
    if any(t != tokens[0] for t in tokens):
        sys.exit("moestream configurations generated different tokens: streaming must be exact")
    if not args.no_resident:
        rows.append(resident_row(args))
    keys = [k for k in filter(None, args.llama_configs.split(","))]
    chosen = keys if args.prefill_llama_configs is None else list(filter(None, args.prefill_llama_configs.split(",")))
    prefill = prefill_rows(cg, args, gguf, [c for k, c in zip(keys, llama) if k in chosen]) if args.prefill else []
    report = {"bound_bytes": cg.limit, "store_bytes": store.stat().st_size, "gguf_bytes": gguf.stat().st_size,
              "decode_tokens": args.decode, "prompt_tokens": args.prompt, "moestream": rep, "rows": rows,
              "prefill_tokens": args.prefill, "prefill_rows": prefill}
    compare(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print_tables(report)


def compare(report):
    """Each row's decode speed against llama.cpp's best row."""
    best_llama = max([(r["decode_tokens_per_s"] or 0) for r in report["rows"] if r["engine"] == "llama.cpp"] or [0])
    for r in report["rows"]:
        r["vs_best_llama"] = (r["decode_tokens_per_s"] or 0) / best_llama if best_llama else None


def print_tables(report):
    """The summary table and moestream's I/O details, from a run's report (as saved in --json)."""
    mib = lambda b: "-" if b is None else f"{b / 1048576:.0f}"
    bound, store, gguf = report["bound_bytes"], report["store_bytes"], report["gguf_bytes"]
    print(f"bound {mib(bound)} MiB (cgroup, page cache included); experts.bin {mib(store)} MiB "
          f"({store / bound:.1f}x the bound), GGUF Q4_0 {mib(gguf)} MiB; {report['decode_tokens']} decoded tokens\n")
    print("| engine | backend | decode tok/s | vs best llama.cpp | MiB read/token | peak MiB (anonymous) | note |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in report["rows"]:
        tps = "-" if r["decode_tokens_per_s"] is None else f"{r['decode_tokens_per_s']:.2f}"
        vs = "-" if not r["vs_best_llama"] else f"{r['vs_best_llama']:.2f}"
        print(f"| {r['engine']} | {r['backend']} | {tps} | {vs} | {mib(r.get('bytes_read_per_token'))} | "
              f"{mib(r['peak_bytes'])} ({mib(r['peak_anon_bytes'])}) | {r['note']} |")
    print_moestream_details(report["moestream"], [r for r in report["rows"] if "run" in r])
    if report.get("prefill_rows"):
        print(f"\nprefill of {report['prefill_tokens']} tokens, cold, same bound\n")
        print("| engine | backend | prefill tok/s | MiB read/token | peak MiB (anonymous) | note |")
        print("|---|---|---:|---:|---:|---|")
        for r in report["prefill_rows"]:
            tps = "-" if r["prefill_tokens_per_s"] is None else f"{r['prefill_tokens_per_s']:.2f}"
            print(f"| {r['engine']} | {r['backend']} | {tps} | {mib(r.get('bytes_read_per_token'))} | "
                  f"{mib(r['peak_bytes'])} ({mib(r['peak_anon_bytes'])}) | {r['note']} |")


def print_moestream_details(rep, rows):
    """moestream's I/O figures per configuration, against the device's own bandwidth."""
    if rep:
        d = rep["device"]
        print(f"\nmoestream: {rep['slots']} slots of {rep['total_experts']} experts, {rep['io_mode']}; device "
              f"(measured by bench ssd): sequential 1 MiB {d['sequential_mb_s']:.0f} MB/s, 4 KiB random "
              f"{d['random_4k_mb_s']:.0f} MB/s ({d['random_4k_iops']:.0f} IOPS, {d['random_threads']} threads)\n")
    print("| configuration | tok/s | hit rate | stall ms/tok | load time hidden | MiB read/tok | needed MiB/tok | "
          "read / needed | read MB/s | vs seq | vs 4K rand | I/O CPU ms/tok | upload ms/tok |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        x = r["run"]
        print(f"| {r['backend']} | {x['decode_tokens_per_s']:.2f} | {x['hit_rate'] * 100:.0f}% | "
              f"{x['stall_ms_per_token']:.0f} | {x['hidden_share'] * 100:.0f}% | "
              f"{x['bytes_read_per_token'] / 1048576:.1f} | {x['needed_bytes_per_token'] / 1048576:.1f} | "
              f"{x['read_amplification']:.2f} | {x['read_mb_s']:.0f} | {x['vs_sequential']:.2f} | "
              f"{x['vs_random_4k']:.2f} | {x['io_cpu_ms_per_token']:.1f} | {x['upload_ms_per_token']:.1f} |")


if __name__ == "__main__":
    main()
