#!/usr/bin/env bash
# MLA's latent KV cache against a decompressed per-head K/V cache, in one run: KV bytes per
# token and decode tok/s at 4K context (`bench context --depths 4096`) with `--mla-cache latent`
# then `--mla-cache decompressed`, on a DeepSeek-V2-Lite-shaped model:
#
#   python3 benches/make_bench_model.py DIR --shape deepseek_v2_lite
#   moestream convert DIR DIR-int4
#   benches/mla_cache.sh DIR-int4 [OUT.jsonl]
#
# Prints a markdown table; the two JSON reports go to OUT.jsonl (default mla-cache.jsonl).
# DEPTH=N changes the depth (the 4096-token prefill takes hours on lavapipe; a GPU needs seconds).
# PREFILL_LAST=N prefills only the prompt's last N tokens over a cache that takes the rest as
# computed (zeros; `bench context --prefill-last N`): a step's cost does not depend on the
# cached values, so decode at the depth is measured without hours of prefill.
# One layer's attention alone, at any depth: `cargo run --release --example mla_cache`.
set -euo pipefail
model=${1:?usage: benches/mla_cache.sh MODEL_DIR [OUT.jsonl]}
out=${2:-mla-cache.jsonl}
bin=${MOESTREAM:-target/release/moestream}
depth=${DEPTH:-4096}
skip=()
[[ -n "${PREFILL_LAST:-}" ]] && skip=(--prefill-last "$PREFILL_LAST")
: >"$out"
for cache in latent decompressed; do
    "$bin" bench context --model "$model" --mla-cache "$cache" --context $((depth + 64)) --depths "$depth" \
        --decode-tokens 8 "${skip[@]}" --json >>"$out"
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
depth = rows[0]["depths"][0]["depth"]
print(f"| MLA cache | KV bytes/token (all layers) | KV MiB at {depth} | prefill tok/s | decode tok/s at {depth} | step ms | vs roofline |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name, r in zip(["latent", "decompressed"], rows):
    d = r["depths"][0]
    prefill = f"{d['prefill_tokens_per_s']:.1f} ({d['prefilled_tokens']} tokens)"
    print(f"| {name} | {r['kv_bytes_per_token']} | {d['kv_bytes'] / 2**20:.1f} | {prefill} "
          f"| {d['decode_tokens_per_s']:.2f} | {d['step_ms']:.1f} | {d['vs_roofline']:.2f}x |")
PY
