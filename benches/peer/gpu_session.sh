#!/usr/bin/env bash
# One short session on a lent GPU machine (which has python3 with numpy, torch and safetensors,
# but no Rust, no Vulkan SDK and no network): every GPU figure the README quotes, measured in one
# run on the same adapter, into $OUT.
#
#   benches/peer/gpu_session.sh pack      here: cargo build --release, build_llama_cpp.sh, then
#                                         packs moestream, llama.cpp's binaries and libraries and
#                                         llama.cpp's gguf-py into target/gpu-carry (xz, < 64 MiB)
#   benches/peer/gpu_session.sh run       there, with target/gpu-carry carried: makes the
#                                         reference bench model and its GGUFs, then runs
#                                         devices, bench kernels, bench profile (also with
#                                         MOESTREAM_SHADER_CHECKS=on), bench model and
#                                         side_by_side.py (llama-bench + test-backend-ops)
#
# `run` writes everything under $OUT (default target/gpu-session): devices.txt, kernels.json,
# profile.json, side_by_side.json and .txt, log.txt (and the *-teams8.json of 8-lane decode teams, model-*-chained.json: decode with and without chained steps, *-checked.json: kernels with every naga check, model-draft-prefetch-72.json: verify steps' experts read ahead or not). About 6-8 minutes on an H200. PROMPT,
# DECODE and RUNS (default 512, 128, 3) set the token counts; small ones make a quick dry run
# on lavapipe (PROMPT=32 DECODE=8 RUNS=1: about 4 minutes on the 2-core VM).
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=target/gpu-carry
PEER=target/peer

pack() {
  cargo build --release --locked --bin moestream
  [ -x "$PEER/build/bin/llama-bench" ] || benches/peer/build_llama_cpp.sh "$PEER"
  local stage
  stage="$(mktemp -d)"
  mkdir -p "$stage/peer/build/bin" "$stage/bin"
  cp target/release/moestream "$stage/bin/"
  cp -P "$PEER"/build/bin/{llama-bench,llama-quantize,test-backend-ops} "$stage/peer/build/bin/"
  cp -P "$PEER"/build/bin/*.so* "$stage/peer/build/bin/"
  cp -r "$PEER"/llama_cpp_python-*/vendor/llama.cpp/gguf-py "$stage/gguf-py"
  rm -rf "$CARRY"
  mkdir -p "$CARRY"
  tar -C "$stage" -cf - . | xz -T0 -9 > "$CARRY/bundle.tar.xz"
  rm -rf "$stage"
  local bytes
  bytes=$(stat -c %s "$CARRY/bundle.tar.xz")
  echo "packed $CARRY/bundle.tar.xz: $((bytes / 1048576)) MiB (the device tool carries 64 MiB in all)"
  [ "$bytes" -lt $((60 * 1048576)) ] || { echo "too large to carry" >&2; exit 1; }
}

run() {
  OUT="${OUT:-target/gpu-session}"
  PROMPT="${PROMPT:-512}" DECODE="${DECODE:-128}" RUNS="${RUNS:-3}"
  mkdir -p "$OUT"
  exec > >(tee "$OUT/log.txt") 2>&1
  local root=/tmp/moestream-gpu
  mkdir -p "$root/models"
  tar -C "$root" -xJf "$CARRY/bundle.tar.xz"
  export LD_LIBRARY_PATH="$root/peer/build/bin:${LD_LIBRARY_PATH:-}"
  export PYTHONPATH="$root/gguf-py:${PYTHONPATH:-}"
  export PYTHONUNBUFFERED=1
  local moe="$root/bin/moestream" models="$root/models"
  "$moe" devices | tee "$OUT/devices.txt"
  python3 benches/make_bench_model.py "$models/bench-mixtral"
  "$moe" convert "$models/bench-mixtral" "$models/bench-mixtral-int4"
  "$moe" bench kernels --json > "$OUT/kernels.json"
  "$moe" bench kernels --rows 14336 --cols 4096 --json > "$OUT/kernels-14336x4096.json"
  # The decode kernels' team size: the adapter's pick above (32 lanes where subgroups have at
  # least 32, Caps::decode_team), 8-lane teams here, for the int4 / f16 matvec and a decode step.
  MOESTREAM_DECODE_LAYOUT=teams8 "$moe" bench kernels --json > "$OUT/kernels-teams8.json"
  MOESTREAM_DECODE_LAYOUT=teams8 "$moe" bench kernels --rows 14336 --cols 4096 --json \
    > "$OUT/kernels-14336x4096-teams8.json"
  MOESTREAM_DECODE_LAYOUT=teams8 "$moe" bench profile --model "$models/bench-mixtral-int4" --prompt-tokens "$PROMPT" \
    --decode-tokens "$DECODE" --json > "$OUT/profile-teams8.json"
  "$moe" bench profile --model "$models/bench-mixtral-int4" --prompt-tokens "$PROMPT" --decode-tokens "$DECODE" \
    --json > "$OUT/profile.json"
  # Kernels with every naga check (MOESTREAM_SHADER_CHECKS=on) against the default build, which
  # on Vulkan drops the index clamps and loop counters: the matvec and a decode step.
  MOESTREAM_SHADER_CHECKS=on "$moe" bench kernels --json > "$OUT/kernels-checked.json"
  MOESTREAM_SHADER_CHECKS=on "$moe" bench profile --model "$models/bench-mixtral-int4" --prompt-tokens "$PROMPT" \
    --decode-tokens "$DECODE" --json > "$OUT/profile-checked.json"
  # Chained greedy decode (on by default on a GPU) against one step at a time, runs in turn.
  for m in models/moestream-tiny-moe "$models/bench-mixtral-int4"; do
    "$moe" bench model --model "$m" --prompt-tokens "$PROMPT" --decode-tokens "$DECODE" --runs "$RUNS" \
      --compare-chained --json > "$OUT/model-$(basename "$m")-chained.json"
  done
  # Streaming decode with optimistic steps (one submission per token) against layer by layer,
  # at all experts but one (every step hits) and at a quarter of them.
  for slots in 127 32; do
    "$moe" bench model --model "$models/bench-mixtral-int4" --prompt-tokens "$PROMPT" --decode-tokens "$DECODE" \
      --runs "$RUNS" --expert-slots "$slots" --compare-optimistic --json > "$OUT/model-optimistic-$slots.json"
  done
  # MTP drafts on the bundled model, converted (its store read with O_DIRECT), streamed at a
  # quarter of its experts (72 of 288, the MTP layer's among them), their verify steps' experts
  # read ahead (the default on a GPU) against not, runs in turn.
  "$moe" convert models/moestream-tiny-moe "$models/tiny-int4"
  "$moe" bench model --model "$models/tiny-int4" --prompt-file models/moestream-tiny-moe/validation.txt \
    --prompt-tokens 64 --decode-tokens "$DECODE" --runs "$RUNS" --speculative mtp --temperature 0 \
    --expert-slots 72 --direct-io on --compare-draft-prefetch --json > "$OUT/model-draft-prefetch-72.json"
  python3 benches/peer/side_by_side.py --peer "$root/peer" --models "$models" --prompt "$PROMPT" \
    --decode "$DECODE" --runs "$RUNS" --moestream "$moe" --json "$OUT/side_by_side.json" | tee "$OUT/side_by_side.txt"
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: $0 pack|run" >&2; exit 2 ;;
esac
