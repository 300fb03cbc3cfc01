#!/usr/bin/env bash
# The whole "bigger than memory" benchmark: make the model (once), then llama.cpp and moestream
# side by side under one memory cgroup (page cache included), results to
# benches/results/lavapipe-bigmem.json. Run as root (cgroups). Extra flags go to side_by_side.py,
# e.g. `--bound 480M --slots 32 --decode 12`; DATA=DIR puts the model in DIR.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg}
mkdir -p "$XDG_RUNTIME_DIR"
PYTHON="$PY" "$ROOT/benches/bigmem/make.sh"
"$PY" "$ROOT/benches/bigmem/side_by_side.py" --data "${DATA:-$ROOT/target/bigmem}" --json "$ROOT/benches/results/lavapipe-bigmem.json" "$@"
