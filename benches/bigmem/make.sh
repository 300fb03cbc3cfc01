#!/usr/bin/env bash
# Makes the "bigger than memory" benchmark model in DATA (default target/bigmem):
#   DATA/converted/        moestream's int4 conversion (experts.bin ~1.5 GB + resident weights)
#   DATA/bigmem-q4_0.gguf  the same weights as GGUF Q4_0 for llama.cpp (~1.4 GB)
# from a random-weight Hugging Face checkpoint (benches/make_bench_model.py --shape bigmem,
# 4.8 GB of bf16, written tensor by tensor) that is deleted at the end. Peak disk use ~8 GB.
# Needs: cargo build --release; the venv with numpy, torch, safetensors, gguf.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DATA=${DATA:-$ROOT/target/bigmem}
PY=${PYTHON:-python3}
mkdir -p "$DATA"
if [ ! -f "$DATA/converted/experts.bin" ] || [ ! -f "$DATA/bigmem-q4_0.gguf" ]; then
    [ -f "$DATA/hf/model.safetensors" ] || "$PY" "$ROOT/benches/make_bench_model.py" "$DATA/hf" --shape bigmem
fi
[ -f "$DATA/converted/experts.bin" ] ||
    "$ROOT/target/release/moestream" convert "$DATA/hf" "$DATA/converted"
# The GGUF is quantized straight to Q4_0 by llama.cpp's gguf package (an F16 GGUF for
# llama-quantize would not fit the disk beside the checkpoint).
[ -f "$DATA/bigmem-q4_0.gguf" ] ||
    "$PY" "$ROOT/benches/peer/make_gguf.py" "$DATA/hf" "$DATA/bigmem-q4_0.gguf" --type q4_0
rm -rf "$DATA/hf"
du -sh "$DATA"/*
