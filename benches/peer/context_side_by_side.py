#!/usr/bin/env python3
"""Decode speed against context depth, moestream and llama.cpp on the same model and adapter, in
one run: llama.cpp's `llama-bench -d` beside `moestream bench context`.

    python benches/peer/context_side_by_side.py [--peer target/peer] [--models target/peer/models]
        [--depths 512,4096,16384] [--decode 16] [--backends cpu,vulkan] [--json OUT]

Before: `benches/peer/build_llama_cpp.sh` (llama.cpp in --peer) and `cargo build --release`.
Missing models are made as `side_by_side.py` makes them (the reference bench model, its F16 GGUF,
a Q4_0 GGUF by llama-quantize). Rows:

  llama.cpp  llama-bench -m Q4_0 -p 0 -n DECODE -d DEPTH (f16 KV cache, its default), per backend
  moestream  bench context on the Hugging Face directory in its own int4 (f16 KV cache, its
             default): decode tok/s after a prompt of DEPTH tokens, and the step's time against
             the read-bandwidth roofline measured in the same run

Each depth gets moestream's decode tok/s divided by each llama.cpp backend's, and the ratio of
speed at the depth to speed at the first depth (how fast decode falls with context) per engine.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import ROOT, bench_models, run  # noqa: E402


def llama_depths(bench, model, depths, decode, backend):
    env = dict(os.environ, GGML_VK_VISIBLE_DEVICES="0")
    cmd = [bench, "-m", model, "-p", "0", "-n", str(decode), "-r", "1", "-o", "json",
           "-d", ",".join(str(d) for d in depths)]
    cmd += ["-ngl", "0", "-dev", "none"] if backend == "cpu" else ["-ngl", "99"]
    rows = json.loads(run(cmd, env))
    return {r["n_depth"]: r["avg_ts"] for r in rows if r["n_gen"] > 0}


def moestream_depths(binary, model, depths, decode):
    context = max(depths) + decode + 16
    cmd = [binary, "bench", "context", "--model", model, "--dtype", "int4", "--context", str(context),
           "--depths", ",".join(str(d) for d in depths), "--decode-tokens", str(decode), "--json"]
    r = json.loads(run(cmd).strip().splitlines()[-1])
    return r, {d["depth"]: d["decode_tokens_per_s"] for d in r["depths"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", default=str(ROOT / "target/peer"))
    p.add_argument("--models", default=None)
    p.add_argument("--depths", default="512,4096,16384")
    p.add_argument("--decode", type=int, default=16)
    p.add_argument("--backends", default="cpu,vulkan")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    peer = Path(args.peer)
    bin_dir = peer / "build/bin"
    models = Path(args.models or peer / "models")
    hf, _, q4 = bench_models(bin_dir, models)

    ours_report, ours = moestream_depths(ROOT / "target/release/moestream", hf, depths, args.decode)
    peers = {b: llama_depths(bin_dir / "llama-bench", q4, depths, args.decode, b) for b in args.backends.split(",")}
    rows = []
    for d in depths:
        row = {"depth": d, "moestream_decode_tokens_per_s": ours[d],
               "moestream_vs_first_depth": ours[d] / ours[depths[0]],
               "moestream_vs_roofline": next(x["vs_roofline"] for x in ours_report["depths"] if x["depth"] == d)}
        for b, speeds in peers.items():
            row[f"llama_{b}_decode_tokens_per_s"] = speeds[d]
            row[f"llama_{b}_vs_first_depth"] = speeds[d] / speeds[depths[0]]
            row[f"moestream_vs_llama_{b}"] = ours[d] / speeds[d]
        rows.append(row)
    print(f"reference bench model, int4 (moestream) vs Q4_0 (llama.cpp), {args.decode} decoded tokens after "
          f"each depth, adapter: {ours_report['adapter']}\n")
    head = ["depth", "moestream tok/s", "× roofline"]
    for b in peers:
        head += [f"llama.cpp {b} tok/s", f"moestream / llama.cpp {b}"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for r in rows:
        cells = [str(r["depth"]), f"{r['moestream_decode_tokens_per_s']:.1f}", f"{r['moestream_vs_roofline']:.2f}"]
        for b in peers:
            cells += [f"{r[f'llama_{b}_decode_tokens_per_s']:.1f}", f"{r[f'moestream_vs_llama_{b}']:.2f}"]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": str(hf), "decode_tokens": args.decode, "rows": rows,
                                               "moestream": ours_report}, indent=1))


if __name__ == "__main__":
    main()
