#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# tests/engine/expect_survivors.sh N COMMAND...: runs COMMAND (an mpirun --enable-recovery of
# case killed_rank, whose last of N ranks kills itself) and passes only when every other rank,
# 0 to N - 2, printed that its step failed ("killed_rank: rank R: step 2 returned -...") and no
# rank printed a failed check ("rank R: function:line: ..."). mpirun's own exit status says a
# rank was killed, so it is not the verdict; a rank that crashed or hung prints no line.
set -u
n=$1
shift
out=$("$@" 2>&1)
printf '%s\n' "$out"
fail=0
for ((r = 0; r < n - 1; r++)); do
	if ! printf '%s\n' "$out" | grep -q "^killed_rank: rank $r: step 2 returned -"; then
		echo "expect_survivors: rank $r did not report its failed step" >&2
		fail=1
	fi
done
if printf '%s\n' "$out" | grep -Eq '^rank [0-9]+: [a-z_]+:[0-9]+: '; then
	echo "expect_survivors: a check failed" >&2
	fail=1
fi
exit $fail
