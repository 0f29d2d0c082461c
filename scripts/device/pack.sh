#!/usr/bin/env bash
# Packs binaries built here, with the shared libraries they need that a CUDA machine
# image may lack (abseil, pcre2, xxhash, ...), into .carry/device/{bin,lib} so that a GPU
# machine without those packages can run them (the device tool carries `.carry`).
#   scripts/device/pack.sh BINARY...      then, there:  scripts/device/env.sh BINARY ARGS...
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${PACK_DEST:-$root/.carry/device}"
mkdir -p "$dest/bin" "$dest/lib"
for b in "$@"; do
  # Without debug info: the device tool carries at most 64 MiB.
  strip -o "$dest/bin/$(basename "$b")" "$b"
  # Everything but the C/C++ runtime, the driver and the CUDA toolkit's libraries, which
  # the GPU machine has (newer).
  ldd "$b" | awk '/=> \// {print $3}' |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libcuda|libcublas|libcublasLt|libcudart|libnccl)\.so' |
    while read -r lib; do cp -Lf "$lib" "$dest/lib/"; done || true  # none to copy is fine
done
du -sh "$dest" >&2
