#!/usr/bin/env python3
"""Throughput of concurrent requests: `moestream serve` and llama.cpp's `llama-server` driven
the same way, one server at a time (issue #42, item 5).

    python3 benches/peer/serve_side_by_side.py --server moestream --model DIR_OR_GGUF \\
        [--binary target/release/moestream] [--parallel 4] [--context 1024] \\
        [--concurrency 1,2,4,8] [--rounds 3] [--max-tokens 32] [--prompt-tokens 16] \\
        [--label NAME] [--json OUT.json]
    GGML_VK_VISIBLE_DEVICES=0 python3 benches/peer/serve_side_by_side.py --server llama \\
        --binary target/peer/build-cpu/bin/llama-server --model FILE.gguf [--threads 2] [--ngl 99] ...

Python 3 standard library only. The script starts the server (`moestream serve --model M --port
0 --parallel P --context N`, reading `listening on http://ADDR` from its stderr; or
`llama-server -m M --port PORT -np P -c P*N -t T`, so each of its P slots has N positions),
waits for GET /health to answer 200, sends one warm-up request, then for each concurrency C
runs --rounds rounds of C client threads released at once, each POSTing /v1/completions with
`{"prompt": [token ids], "max_tokens": N, "temperature": 0, "ignore_eos": true}`. Prompts are
token ids (the bench models have no real tokenizer), distinct per client and per round (their
first token differs, so no prompt-cache reuse between requests). Per round: the wall time from
release to the last reply, the aggregate generated tokens (usage.completion_tokens summed) /
wall time, and each request's latency. Per C it reports the median over rounds of the aggregate
tok/s, its ratio to C=1 (scaling), and the median per-request latency; as a markdown table on
stdout and, with --json, into a JSON file: runs are appended to the file's "runs" list (a run
with the same label is replaced), so several invocations (moestream, llama.cpp CPU, llama.cpp
Vulkan) collect into one file, and the table printed covers every run in it.

Run the servers one after the other, on an otherwise idle machine: llama.cpp's CPU backend
spin-waits, and the 1-minute load average is recorded before and after each concurrency. The server's
stderr goes to --log (default: a temporary file, path printed). `GGML_VK_VISIBLE_DEVICES=0` (in
the environment) makes llama.cpp's Vulkan build accept a software adapter such as lavapipe.
"""

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process, its stderr copied to a log file, and its base URL once known."""

    def __init__(self, args):
        self.log_path = args.log or tempfile.mkstemp(prefix=f"serve-{args.server}-", suffix=".log")[1]
        self.log = open(self.log_path, "w")
        self.url = None
        self.listening = threading.Event()
        if args.server == "moestream":
            cmd = [args.binary, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0",
                   "--parallel", str(args.parallel), "--context", str(args.context)]
        else:
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            cmd = [args.binary, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
                   "-np", str(args.parallel), "-c", str(args.parallel * args.context),
                   "-ngl", str(args.ngl)]
            if args.threads:
                cmd += ["-t", str(args.threads), "-tb", str(args.threads)]
        cmd += args.extra
        self.cmd = cmd
        print("+", " ".join(cmd), file=sys.stderr)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stderr:
            self.log.write(line)
            self.log.flush()
            m = re.search(r"listening on (http://\S+)", line)
            if m and self.url is None:
                self.url = m.group(1).rstrip("/")
                self.listening.set()

    def wait_healthy(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"server exited with {self.proc.returncode}; log: {self.log_path}")
            if self.url:
                try:
                    status, _ = request(self.url, "GET", "/health", None, 5)
                    if status == 200:
                        return
                except OSError:
                    pass
            time.sleep(0.5)
        sys.exit(f"server not healthy after {timeout} s; log: {self.log_path}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def request(url, method, path, body, timeout):
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def prompt_ids(round_no, client, n, vocab):
    """Distinct token ids per (round, client), first token included; never 0..2 (unk/bos/eos)."""
    seed = 1000 + 97 * round_no + 7919 * client
    return [3 + (seed + 131 * k * (client + 1) + 17 * k * k) % (vocab - 3) for k in range(n)]


def completion(url, args, ids):
    body = {"prompt": ids, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
    if args.model_name:
        body["model"] = args.model_name
    t0 = time.perf_counter()
    status, raw = request(url, "POST", "/v1/completions", body, args.request_timeout)
    latency = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {raw[:300]!r}")
    reply = json.loads(raw)
    return {"latency_s": latency, "completion_tokens": reply["usage"]["completion_tokens"],
            "prompt_tokens": reply["usage"].get("prompt_tokens")}


def run_round(url, args, c, round_no):
    results = [None] * c
    errors = []
    barrier = threading.Barrier(c + 1)
    ends = [0.0] * c

    def client(i):
        ids = prompt_ids(round_no, i, args.prompt_tokens, args.vocab)
        barrier.wait()
        try:
            results[i] = completion(url, args, ids)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i}: {e}")
        ends[i] = time.perf_counter()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(c)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    wall = max(ends) - t0
    tokens = sum(r["completion_tokens"] for r in results)
    return {"wall_s": wall, "completion_tokens": tokens, "aggregate_tokens_per_s": tokens / wall,
            "latencies_s": [r["latency_s"] for r in results]}


def measure(args):
    server = Server(args)
    print(f"server log: {server.log_path}", file=sys.stderr)
    try:
        server.wait_healthy(args.start_timeout)
        # Warm-up (pipeline/shader compilation, first allocations), not measured.
        for i in range(args.warmup):
            completion(server.url, args, prompt_ids(999, i, args.prompt_tokens, args.vocab))
        rows = []
        for c in args.concurrency:
            load = os.getloadavg()[0]
            rounds = []
            for r in range(args.rounds):
                res = run_round(server.url, args, c, r + 100 * c)
                rounds.append(res)
                print(f"C={c} round {r + 1}: {res['completion_tokens']} tokens in {res['wall_s']:.2f} s = "
                      f"{res['aggregate_tokens_per_s']:.2f} tok/s", file=sys.stderr)
            rows.append({
                "concurrency": c,
                "load_avg_1m_before": load,
                "load_avg_1m_after": os.getloadavg()[0],
                "median_aggregate_tokens_per_s": statistics.median(x["aggregate_tokens_per_s"] for x in rounds),
                "median_latency_s": statistics.median(l for x in rounds for l in x["latencies_s"]),
                "rounds": rounds,
            })
        base = rows[0]["median_aggregate_tokens_per_s"] if rows and rows[0]["concurrency"] == 1 else None
        for row in rows:
            row["scaling_vs_c1"] = row["median_aggregate_tokens_per_s"] / base if base else None
    finally:
        server.stop()
    return {
        "label": args.label or f"{args.server} {Path(args.model).name}",
        "server": args.server,
        "command": server.cmd,
        "model": str(args.model),
        "parallel": args.parallel,
        "context_per_slot": args.context,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "rounds_per_concurrency": args.rounds,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("GGML_", "MOESTREAM_", "LP_", "MESA_"))},
        "cpu_count": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "results": rows,
    }


def table(runs):
    lines = ["| server | C | aggregate tok/s (median) | scaling vs C=1 | per-request latency s (median) | load 1m before / after |",
             "|---|---:|---:|---:|---:|---:|"]
    for run in runs:
        for row in run["results"]:
            s = row["scaling_vs_c1"]
            lines.append(f"| {run['label']} | {row['concurrency']} | {row['median_aggregate_tokens_per_s']:.2f} | "
                         f"{'' if s is None else f'{s:.2f}'} | {row['median_latency_s']:.2f} | "
                         f"{row['load_avg_1m_before']:.2f} / {row['load_avg_1m_after']:.2f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", choices=["moestream", "llama"], required=True)
    ap.add_argument("--binary", help="moestream or llama-server binary (default: target/release/moestream, "
                                     "target/peer/build-cpu/bin/llama-server)")
    ap.add_argument("--model", required=True, help="moestream: model directory or GGUF; llama: GGUF file")
    ap.add_argument("--parallel", type=int, default=4, help="server slots (moestream --parallel, llama -np)")
    ap.add_argument("--context", type=int, default=1024, help="positions per slot")
    ap.add_argument("--concurrency", default="1,2,4,8", help="comma-separated client counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000, help="token ids of the prompts are drawn below this")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured requests before the first round")
    ap.add_argument("--threads", type=int, default=0, help="llama-server -t/-tb (0: its default)")
    ap.add_argument("--ngl", type=int, default=99, help="llama-server -ngl (layers offloaded; no effect on a CPU build)")
    ap.add_argument("--model-name", help="`model` field of the requests (default: none)")
    ap.add_argument("--label", help="name of this run in the table and JSON")
    ap.add_argument("--json", type=Path, help="append this run to the JSON file's runs")
    ap.add_argument("--log", help="server stderr log file")
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--request-timeout", type=float, default=1800)
    ap.add_argument("extra", nargs="*", help="after --: extra server arguments")
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if not args.binary:
        args.binary = str(ROOT / ("target/release/moestream" if args.server == "moestream"
                                  else "target/peer/build-cpu/bin/llama-server"))

    run = measure(args)
    runs = [run]
    if args.json:
        doc = json.loads(args.json.read_text()) if args.json.exists() else {}
        doc.setdefault("runs", [])
        doc["runs"] = [r for r in doc["runs"] if r["label"] != run["label"]] + [run]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        runs = doc["runs"]
    print(table(runs))


if __name__ == "__main__":
    main()
