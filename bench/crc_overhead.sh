#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# bench/crc_overhead.sh: the cost of per-extent CRC32C on a swap round trip. Runs
# `zinf bench io --json` with and without --crc, alternating, over several rounds, and prints
# the medians, the slowdown, and zinf_crc32c's own bandwidth.
#
# usage: bench/crc_overhead.sh [--dir DIR] [--size 512M] [--rounds 5] [--zinf PATH] [-- ARGS]
#        (ARGS go to every `zinf bench io`, e.g. -- --buffer-pattern small)
set -euo pipefail
dir=./zinf-crc-overhead
size=512M
rounds=5
zinf=
while [ $# -gt 0 ]; do
	case "$1" in
	--dir) dir=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--zinf) zinf=$2; shift 2 ;;
	--) shift; break ;;
	-h|--help) sed -n '3,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "crc_overhead.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "$zinf" ]; then
	for c in "$here/build/zinf" "$here"/build*/zinf; do
		if [ -x "$c" ]; then zinf=$c; break; fi
	done
fi
[ -x "$zinf" ] || { echo "crc_overhead.sh: no zinf binary (--zinf PATH)" >&2; exit 1; }
made_dir=0
if [ ! -d "$dir" ]; then mkdir -p "$dir"; made_dir=1; fi
work=$(mktemp -d)
trap '[ "$made_dir" = 1 ] && rmdir "$dir" 2>/dev/null; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

echo "crc_overhead: size $size, $rounds rounds, extra args: $*; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((k = 0; k < rounds; k++)); do
	for v in off on; do
		[ $((k % 2)) = 1 ] && v=$([ "$v" = off ] && echo on || echo off)
		flag=; [ "$v" = on ] && flag=--crc
		out=$("$zinf" bench io --path "$dir" --size "$size" --json $flag "$@")
		jq -r '"\(.write_GBps) \(.read_GBps) \(.crc32c_GBps // "")"' <<<"$out" >>"$work/$v"
		printf '  crc %-3s %s\n' "$v" "$(tail -1 "$work/$v")"
	done
done
declare -a w=() r=()
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
for v in off on; do
	w[${#w[@]}]=$(awk '{print $1}' "$work/$v" | median)
	r[${#r[@]}]=$(awk '{print $2}' "$work/$v" | median)
done
c=$(awk '{print $3}' "$work/on" | median)
awk -v w0="${w[0]}" -v r0="${r[0]}" -v w1="${w[1]}" -v r1="${r[1]}" -v c="$c" 'BEGIN {
	printf "| CRC | write GB/s (median) | read GB/s (median) |\n|---|---:|---:|\n"
	printf "| off | %.3f | %.3f |\n| on | %.3f | %.3f |\n", w0, r0, w1, r1
	printf "\nwith CRC: write %+.1f%%, read %+.1f%%; zinf_crc32c %.2f GB/s\n",
		100 * (w1 / w0 - 1), 100 * (r1 / r0 - 1), c
}'
