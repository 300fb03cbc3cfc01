#!/usr/bin/env bash
# The whole "bigger than memory" benchmark: make the model (once), build llama.cpp (once, both
# builds: benches/peer/build_llama_cpp.sh into PEER, default target/peer), then llama.cpp and
# moestream side by side under one memory cgroup (page cache included), each configuration in a
# cold process of its own, results to benches/results/lavapipe-bigmem.json; the tables it prints
# are regenerated from that JSON by `side_by_side.py --print JSON`. Run as root (cgroups), after
# `cargo build --release`. Extra flags go to side_by_side.py, e.g. `--bound 480M --slots 32
# --decode 12`; DATA=DIR puts the model in DIR, PEER=DIR llama.cpp's builds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
PEER=${PEER:-$ROOT/target/peer}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg}
mkdir -p "$XDG_RUNTIME_DIR"
[ -x "$ROOT/target/release/moestream" ] || { echo "build moestream first: cargo build --release" >&2; exit 1; }
PYTHON="$PY" "$ROOT/benches/bigmem/make.sh"
if [ ! -x "$PEER/build/bin/llama-bench" ] || [ ! -x "$PEER/build-cpu/bin/llama-bench" ]; then
    "$ROOT/benches/peer/build_llama_cpp.sh" "$PEER"
fi
"$PY" "$ROOT/benches/bigmem/side_by_side.py" --data "${DATA:-$ROOT/target/bigmem}" \
    --llama-bin "$PEER/build/bin" --llama-cpu-bin "$PEER/build-cpu/bin" \
    --json "$ROOT/benches/results/lavapipe-bigmem.json" "$@"
