#!/usr/bin/env bash
# Builds llama.cpp (CPU + Vulkan backends; llama-bench, llama-quantize, test-backend-ops,
# llama-perplexity) from the tree vendored in PyPI's llama-cpp-python source distribution, for the
# side-by-side benchmarks in this folder, into OUT/build/bin; and a CPU-only build (no Vulkan
# backend; llama-bench) into OUT/build-cpu/bin, which benches/bigmem/ measures beside it (set
# CPU_ONLY=0 to skip it). Nothing of llama.cpp is committed here.
#
#   benches/peer/build_llama_cpp.sh [OUT]      (default OUT: target/peer)
#
# Needs cmake, a C++ compiler, glslc and the Vulkan and SPIR-V headers (Debian: cmake glslc
# libvulkan-dev spirv-headers),
# and pip (PyPI). GGML_NATIVE=OFF so the binaries can be carried to another x86-64 machine.
# LLAMA_BUILD_SERVER=ON also builds llama-server in both builds (benches/peer/serve_side_by_side.py);
# VULKAN=0 skips the Vulkan build (e.g. for a CPU-only llama-server).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-target/peer}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SRC="$OUT/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -d "$SRC" ]; then
  python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$OUT"
  tar xzf "$OUT/llama_cpp_python-$VERSION.tar.gz" -C "$OUT"
fi
# Debian 12's Vulkan headers (1.3.239) predate VK_EXT_layer_settings, which llama.cpp uses only
# to turn on validation-layer best practices: compile that part only where the headers have it.
python3 - "$SRC/ggml/src/ggml-vulkan/ggml-vulkan.cpp" <<'PY'
import sys
path = sys.argv[1]
s = open(path).read()
start = "    VkBool32 enable_best_practice = layer_settings;\n"
end = "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, &layer_setting_info);\n"
if "#ifdef VK_EXT_layer_settings\n" + start not in s and start in s and end in s:
    a = s.index(start)
    b = s.index(end) + len(end)
    guarded = ("#ifdef VK_EXT_layer_settings\n" + s[a:b] + "#else\n"
               "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);\n"
               "#endif\n")
    s = s[:a] + guarded + s[b:]
    open(path, "w").write(s)
PY
SERVER="${LLAMA_BUILD_SERVER:-OFF}"
SERVER_TARGET=""
case "$SERVER" in ON|on|1|TRUE|true) SERVER=ON; SERVER_TARGET=llama-server ;; *) SERVER=OFF ;; esac
if [ "${VULKAN:-1}" != 0 ]; then
cmake -S "$SRC" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON -DGGML_NATIVE=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER="$SERVER" -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$OUT/build" -j"$(nproc)" --target llama-bench llama-quantize llama-perplexity test-backend-ops $SERVER_TARGET
echo "built: $OUT/build/bin/{llama-bench,llama-quantize,llama-perplexity,test-backend-ops} $SERVER_TARGET"
fi
if [ "${CPU_ONLY:-1}" != 0 ]; then
  cmake -S "$SRC" -B "$OUT/build-cpu" -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=OFF -DGGML_NATIVE=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER="$SERVER" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$OUT/build-cpu" -j"$(nproc)" --target llama-bench $SERVER_TARGET
  echo "built (CPU only): $OUT/build-cpu/bin/llama-bench $SERVER_TARGET"
fi
echo "llama.cpp's gguf-py and convert_hf_to_gguf.py: $SRC"
