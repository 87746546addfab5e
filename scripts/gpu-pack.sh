#!/bin/sh
# gpu-pack.sh - build the CUDA backend here and pack what scripts/gpu-check.sh needs on a GPU
# machine that has the NVIDIA driver, the CUDA 13 runtime libraries (cuBLAS) and python3 with
# torch, but none of Debian's libraries and no package registry.
#
#   sh scripts/gpu-pack.sh [PACKDIR]        (default .gpu, in the repository root)
#
# PACKDIR gets one file, pack.tar.gz (gpu-check.sh unpacks it), holding bin/ (the programs
# gpu-check.sh runs), test/ (the Criterion tests that compare backends), lib/ (every shared
# library those need except the C library, the driver and cuBLAS, which the GPU machine has:
# OpenBLAS, libyaml, jansson, Criterion and theirs) and data/ (Brown's validation tokens, which
# the training runs of gpu-check.sh train on: the whole pack stays near 20 MB). Building needs nvcc (make probes it);
# the pack is x86-64 Linux, glibc 2.36 or newer. Rebuilding is incremental: rerunning after
# an edit costs the changed files only.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
pack=${1:-$here/.gpu}
cd "$here"

make -j"$(nproc)" all build/test/test_backend build/test/test_moe >/dev/null
# the built backends, as the programs name them ("unknown device ... (built: cpu, ref, cuda)")
build/bin/moe-bench --device none 2>&1 | grep -q 'built:.*cuda' ||
	{ echo "gpu-pack.sh: this build has no cuda backend (is nvcc on PATH or in /usr/local/cuda?)" >&2; exit 1; }
[ -s data/brown/train.tok ] && [ -s data/brown/val.tok ] ||
	{ echo "gpu-pack.sh: data/brown/*.tok missing: run sh scripts/get-brown.sh first" >&2; exit 1; }

rm -rf "$pack.tmp"
mkdir -p "$pack.tmp/bin" "$pack.tmp/test" "$pack.tmp/lib" "$pack.tmp/data"
cp build/bin/moe-bench build/bin/dpc-train-path "$pack.tmp/bin/"
cp build/test/test_backend build/test/test_moe "$pack.tmp/test/"
cp data/brown/val.tok "$pack.tmp/data/"
# Shared libraries: all that ldd resolves, but the C library's own, the dynamic loader, the
# CUDA driver and cuBLAS (the GPU machine's must match its driver).
for f in "$pack.tmp"/bin/* "$pack.tmp"/test/*; do
	ldd "$f" | awk '$3 ~ /^\// { print $3 }'
done | sort -u | while read -r so; do
	case $(basename "$so") in
	libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*) ;;
	*) cp -L "$so" "$pack.tmp/lib/" ;;
	esac
done
tar -C "$pack.tmp" -czf "$pack.tmp.tar.gz" bin test lib data
rm -rf "$pack" "$pack.tmp"
mkdir -p "$pack"
mv "$pack.tmp.tar.gz" "$pack/pack.tar.gz"
du -sh "$pack/pack.tar.gz" | awk '{ print "gpu-pack.sh: packed " $1 " into '"$pack"'/pack.tar.gz" }'
