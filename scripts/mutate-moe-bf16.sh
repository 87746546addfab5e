#!/bin/sh
# mutate-moe-bf16.sh - shows that test_backend's moe_dispatch_bf16 can fail: each of a list of
# wrong variants of the bfloat16 dispatch kernels (kernels/moe.cu on the emulator, the cpu
# backend, and the oracle itself) is built into build/emu/test_backend's twin and that test
# run; each must fail, and the unchanged sources must pass. Prints one line per variant with
# the first failure; exits 1 when a variant passed or the original failed.
#
#   sh scripts/mutate-moe-bf16.sh [SCRATCH]     (default: a fresh directory under /tmp)
#
# Works on a copy of the sources (the tree is not touched), built without nvcc (the emulator
# needs none); the first build takes a few minutes on 2 cores, each variant under a minute.
# Needs a C++ compiler and python3.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d /tmp/mutate-moe-bf16.XXXXXX)}
mkdir -p "$work/src" "$work/orig"
cd "$here"
tar -cf - Makefile lib kernels cmd test | (cd "$work/src" && tar -xf -)
cd "$work/src"
for f in kernels/moe.cu lib/backend/cpu/moe_cpu.c lib/backend/ref/backend_ref.c; do
	cp "$f" "$work/orig/$(basename "$f")"
done

# mutate NAME: the three files as they were, then variant NAME applied (exactly one site)
mutate() {
	python3 - "$1" "$work/orig" <<'PY'
import sys
CU, CPU, REF = "kernels/moe.cu", "lib/backend/cpu/moe_cpu.c", "lib/backend/ref/backend_ref.c"
V = {
 "orig": (CU, "", ""),
 # cuda: bfloat16 stores truncate instead of rounding to nearest even
 "cuda-truncate": (CU, "\t\treturn __float2bfloat16_rn(v);\n",
                   "\t\treturn __ushort_as_bfloat16((unsigned short)(__float_as_uint(v) >> 16));\n"),
 "cuda-truncate-vector": (CU,
   "\t\treturn (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |\n"
   "\t\t       (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;",
   "\t\treturn (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);"),
 # cuda: decode and encode backward miss the rank-1 choice of bfloat16 rows
 "cuda-missed-choice": (CU, "\t\t\t\tif (l < 0)\n\t\t\t\t\tcontinue;\n\t\t\t\tconst S *src = buf",
                        "\t\t\t\tif (l < 0 || (sizeof(S) == 2 && j == 1))\n\t\t\t\t\tcontinue;\n"
                        "\t\t\t\tconst S *src = buf"),
 # cuda: the gather counts floor(M / 8) groups: the partial last one is never written
 "cuda-tail-groups": (CU,
   "\tconst int64_t G = (M + W - 1) / W, B = blockDim.x;\n"
   "\tfor (int64_t t = blockIdx.x; t < T; t += gridDim.x) {\n\t\tfor (int64_t g0",
   "\tconst int64_t G = sizeof(S) == 2 ? M / W : (M + W - 1) / W, B = blockDim.x;\n"
   "\tfor (int64_t t = blockIdx.x; t < T; t += gridDim.x) {\n\t\tfor (int64_t g0"),
 # cuda: the scalar store of a group skips its last element (bfloat16)
 "cuda-tail-store": (CU, "\t\tif (i == 0 || m + i < M)\n\t\t\trow[m + i] = row_io<S>::narrow(a[i]);",
                     "\t\tif (i == 0 || (m + i < M && (sizeof(S) == 4 || i < W - 1)))\n"
                     "\t\t\trow[m + i] = row_io<S>::narrow(a[i]);"),
 # cuda: the score applied twice, in decode and in d_eo
 "cuda-score-twice-decode": (CU, "a = WEIGHTED ? fmaf(s, v[e], a)",
                             "a = WEIGHTED ? fmaf(s, sizeof(S) == 2 ? s * v[e] : v[e], a)"),
 "cuda-score-twice-d_eo": (CU, "sa[e] = s * a[e];", "sa[e] = (sizeof(S) == 2 ? s : 1.0f) * s * a[e];"),
 # cuda: half the padding zeroed; the halves of a uint4 word swapped
 "cuda-half-padding": (CU, "i < n / RW<S>; i += step)", "i < n / (2 * RW<S>); i += step)"),
 "cuda-swapped-halves": (CU, "\t\ta[0] = __uint_as_float(w << 16);\n\t\ta[1] = __uint_as_float(w & 0xffff0000u);",
                         "\t\ta[1] = __uint_as_float(w << 16);\n\t\ta[0] = __uint_as_float(w & 0xffff0000u);"),
 # cpu: d_eo truncated; a term of the dot product's tree lost; a block one element short
 "cpu-truncate-d_eo": (CPU, "d[m] = backend_bf16_from_float(sc *\n\t\t\t\t\t\t\t\t       "
                       "backend_bf16_to_float(g[m]));",
                       "{ float v_ = sc * backend_bf16_to_float(g[m]); uint32_t u_;\n"
                       "memcpy(&u_, &v_, 4); d[m] = (uint16_t)(u_ >> 16); }"),
 "cpu-dot-tree": (CPU, "((p[1] + p[5]) + (p[3] + p[7]));", "((p[1] + p[5]) + p[3]);"),
 "cpu-block-tail": (CPU, "const int64_t n = M - m0 < BF_BLOCK ? M - m0 : BF_BLOCK;",
                    "const int64_t n = M - m0 < BF_BLOCK ? M - m0 - (M > 1) : BF_BLOCK;"),
 # ref: the oracle rounds ties away from zero, or truncates
 "ref-ties-away": (REF, "if (lo > 0x8000u || (lo == 0x8000u && (sticky || (hi & 1u))))",
                   "if (lo >= 0x8000u)"),
 "ref-truncate": (REF, "if (lo > 0x8000u || (lo == 0x8000u && (sticky || (hi & 1u))))",
                  "if (0)"),
 # cuda: ties away from zero
 "cuda-ties-away": (CU, "\t\treturn __float2bfloat16_rn(v);\n",
                    "\t\treturn __ushort_as_bfloat16((unsigned short)((__float_as_uint(v) + 0x8000u) >> 16));\n"),
}
name, orig = sys.argv[1:]
for f in (CU, CPU, REF):
    open(f, "w").write(open(orig + "/" + f.split("/")[-1]).read())
f, a, b = V[name]
s = open(f).read()
if a:
    if s.count(a) != 1:
        sys.exit("mutate-moe-bf16.sh: variant %s: its site is not in %s once" % (name, f))
    s = s.replace(a, b)
open(f, "w").write(s)
PY
}

bad=0
for v in orig cuda-truncate cuda-truncate-vector cuda-missed-choice cuda-tail-groups \
	cuda-tail-store cuda-score-twice-decode cuda-score-twice-d_eo cuda-half-padding \
	cuda-swapped-halves cuda-ties-away cpu-truncate-d_eo cpu-dot-tree cpu-block-tail \
	ref-ties-away ref-truncate; do
	mutate "$v"
	nice make -s HAVE_CUDA=0 BUILD="$work/build" "$work/build/emu/test_backend" \
		>"$work/make.log" 2>&1 || { cat "$work/make.log"; echo "$v: build failed"; exit 1; }
	timeout -k 10 300 "$work/build/emu/test_backend" --filter 'backend/moe_dispatch_bf16' \
		>"$work/out" 2>&1 && rc=0 || rc=$?
	first=$(grep -m1 "^\[----\] .*moe_" "$work/out" | cut -c1-200 || true)
	if [ "$v" = orig ]; then
		[ "$rc" -eq 0 ] && echo "original: passes" || { echo "original: FAILS (exit $rc)"; bad=1; }
	elif [ "$rc" -eq 0 ]; then
		echo "$v: NOT CAUGHT"; bad=1
	else
		echo "$v: caught: $first"
	fi
done
exit $bad
