# libcore's include rules (scripts/check-layers.sh) hold on this tree, and each rule fails
# on a copy of lib/ and cmd/ with one violation injected.
set -eu
. "$TESTDIR/lib.sh"
root=$TESTDIR/../..
check=$root/scripts/check-layers.sh

sh "$check" "$root" >out.txt 2>&1 || { cat out.txt; die "the tree breaks its include rules"; }

# inject FILE LINE PATTERN: a copy of the tree with LINE added to FILE must fail the check
# with a message matching PATTERN.
inject() {
	rm -rf copy && mkdir copy && cp -R "$root/lib" "$root/cmd" copy/
	printf '%s\n' "$2" >>"copy/$1"
	if sh "$check" copy >out.txt 2>&1; then
		die "'$2' in $1 was not caught"
	fi
	grep -q -- "$3" out.txt || { cat out.txt; die "'$2' in $1: unexpected message"; }
}
inject lib/io/config.c '#include "model/gpt2.h"' "layer 'io' includes layer 'model' above it"
inject lib/common/rng.h '#include "backend/backend.h"' "layer 'common' includes layer 'backend'"
inject lib/model/gpt2.c '#include "backend/cpu/cpu_impl.h"' 'private to lib/backend'
inject lib/backend/ref/backend_ref.c '#include "backend/cpu/cpu_impl.h"' "another's files"
inject cmd/moe-bench.c '#include "backend/backend_impl.h"' 'private to lib/backend'
inject lib/moe/moe.c '#include <cblas.h>' 'only lib/backend/cpu uses BLAS'
inject lib/backend/backend.c '#include <cuda_runtime.h>' 'CUDA headers stay in kernels/'
inject lib/model/train.c 'static void f(void) { exit(1); }' 'never exits'
inject lib/io/tokfile.c 'static void g(void) { printf("x"); }' 'writes to stdout'
rm -rf copy && mkdir copy && cp -R "$root/lib" "$root/cmd" copy/ && mkdir copy/lib/extras
sh "$check" copy >out.txt 2>&1 && die "a folder lib/extras that is no layer was not caught"
grep -q 'not a layer' out.txt || die "lib/extras: unexpected message"
echo "include rules hold; 10 injected violations caught"
