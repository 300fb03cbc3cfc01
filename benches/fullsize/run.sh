#!/usr/bin/env bash
# Full size from SSD in 3 GiB: make the Qwen3.6-35B-A3B-shaped Q4_0 GGUF (once,
# benches/fullsize/make_gguf.py, 19.6 GB), moestream's expert store from it (once, `moestream
# convert`, 18.1 GB of experts; the dense weights stay in the GGUF), then llama.cpp and moestream
# side by side under a 3 GiB memory cgroup that counts the page cache, cold, through
# benches/bigmem/side_by_side.py, results to benches/results/lavapipe-fullsize.json. Run as root
# (cgroups). Peak disk use ~38 GB. DATA=DIR holds the model (default target/fullsize),
# PEER=DIR llama.cpp's builds (benches/peer/build_llama_cpp.sh), MOESTREAM_BIN the binary;
# extra flags go to side_by_side.py (e.g. `--slots 320 --decode 16`).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
DATA=${DATA:-$ROOT/target/fullsize}
PEER=${PEER:-$ROOT/target/peer}
BIN=${MOESTREAM_BIN:-$ROOT/target/release/moestream}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg}
mkdir -p "$XDG_RUNTIME_DIR" "$DATA"
GGUF=$DATA/q36-full-q4_0.gguf
[ -f "$GGUF" ] || "$PY" "$ROOT/benches/fullsize/make_gguf.py" "$GGUF"
[ -f "$DATA/store/experts.bin" ] || /usr/bin/time -v "$BIN" convert "$GGUF" "$DATA/store" --json
"$PY" "$ROOT/benches/bigmem/side_by_side.py" --moestream "$BIN" --data "$DATA" --gguf "$GGUF" --store "$DATA/store" \
    --llama-bin "$PEER/build/bin" --llama-cpu-bin "$PEER/build-cpu/bin" \
    --bound 3G --slots 320 --prompt 8 --decode 16 --prefill 512 \
    --llama-configs cpu-mmap,vk-ncmoe --policies lru,eamc --prefetch none,eamc --io-threads "" \
    --no-buffered --no-resident --json "$ROOT/benches/results/lavapipe-fullsize.json" "$@"
