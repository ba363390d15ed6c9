#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/engine/check_layers.sh: the engine core's files call one another downwards only, so that
# no circle forms among them (docs/ARCHITECTURE.md, "The engine's core"). Each file has a level below; a
# call from a file to a function another file defines (not static), or through an ops table
# (e->ot->fn: engine_otier.c; e->pt->fn: engine_ptier.c), must go to a lower level. A file the
# table does not list fails the check, so a new file takes a level on purpose. Comments and
# strings are ignored; calls inside a file are its own business.
#
#   usage: check_layers.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: check_layers.sh SOURCE_DIR}
cd "$src/engine"

declare -A level=(
	[engine_call.c]=0 [loss_scale.c]=0
	[engine_ptier.c]=1 [engine_gwin.c]=1 [engine_match.c]=1
	[engine_param.c]=2 [engine_gather.c]=2
	[engine_otier.c]=3 [engine_trace.c]=3
	[engine_spec.c]=4 [engine_clip.c]=4
	[engine_worker.c]=5
	[engine_grad.c]=6 [engine_fetch.c]=6
	[engine_step.c]=7 [engine_init.c]=7
	[engine.c]=8
	[engine_plan.c]=9
)

# a file without its comments and string literals
strip() {
	awk 'BEGIN { c = 0 }
	{
		line = $0; out = ""
		while (length(line) > 0) {
			if (c) {
				i = index(line, "*/"); if (!i) { line = ""; break }
				line = substr(line, i + 2); c = 0; continue
			}
			i = index(line, "/*"); j = index(line, "\"")
			if (i && (!j || i < j)) { out = out substr(line, 1, i - 1); line = substr(line, i + 2); c = 1; continue }
			if (j) {
				out = out substr(line, 1, j); line = substr(line, j + 1)
				while (length(line) > 0) {
					k = match(line, /[\\"]/); if (!k) { line = ""; break }
					if (substr(line, k, 1) == "\\") { line = substr(line, k + 2); continue }
					line = substr(line, k + 1); break
				}
				out = out "\""; continue
			}
			out = out line; line = ""
		}
		print out
	}' "$1"
}

bad=0
declare -A owner=()
for f in *.c; do
	if [ -z "${level[$f]+x}" ]; then
		echo "check_layers: engine/$f has no level in tests/engine/check_layers.sh"
		bad=1
		continue
	fi
	# definitions at the start of a line whose previous line (the type) is not static
	while read -r name; do
		owner[$name]=$f
	done < <(strip "$f" | awk '/^[a-z_][a-z_0-9]*\(/ { if (prev !~ /^static/) { sub(/\(.*/, ""); print } } { prev = $0 }')
done

for f in *.c; do
	[ -n "${level[$f]+x}" ] || continue
	text=$(strip "$f")
	calls=$(grep -oE '\b[a-z_][a-z_0-9]*\(' <<<"$text" | sed 's/($//' | sort -u)
	for c in $calls; do
		o=${owner[$c]:-}
		if [ -n "$o" ] && [ "$o" != "$f" ] && [ "${level[$o]}" -ge "${level[$f]}" ]; then
			echo "check_layers: engine/$f (level ${level[$f]}) calls $c of engine/$o (level ${level[$o]})"
			bad=1
		fi
	done
	for t in ot:engine_otier.c pt:engine_ptier.c; do
		if [ "$f" != "${t#*:}" ] && grep -qE "\->${t%%:*}->[a-z_]+\(" <<<"$text" &&
			[ "${level[${t#*:}]}" -ge "${level[$f]}" ]; then
			echo "check_layers: engine/$f (level ${level[$f]}) calls through e->${t%%:*} (engine/${t#*:}, level ${level[${t#*:}]})"
			bad=1
		fi
	done
done
[ "$bad" = 0 ] && echo "check_layers: ${#level[@]} files of engine/ call downwards only"
exit "$bad"
