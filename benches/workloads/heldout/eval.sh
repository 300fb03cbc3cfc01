#!/usr/bin/env bash
# The fixed held-out evaluation of expert prediction (issue #48), run the same way after every
# change to the prerouter or the cache policies:
#   1. prerouter recall@k per layer (heads vs the persistence and router baselines) on the two
#      held-out texts: the bundled model's held-out documents (in domain) and out_of_domain.txt;
#   2. a routing trace of the held-out workload (prompts.txt: 24 requests alternating between
#      the two texts, 32 greedy tokens each, one a step: no drafts; the prerouter heads' prediction
#      before each step recorded too), replayed by the cache simulator at 10/25/50% of the experts:
#      hit rate of each policy ÷ Belady's optimum, without prefetch, with EAMC's and with the
#      prerouter's (its recorded predictions).
# Run by hand after `cargo build --release` (~2 min on lavapipe, 2 cores). Writes
# benches/results/heldout-*.json and heldout.jsonl here, and prints the tables of benches/README.md.
set -euo pipefail
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg-$(id -u)}
mkdir -p "$XDG_RUNTIME_DIR"
cd "$(dirname "$0")/../../.."
BIN=${MOESTREAM:-target/release/moestream}
MODEL=${MODEL:-models/moestream-tiny-moe}
HERE=benches/workloads/heldout
OUT=benches/results
SLOTS=${SLOTS:-10%,25%,50%}
"$BIN" prerouter eval --model "$MODEL" --file "$MODEL/validation.txt" --json > "$OUT/heldout-prerouter-in-domain.json"
"$BIN" prerouter eval --model "$MODEL" --file "$HERE/out_of_domain.txt" --json > "$OUT/heldout-prerouter-out-of-domain.json"
"$BIN" generate --model "$MODEL" --prompt-file "$HERE/prompts.txt" --max-tokens 32 --ignore-eos --json \
  --temperature 0 --speculative off --prefetch prerouter --trace "$HERE/heldout.jsonl" > /dev/null
"$BIN" simulate --trace "$HERE/heldout.jsonl" --slots "$SLOTS" --json > "$OUT/heldout-cache.json"
"$BIN" simulate --trace "$HERE/heldout.jsonl" --slots "$SLOTS" --prefetch eamc --policy lru,lfu,eamc --json \
  > "$OUT/heldout-cache-prefetch.json"
"$BIN" simulate --trace "$HERE/heldout.jsonl" --slots "$SLOTS" --prefetch prerouter --policy lru,lfu,eamc --json \
  > "$OUT/heldout-cache-prerouter.json"
"$BIN" simulate --trace "$HERE/heldout.jsonl" --slots "$SLOTS" --prefetch prerouter+eamc --policy lfu,eamc --json \
  > "$OUT/heldout-cache-prerouter-eamc.json"
python3 "$HERE/tables.py" "$OUT"
