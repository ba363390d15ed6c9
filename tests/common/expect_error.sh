#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# tests/common/expect_error.sh RC PATTERN COMMAND...: runs COMMAND and passes (0) only when it
# exits with status RC and its output (stdout and stderr) matches the extended regular
# expression PATTERN; otherwise prints what it got and fails (1). For the multi-rank programs'
# refusals of a command line they do not know (an unknown case is an error, not a skip): a
# ctest entry of a program expected to fail cannot otherwise tell exit 1 from a skip's 77.
set -u
want=$1
pattern=$2
shift 2
out=$("$@" 2>&1)
got=$?
printf '%s\n' "$out"
if [ "$got" -ne "$want" ]; then
	echo "expect_error: exit status $got, expected $want: $*" >&2
	exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
	echo "expect_error: no line matches /$pattern/: $*" >&2
	exit 1
fi
exit 0
