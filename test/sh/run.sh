#!/bin/sh
# Runs every test/sh/t-*.sh with BIN (programs) and a fresh scratch directory each.
# A test passes when it exits 0; it prints its own reason when it does not. Exit 77 = skipped.
set -u
: "${BIN:?BIN must name the directory of the built programs}"
here=$(cd "$(dirname "$0")" && pwd)
pass=0 fail=0 skip=0 failed=""
for t in "$here"/t-*.sh; do
	[ -e "$t" ] || continue
	name=$(basename "$t" .sh)
	scratch=$(mktemp -d "${TMPDIR:-/tmp}/dpc-test.XXXXXX")
	log="$scratch.log"
	if (cd "$scratch" && BIN="$BIN" TESTDIR="$here" SCRATCH="$scratch" sh "$t") >"$log" 2>&1; then
		pass=$((pass + 1)); echo "ok      $name"
	else
		rc=$?
		if [ $rc -eq 77 ]; then
			skip=$((skip + 1)); echo "SKIPPED $name: $(tail -n 1 "$log")"
		else
			fail=$((fail + 1)); failed="$failed $name"; echo "FAIL    $name (exit $rc)"; sed 's/^/    | /' "$log" | tail -n 40
		fi
	fi
	rm -rf "$scratch" "$log"
done
echo "shell: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
