#!/bin/sh
# mutate-dist-dev.sh - shows that the device All-to-All's test can fail: each of a list of
# wrong variants of lib/dist/dist_dev.c (a wrong peer, a wrong stride copy, a missed block, the
# wrong communicator for 2DH's exchange across nodes, a size mismatch, a wrong pitch in 2DH's
# third phase) is built into build/emu/test_dist_dev's twin and run under mpirun at 4 and 8
# ranks (t-dist-dev.sh's runs); each must fail there (exit non-zero, without hanging), and the
# unchanged source must pass. Prints one line per variant and run; exits 1 when a variant
# passed or the original failed.
#
#   sh scripts/mutate-dist-dev.sh [SCRATCH]     (default: a fresh directory under /tmp)
#
# Works on a copy of the sources (the tree is not touched), built without nvcc (the emulator
# needs none); the first build takes a minute or two on 2 cores, each variant seconds. Needs
# mpicc, mpirun, a C++ compiler and python3.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d /tmp/mutate-dist-dev.XXXXXX)}
mkdir -p "$work/src"
cd "$here"
tar -cf - Makefile lib kernels cmd test | (cd "$work/src" && tar -xf -)
cd "$work/src"
orig=$work/dist_dev.c
cp lib/dist/dist_dev.c "$orig"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# mutate NAME: lib/dist/dist_dev.c = the original with variant NAME (exactly one site)
mutate() {
	python3 - "$1" "$orig" lib/dist/dist_dev.c <<'PY'
import sys
V = {
 "orig": ("", ""),
 "wrong-peer": ("p, 0, (char *)s->base + dist_span_off(s, W, nb, p, b, rb), chunk}",
                "p, 0, (char *)s->base + dist_span_off(s, W, nb, (p + 1) % W, b, rb), chunk}"),
 "wrong-stride-copy": ("(size_t)m * sps, blk, (size_t)N));", "sps, blk, (size_t)N));"),
 "missed-block": ("ERR_FORWARD(piece_copy(x, r, q, s, q, nb, n, rb));",
                  "ERR_FORWARD(piece_copy(x, r, q, s, q, nb > 1 ? nb - 1 : nb, n, rb));"),
 "wrong-comm-phase4": ("return be->op->comm_exchange(be, x->inter, x->x, (int)k);",
                       "return be->op->comm_exchange(be, x->intra, x->x, (int)k);"),
 "size-mismatch": ("{p, 0, A + (size_t)p * N * S, (size_t)N * S}",
                   "{p, 0, A + (size_t)p * N * S, (size_t)N * S - 1}"),
 "phase3-pitch": ("copy_2d(be, A + (size_t)l2 * S, (size_t)m * S,",
                  "copy_2d(be, A + (size_t)l2 * S, S,"),
}
name, src, dst = sys.argv[1:]
s = open(src).read()
a, b = V[name]
if a:
    if s.count(a) != 1:
        sys.exit("mutate-dist-dev.sh: variant %s: its site is not in dist_dev.c once" % name)
    s = s.replace(a, b)
open(dst, "w").write(s)
PY
}

bad=0
for v in orig wrong-peer wrong-stride-copy missed-block wrong-comm-phase4 size-mismatch \
	phase3-pitch; do
	mutate "$v"
	nice make -s HAVE_CUDA=0 BUILD="$work/build" "$work/build/emu/test_dist_dev" \
		>"$work/make.log" 2>&1 || { cat "$work/make.log"; echo "$v: build failed"; exit 1; }
	for n in 4 8; do
		timeout -k 10 240 mpirun --quiet --oversubscribe -np "$n" \
			"$work/build/emu/test_dist_dev" >"$work/out" 2>"$work/err" && rc=0 || rc=$?
		first=$(grep -m1 '^test_dist_dev: rank' "$work/err" | cut -c1-160 || true)
		if [ "$v" = orig ]; then
			[ "$rc" -eq 0 ] && echo "original, $n ranks: passes" ||
				{ echo "original, $n ranks: FAILS (exit $rc)"; bad=1; }
		elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
			echo "$v, $n ranks: HUNG (killed)"; bad=1
		elif [ "$rc" -eq 0 ]; then
			echo "$v, $n ranks: NOT CAUGHT"; bad=1
		else
			echo "$v, $n ranks: caught: $first"
		fi
	done
done
exit $bad
