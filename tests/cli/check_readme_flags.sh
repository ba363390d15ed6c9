#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# tests/cli/check_readme_flags.sh ZINF README (ctest cli_readme_flags): every flag of every
# `zinf` command (as its --help lists it, from the table that parses it) appears in that
# command's usage lines in README.md's "The `zinf` command" block, so the README cannot fall
# behind a flag added or renamed.
set -euo pipefail
zinf=$1 readme=$2
# the usage block: the fenced block after "## The `zinf` command"
block=$(awk '/^## The `zinf` command/ {on = 1; next}
	on && /^```$/ {if (++n == 2) exit; next}
	on && n == 1' "$readme")
[ -n "$block" ] || { echo "FAIL: no usage block in $readme"; exit 1; }
fail=0
while read -r cmd; do
	# the command's usage lines: its first line up to the next line starting with "zinf "
	lines=$(echo "$block" | awk -v c="zinf $cmd" '
		index($0, c " ") == 1 || $0 == c {on = 1; print; next}
		/^zinf / {on = 0}
		on {print}')
	if [ -z "$lines" ]; then
		echo "FAIL: README has no usage line for zinf $cmd"
		fail=1
		continue
	fi
	flags=$("$zinf" $cmd --help | grep -oE '^  (-h, )?--[a-z0-9-]+' | grep -oE -- '--[a-z0-9-]+' || true)
	for f in $flags; do
		[ "$f" = --help ] && continue
		if ! grep -qE -- "$f([^a-z0-9-]|\$)" <<<"$lines"; then
			echo "FAIL: zinf $cmd $f is not in README's usage lines"
			fail=1
		fi
	done
done < <("$zinf" --help | sed -n 's/^  \([a-z]\+\( [a-z]\+\)\?\)  .*/\1/p' | sed 's/ *$//')
[ $fail = 0 ] && echo "ok: every flag of every command is in README's usage lines"
exit $fail
