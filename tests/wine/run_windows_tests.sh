#!/usr/bin/env bash
# Builds the Windows binary and the GPU test binaries that matter most for
# x86_64-pc-windows-gnu (mingw-w64) and runs the tests under Wine on Vulkan: on a machine without
# a GPU that is Mesa's lavapipe, reached through Wine's winevulkan, with Xvfb as the display Wine
# wants. Needs tests/wine/setup.sh first. Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=x86_64-pc-windows-gnu
tests=(kernels_misc kernels_norm_rope kernels_attention kernels_matmul kernels_moe
       kernels_linear_attention kernels_ggml engine_golden streaming_exact bundled_model)

# The target's standard library; where rustup cannot fetch it (offline), say so and skip, as
# .ci/run's compile checks do.
if ! timeout 300 rustup target add "$target" >/dev/null 2>&1; then
  echo "rustup could not add $target: skipping the Windows build's tests"
  exit 0
fi

# Building integration tests builds the moestream binary too (with the same features).
test_args=()
for t in "${tests[@]}"; do test_args+=(--test "$t"); done
cargo test --release --locked --target "$target" --no-run --message-format=json "${test_args[@]}" \
  | python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["kind"] == ["test"]:
        print(msg["executable"])
' > target/wine/windows-tests.txt

# Wine 8.0 lacks bcryptprimitives.dll!ProcessPrng, which Rust's std imports: a stub beside the
# executables (Windows' own loader would find the system's first; Wine's finds this one).
cp target/wine/bcryptprimitives.dll "target/$target/release/"
cp target/wine/bcryptprimitives.dll "target/$target/release/deps/"

export WINEPREFIX="$PWD/target/wine/prefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
exe="target/$target/release/moestream.exe"
# Wine offers the GPU twice, through DX12 (its vkd3d) first, then Vulkan. wgpu cannot open the
# DX12 one with Wine's own shader compiler, so the README's first command must fall back to
# Vulkan with a warning and give the tokens the Vulkan adapter gives.
xvfb-run -a wine "$exe" devices
WGPU_BACKEND=vulkan xvfb-run -a wine "$exe" generate -p "The history of" -n 16 --seed 7 > target/wine/vulkan.txt
xvfb-run -a wine "$exe" generate -p "The history of" -n 16 --seed 7 > target/wine/default.txt 2> target/wine/default.log
grep -a "falling back to" target/wine/default.log
cmp target/wine/vulkan.txt target/wine/default.txt
# The Linux build (built by `cargo test --release` before this script in .ci/run) gives them too.
if [ -x target/release/moestream ]; then
  target/release/moestream generate -p "The history of" -n 16 --seed 7 2>/dev/null | cmp - target/wine/vulkan.txt
fi
echo "the default adapter's run fell back to Vulkan and gave its tokens: $(head -c 80 target/wine/default.txt)"

export WGPU_BACKEND=vulkan
failed=0
while read -r exe; do
  echo "== $(basename "$exe") under Wine"
  if ! xvfb-run -a wine "$exe"; then
    failed=1
  fi
done < target/wine/windows-tests.txt
exit $failed
