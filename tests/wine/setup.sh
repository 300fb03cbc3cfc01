#!/usr/bin/env bash
# Makes target/wine/: what the Windows checks need on a Linux machine.
#   fxc_compile.exe        tests/wine/fxc_compile.c, which runs Microsoft's FXC on HLSL files
#   d3dcompiler_47.dll     Microsoft's FXC 10.0.26100 (the Windows 11 SDK's), from PyPI's
#                          kivy-deps.angle 0.5.0 wheel, checked against its sha256
#   bcryptprimitives.dll   tests/wine/process_prng.c: ProcessPrng, which Rust's std imports and
#                          Wine 8.0 lacks
#   prefix/                a Wine prefix of its own
# Installs Debian's wine64, gcc-mingw-w64-x86-64, xvfb and xauth first where they are missing (as root).
# Used by .ci/run; tests/shader_portability.rs and tests/wine/run_windows_tests.sh use its output.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/wine
mkdir -p "$out"

if ! command -v wine >/dev/null || ! command -v x86_64-w64-mingw32-gcc >/dev/null || ! command -v Xvfb >/dev/null; then
  echo "Installing Wine, mingw-w64 and Xvfb (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq wine64 gcc-mingw-w64-x86-64 xvfb xauth >/dev/null
fi

x86_64-w64-mingw32-gcc -O2 -Wall -o "$out/fxc_compile.exe" tests/wine/fxc_compile.c
x86_64-w64-mingw32-gcc -O2 -Wall -shared -o "$out/bcryptprimitives.dll" tests/wine/process_prng.c -ladvapi32

wheel=kivy_deps_angle-0.5.0-cp311-cp311-win_amd64.whl
wheel_sha256=d16d68cc45a2a326a3f8f738c649bb00ae5d7c3e58cff70f415fa57bd1d28713
dll_sha256=c8e25abd3d45dfb55966a74613258c39b4a83ea2ac77f2f80903499f4d5c03f0
if ! echo "$dll_sha256  $out/d3dcompiler_47.dll" | sha256sum --check --status 2>/dev/null; then
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform win_amd64 --python-version 3.11 "kivy-deps.angle==0.5.0" -d "$out/wheels"
  echo "$wheel_sha256  $out/wheels/$wheel" | sha256sum --check --quiet
  python3 - "$out/wheels/$wheel" "$out/d3dcompiler_47.dll" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    data = wheel.read("kivy_deps_angle-0.5.0.data/data/share/angle/bin/d3dcompiler_47.dll")
open(sys.argv[2], "wb").write(data)
PY
  echo "$dll_sha256  $out/d3dcompiler_47.dll" | sha256sum --check --quiet
  rm -rf "$out/wheels"
fi

# A prefix made once; mono and gecko are not needed (and would ask to be downloaded).
export WINEPREFIX="$PWD/$out/prefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
if [ ! -f "$WINEPREFIX/system.reg" ]; then
  wineboot --init >/dev/null 2>&1
  wineserver --wait
fi
echo "target/wine ready: $(wine --version)"
