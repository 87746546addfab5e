# t-completion.sh - scripts/dpc-completion.bash offers what the programs' --help lists (issue 10,
# shell completion): subcommands for the first word, a subcommand's own long options, a
# program's options, file names for arguments. Skips (77) without bash.
set -eu
. "$TESTDIR/lib.sh"
command -v bash >/dev/null || skip "skipped: no bash"
for p in dpc-route dpc-shard dpc-train-path moe-bench; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done
: >model.safetensors
PATH=$BIN:$PATH bash -c '
. "$1"
complete_words() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _dpc_complete; echo "${COMPREPLY[*]}"; }
got=$(complete_words dpc-shard c);               [ "$got" = "cat" ] || { echo "dpc-shard c: $got"; exit 1; }
got=$(complete_words dpc-route s);               [ "$got" = "score sample" ] || { echo "dpc-route s: $got"; exit 1; }
got=$(complete_words dpc-route sample --to);     [ "$got" = "--tokenizer --tokens --top-k --top-p" ] || { echo "sample --to: $got"; exit 1; }
got=$(complete_words dpc-train-path --pr);       [ "$got" = "--precision --print-config" ] || { echo "--pr: $got"; exit 1; }
got=$(complete_words moe-bench --capacity);      [ "$got" = "--capacity --capacity-align --capacity_factor" ] || { echo "--capacity: $got"; exit 1; }
got=$(complete_words dpc-route sample -m mod);   [ "$got" = "model.safetensors" ] || { echo "-m mod: $got"; exit 1; }
' sh "$TESTDIR/../../scripts/dpc-completion.bash" >out.txt 2>&1 || die "completion: $(cat out.txt)"
echo "completion: subcommands, options and files as --help lists them"
