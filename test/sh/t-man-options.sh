# Every program has a man page, and the long options of its --help and of its page agree.
set -eu
. "$TESTDIR/lib.sh"
man=$TESTDIR/../../man
n=0
for p in "$BIN"/*; do
	name=$(basename "$p")
	page=$man/$name.1
	[ -f "$page" ] || die "$name has no man page man/$name.1"
	"$p" --help >help.txt || die "$name --help exited non-zero"
	# programs with subcommands list them under "commands:"; each has its own --help
	for sub in $(sed -n '/^commands:/,/^$/p' help.txt | awk 'NR > 1 && NF { print $1 }'); do
		"$p" "$sub" --help >>help.txt || die "$name $sub --help exited non-zero"
	done
	grep -oE -- '--[a-z][a-z0-9-]*' help.txt | sort -u >help.opts
	# EXAMPLES may show other commands' options (scripts around the program): not counted
	sed '/^\.SH EXAMPLES/,/^\.SH /{/^\.SH EXAMPLES/d;/^\.SH /!d}' "$page" |
		sed 's/\\-/-/g; s/\\f[BIRP]//g' | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u >page.opts
	missing=$(comm -23 help.opts page.opts | tr '\n' ' ')
	extra=$(comm -13 help.opts page.opts | tr '\n' ' ')
	[ -z "$missing" ] || die "$name: in --help but not in man/$name.1: $missing"
	[ -z "$extra" ] || die "$name: in man/$name.1 but not in --help: $extra"
	n=$((n + 1))
done
[ $n -gt 0 ] || die "no programs in $BIN"
echo "$n programs: --help and man pages agree"
