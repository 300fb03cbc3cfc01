#!/usr/bin/env python3
"""moestream and llama.cpp on the same adapter, the same model and the same token counts, in
one run: prefill and decode tokens/s of the reference bench model, with the ratios.

    python benches/peer/side_by_side.py [--peer target/peer] [--models target/peer/models]
                                        [--types Q4_0,Q4_K_M,F16] [--prompt 128] [--decode 64]
                                        [--runs 3] [--json OUT]

Before: `benches/peer/build_llama_cpp.sh` (llama.cpp in --peer) and `cargo build --release`.
The script makes what is missing: the bench model (benches/make_bench_model.py), its F16 GGUF
(make_gguf.py) and a GGUF of each other type asked for (llama-quantize). It then runs, on the
same adapter:

  llama.cpp  llama-bench on each type (Q4_0, Q4_K_M and F16 by default), Vulkan (every layer
             offloaded) and CPU
  moestream  bench model on the same GGUF files, and on the Hugging Face directory in its own
             int4 (compared with Q4_0)

and prints one markdown table (and JSON with --json) with each row's speed and its ratio to
llama.cpp's Vulkan run of the same file type. `GGML_VK_VISIBLE_DEVICES=0` makes llama.cpp
accept a software adapter (lavapipe), which it skips by default.

Then the decode matvec alone (skip with --no-matvec), the shape llama.cpp's own perf suite uses
(4096 rows x 14336 columns, one token): `test-backend-ops perf -o MUL_MAT` on Vulkan0 for Q4_0
and F16 beside `moestream bench kernels --rows 4096 --cols 14336` (moestream's int4 and f16),
each as GB/s of its own weight bytes, weights per second, and the ratio of weights per second
(moestream int4 against Q4_0, f16 against F16), with the compute-read bandwidth `bench kernels`
measures as the roofline.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(cmd, env=None):
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return out.stdout


def llama_bench(bench, model, args, cpu):
    env = dict(os.environ, GGML_VK_VISIBLE_DEVICES="0")
    cmd = [bench, "-m", model, "-p", str(args.prompt), "-n", str(args.decode), "-r", str(args.runs), "-o", "json"]
    cmd += ["-ngl", "0", "-dev", "none"] if cpu else ["-ngl", "99"]
    rows = json.loads(run(cmd, env))
    speed = {("prefill" if r["n_prompt"] > 0 else "decode"): r["avg_ts"] for r in rows}
    backend = "CPU" if cpu else f"Vulkan ({rows[0].get('gpu_info', '')})".replace(" ()", "")
    return {"prefill_tokens_per_s": speed["prefill"], "decode_tokens_per_s": speed["decode"], "backend": backend}


def moestream_bench(binary, model, args, dtype=None):
    cmd = [binary, "bench", "model", "--model", model, "--prompt-tokens", str(args.prompt),
           "--decode-tokens", str(args.decode), "--runs", str(args.runs), "--json"]
    if dtype:
        cmd += ["--dtype", dtype]
    r = json.loads(run(cmd).strip().splitlines()[-1])
    return {"prefill_tokens_per_s": r["prefill_tokens_per_s"], "decode_tokens_per_s": r["decode_tokens_per_s"],
            "backend": r["adapter"]}


# The decode matvec of llama.cpp's perf suite: m rows (outputs), k columns, one token.
MATVEC_ROWS, MATVEC_COLS = 4096, 14336
# Bytes per weight of llama.cpp's types: Q4_0 is 18 bytes per block of 32, F16 2.
GGML_BYTES_PER_WEIGHT = {"q4_0": 18 / 32, "f16": 2.0}


def llama_matvec_us(test_backend_ops, ggml_type):
    """Microseconds per run of llama.cpp's Vulkan MUL_MAT of `ggml_type` weights at the perf
    suite's 4096 x 14336 x 1 shape."""
    env = dict(os.environ, GGML_VK_VISIBLE_DEVICES="0")
    params = f"type_a={ggml_type},type_b=f32,m={MATVEC_ROWS},n=1,k={MATVEC_COLS},"
    out = run([test_backend_ops, "perf", "-o", "MUL_MAT", "-b", "Vulkan0", "-p", re.escape(params)], env)
    for line in out.splitlines():
        m = re.search(r"MUL_MAT\((.*?)\):\s+(\d+) runs -\s+([\d.]+) us/run", line)
        if m and m.group(1).startswith(params) and "bs=[1,1]" in m.group(1):
            return float(m.group(3))
    raise SystemExit(f"test-backend-ops printed no MUL_MAT {params} line:\n{out}")


def matvec_rows(bin_dir, moestream):
    """The decode matvec side by side: llama.cpp Q4_0 and F16 against moestream int4 and f16."""
    ours = json.loads(run([moestream, "bench", "kernels", "--rows", str(MATVEC_ROWS), "--cols", str(MATVEC_COLS),
                           "--json"]).strip().splitlines()[-1])
    weights = MATVEC_ROWS * MATVEC_COLS
    rows = []
    for ggml_type, own in (("q4_0", "int4"), ("f16", "f16")):
        us = llama_matvec_us(bin_dir / "test-backend-ops", ggml_type)
        llama_gbps = weights * GGML_BYTES_PER_WEIGHT[ggml_type] / (us * 1e3)
        own_us = ours[f"{own}_us"]
        rows.append({
            "llama_type": ggml_type.upper(), "llama_us": us, "llama_gbps": llama_gbps,
            "moestream_type": own, "moestream_us": own_us, "moestream_gbps": ours[f"{own}_gbps"],
            "read_gbps": ours["read_gbps"], "weights_per_s_vs_llama": us / own_us,
        })
    return {"adapter": ours["adapter"], "rows_x_cols": [MATVEC_ROWS, MATVEC_COLS], "rows": rows}


def bench_models(bin_dir, models, types):
    """The reference bench model in `models` (made where missing): its Hugging Face directory,
    and a GGUF of each of `types`: F16 from make_gguf.py, the others quantized from it by
    llama.cpp (`bench-q4_0.gguf`, `bench-q4_k_m.gguf`, ...)."""
    models.mkdir(parents=True, exist_ok=True)
    hf = models / "bench-mixtral"
    f16 = models / "bench-f16.gguf"
    if not (hf / "config.json").exists():
        run([sys.executable, ROOT / "benches/make_bench_model.py", hf])
    if not f16.exists():
        run([sys.executable, ROOT / "benches/peer/make_gguf.py", hf, f16])
    files = {}
    for t in types:
        path = models / f"bench-{t.lower()}.gguf"
        if not path.exists():
            run([bin_dir / "llama-quantize", f16, path, t])
        files[t] = path
    return hf, files


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", default=str(ROOT / "target/peer"))
    p.add_argument("--models", default=None)
    p.add_argument("--types", default="Q4_0,Q4_K_M,F16", help="GGUF types, comma-separated (llama-quantize names)")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--no-matvec", action="store_true", help="skip the matvec side by side")
    p.add_argument("--moestream", default=str(ROOT / "target/release/moestream"), help="the moestream binary")
    args = p.parse_args()
    peer = Path(args.peer)
    bin_dir = peer / "build/bin"
    models = Path(args.models or peer / "models")
    types = args.types.split(",")
    hf, files = bench_models(bin_dir, models, types)
    moestream = Path(args.moestream)

    rows = []
    for label, path in files.items():
        vk = llama_bench(bin_dir / "llama-bench", path, args, cpu=False)
        rows.append({"engine": "llama.cpp", "weights": label, "where": "Vulkan", **vk})
        cpu = llama_bench(bin_dir / "llama-bench", path, args, cpu=True)
        rows.append({"engine": "llama.cpp", "weights": label, "where": "CPU", **cpu})
        ours = moestream_bench(moestream, path, args)
        rows.append({"engine": "moestream", "weights": f"{label} (GGUF)", "where": "wgpu", **ours})
        if label == "Q4_0":
            own = moestream_bench(moestream, hf, args, dtype="int4")
            rows.append({"engine": "moestream", "weights": "int4 (own)", "where": "wgpu", **own})
    for r in rows:
        kind = "Q4_0" if r["weights"] == "int4 (own)" else r["weights"].removesuffix(" (GGUF)")
        base = next(x for x in rows if x["engine"] == "llama.cpp" and x["weights"] == kind and x["where"] == "Vulkan")
        r["prefill_vs_llama_vulkan"] = r["prefill_tokens_per_s"] / base["prefill_tokens_per_s"]
        r["decode_vs_llama_vulkan"] = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    report = {"model": str(hf), "prompt_tokens": args.prompt, "decode_tokens": args.decode, "runs": args.runs,
              "rows": rows}
    print(f"reference bench model, {args.prompt}-token prompt, {args.decode} decoded, {args.runs} runs\n")
    print("| engine | weights | backend | prefill tok/s | decode tok/s | prefill vs llama.cpp Vulkan | decode vs llama.cpp Vulkan |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['engine']} | {r['weights']} | {r['backend']} | {r['prefill_tokens_per_s']:.1f} | "
              f"{r['decode_tokens_per_s']:.1f} | {r['prefill_vs_llama_vulkan']:.2f} | {r['decode_vs_llama_vulkan']:.2f} |")
    if not args.no_matvec:
        mv = matvec_rows(bin_dir, moestream)
        report["matvec"] = mv
        print(f"\ndecode matvec {MATVEC_ROWS} x {MATVEC_COLS}, one token, on {mv['adapter']}"
              f" (compute-read roofline {mv['rows'][0]['read_gbps']:.1f} GB/s)\n")
        print("| llama.cpp | us | GB/s | moestream | us | GB/s | x read roofline | weights/s vs llama.cpp |")
        print("|---|---:|---:|---|---:|---:|---:|---:|")
        for r in mv["rows"]:
            print(f"| {r['llama_type']} | {r['llama_us']:.0f} | {r['llama_gbps']:.2f} | {r['moestream_type']} | "
                  f"{r['moestream_us']:.0f} | {r['moestream_gbps']:.2f} | {r['moestream_gbps'] / r['read_gbps']:.2f} | "
                  f"{r['weights_per_s_vs_llama']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
