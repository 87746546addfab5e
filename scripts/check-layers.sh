#!/bin/sh
# check-layers.sh - the include rules of libcore's layers (README, LAYOUT), checked on a tree.
#
#   sh scripts/check-layers.sh [ROOT]      (default: the repository this script is in)
#
# Prints one line per broken rule, naming the file, the line and the rule, and exits 1 if
# there is any; exits 0 silently otherwise. The rules:
#  1. lib/ is in folders by layer, lowest first:
#        common io backend dist moe model dipaco route cli
#     a file of one layer includes headers ("layer/name.h") of its own layer or of layers
#     below it only, and every folder of lib/ is one of these layers;
#  2. lib/backend/NAME/ (one backend's implementation: cpu, ref, cuda) and backend_impl.h
#     are private to lib/backend: nothing outside includes them, and one backend's folder
#     does not include another's;
#  3. cmd/ includes libcore's public headers only (not *_impl.h, not a backend's folder);
#  4. only lib/backend/cpu includes the BLAS headers (cblas.h, oneDNN's); only lib/backend/cuda
#     (the cuda backend's C glue) includes CUDA headers in lib/ or cmd/ (kernels/, the .cu
#     files, is reached through the backend table);
#  5. lib/ never exits and never writes to stdout, except lib/cli, the program-support
#     layer whose job that is.
set -eu

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
[ -d "$root/lib" ] || { echo "check-layers.sh: '$root/lib': no such directory" >&2; exit 2; }
cd "$root"
layers="common io backend dist moe model dipaco route cli"

rank() {
	r=0
	for l in $layers; do
		[ "$l" = "$1" ] && { echo $r; return; }
		r=$((r + 1))
	done
	echo -1
}

bad=0
fail() {
	echo "$1"
	bad=1
}

for d in lib/*/; do
	d=${d%/}
	[ "$(rank "${d#lib/}")" -ge 0 ] ||
		fail "$d: not a layer (layers: $layers)"
done

# Every quoted include of the C sources and headers: file:line:#include "x/y.h"
includes=$(find lib cmd -name '*.[ch]' | sort | xargs grep -n '^[[:space:]]*#[[:space:]]*include' || true)

echo "$includes" | while IFS= read -r hit; do
	[ -n "$hit" ] || continue
	file=${hit%%:*}
	rest=${hit#*:}
	line=${rest%%:*}
	inc=$(echo "${rest#*:}" | sed -n 's/.*#[[:space:]]*include[[:space:]]*[<"]\([^>"]*\)[>"].*/\1/p')
	where="$file:$line: includes '$inc'"
	case $inc in
	cblas.h | openblas* | oneapi/dnnl/*)
		case $file in lib/backend/cpu/*) ;; *) echo "$where: only lib/backend/cpu uses BLAS" ;; esac
		continue ;;
	cuda*.h | cublas*.h | nccl.h | cudnn*.h | curand*.h | cuda/*)
		case $file in lib/backend/cuda/*) ;; *)
			echo "$where: CUDA headers stay in kernels/ and lib/backend/cuda (reached through the backend)" ;;
		esac
		continue ;;
	esac
	case $inc in */*) ;; *) continue ;; esac # system headers
	to=${inc%%/*}
	[ "$(rank "$to")" -ge 0 ] || continue   # <sys/stat.h> and the like
	case $inc in
	backend/*/*.h | backend/backend_impl.h)
		# a backend's own files: private to lib/backend, each folder to itself
		case $file in
		lib/backend/*) ;;
		*) echo "$where: a backend's implementation is private to lib/backend"; continue ;;
		esac
		sub=$(echo "$inc" | sed -n 's|^backend/\([^/]*\)/.*|\1|p')
		case $file in
		lib/backend/"$sub"/* | "") ;;
		*) [ -z "$sub" ] || echo "$where: one backend does not include another's files" ;;
		esac
		continue ;;
	*_impl.h)
		case $file in
		lib/"$to"/*) ;;
		*) echo "$where: *_impl.h headers are private to their layer" ;;
		esac
		continue ;;
	esac
	case $file in
	lib/*)
		from=$(echo "$file" | cut -d/ -f2)
		if [ "$(rank "$to")" -gt "$(rank "$from")" ]; then
			echo "$where: layer '$from' includes layer '$to' above it (order: $layers)"
		fi ;;
	esac
done >layers.$$.out || true
if [ -s layers.$$.out ]; then
	cat layers.$$.out
	bad=1
fi
rm -f layers.$$.out

# 5. no exit and no stdout in the library (comments and strings are not code, but a plain
# grep is strict enough: write "leave" instead of "exit" in a comment if it must be said)
hits=$(find lib -name '*.c' ! -path 'lib/cli/*' | sort |
	xargs grep -nE '(^|[^_a-z])(exit|_exit|abort|printf|puts|putchar)[[:space:]]*\(|[^a-z_]stdout[^a-z_]' |
	grep -vE '(snprintf|vsnprintf|fprintf\(stderr)' || true)
if [ -n "$hits" ]; then
	echo "$hits" | sed 's/$/: lib\/ never exits or writes to stdout (lib\/cli aside)/'
	bad=1
fi
exit $bad
