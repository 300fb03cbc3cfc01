#!/usr/bin/env bash
# Records routing traces of a model (default: the bundled one) on the workloads in prompts/,
# then runs trace-stats and the cache simulator over them. Run by hand after
# `cargo build --release`; outputs go to benches/workloads/traces/. Greedy and one token a step, so
# the workload is the same every run (generate samples by default, and drafts with an MTP module).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=./target/release/moestream
MODEL=${MODEL:-models/moestream-tiny-moe}
OUT=benches/workloads/traces
mkdir -p "$OUT"
for w in single mixed shift; do
  "$BIN" generate --model "$MODEL" --prompt-file "benches/workloads/prompts/$w.txt" \
    --max-tokens 8 --ignore-eos --json --temperature 0 --speculative off --trace "$OUT/$w.jsonl" > /dev/null
done
"$BIN" trace-stats --trace "$OUT/mixed.jsonl" --heatmap "$OUT/mixed.heatmap.svg" | tee "$OUT/mixed.stats.txt"
"$BIN" trace-stats --trace "$OUT/single.jsonl" | tee "$OUT/single.stats.txt"
"$BIN" simulate --trace "$OUT/mixed.jsonl" --slots 5%,10%,25%,50%,75% --plot "$OUT/mixed.hitrate.svg" \
  | tee "$OUT/mixed.sim.txt"
"$BIN" simulate --trace "$OUT/mixed.jsonl" --slots 5%,10%,25%,50%,75% --policy lru,lfu,eamc,s3fifo,arc --prefetch eamc \
  | tee "$OUT/mixed.sim-prefetch.txt"
"$BIN" simulate --trace "$OUT/mixed.jsonl" --slots 5%,10%,25%,50%,75% --json > "$OUT/mixed.sim.json"
"$BIN" simulate --trace "$OUT/shift.jsonl" --slots 25% --policy eamc --shift-at 6 2>&1 | tee "$OUT/shift.sim.txt"
