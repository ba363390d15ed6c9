#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# bench/fio_compare.sh: zinf's I/O engine against fio on the same file size, block size and
# queue depth: fio --ioengine=io_uring --direct=1 and fio --ioengine=libaio --direct=1, and
# `zinf bench io --json` with its two buffer patterns (one large registered buffer; small
# buffers cycled). Every round runs every contender once (write, then read of what it wrote),
# the order rotating from round to round, so that drift of the virtual disk hits all alike.
# Prints the medians, zinf / max(fio engines) for read and write, and a markdown table.
#
# usage: bench/fio_compare.sh [--dir DIR] [--size 512M] [--bs 1M] [--qd 32] [--rounds 5]
#                             [--zinf PATH] [--patterns "large small"] [--threads 1]
#                             [--md FILE]
set -euo pipefail

dir=./zinf-fio-compare
size=512M
bs=1M
qd=32
rounds=5
threads=1
zinf=
patterns="large small"
md=

while [ $# -gt 0 ]; do
	case "$1" in
	--dir) dir=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--bs) bs=$2; shift 2 ;;
	--qd) qd=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--threads) threads=$2; shift 2 ;;
	--zinf) zinf=$2; shift 2 ;;
	--patterns) patterns=$2; shift 2 ;;
	--md) md=$2; shift 2 ;;
	-h|--help) sed -n '3,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "fio_compare.sh: unknown option $1" >&2; exit 2 ;;
	esac
done

here=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "$zinf" ]; then
	for c in "$here/build/zinf" "$here"/build*/zinf; do
		if [ -x "$c" ]; then zinf=$c; break; fi
	done
fi
[ -x "$zinf" ] || { echo "fio_compare.sh: no zinf binary (build it, or --zinf PATH)" >&2; exit 1; }
command -v fio >/dev/null || { echo "fio_compare.sh: fio is not installed" >&2; exit 1; }
command -v jq >/dev/null || { echo "fio_compare.sh: jq is not installed" >&2; exit 1; }

made_dir=0
if [ ! -d "$dir" ]; then mkdir -p "$dir"; made_dir=1; fi
work=$(mktemp -d)
cleanup() {
	rm -f "$dir"/fio-cmp.dat
	[ "$made_dir" = 1 ] && rmdir "$dir" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

contenders="fio-io_uring fio-libaio"
for p in $patterns; do contenders="$contenders zinf-$p"; done
set -- $contenders
n=$#

# One contender, once: appends "write_GBps read_GBps" to $work/<name>.
run_one() {
	local name=$1 w r out
	case "$name" in
	fio-*)
		local eng=${name#fio-}
		local common=(--filename="$dir/fio-cmp.dat" --size="$size" --bs="$bs"
			--iodepth="$qd" --ioengine="$eng" --direct=1 --numjobs="$threads"
			--group_reporting --output-format=json)
		rm -f "$dir/fio-cmp.dat"
		out=$(fio --name=w --rw=write "${common[@]}")
		w=$(jq '.jobs[0].write.bw_bytes / 1e9' <<<"$out")
		out=$(fio --name=r --rw=read "${common[@]}")
		r=$(jq '.jobs[0].read.bw_bytes / 1e9' <<<"$out")
		rm -f "$dir/fio-cmp.dat"
		;;
	zinf-*)
		out=$("$zinf" bench io --path "$dir" --size "$size" --block-size "$bs" \
			--queue-depth "$qd" --threads "$threads" --buffer-pattern "${name#zinf-}" \
			--json)
		w=$(jq '.write_GBps' <<<"$out")
		r=$(jq '.read_GBps' <<<"$out")
		;;
	esac
	echo "$w $r" >>"$work/$name"
	printf '  %-14s write %6.3f GB/s  read %6.3f GB/s\n' "$name" "$w" "$r"
}

echo "fio_compare: size $size, block $bs, queue depth $qd, threads $threads, $rounds rounds," \
	"dir $dir ($(df -P "$dir" | awk 'NR==2 {print $1}')); load: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((k = 0; k < rounds; k++)); do
	echo "round $((k + 1))/$rounds"
	for ((i = 0; i < n; i++)); do
		idx=$(((i + k) % n + 1))
		run_one "${!idx}"
	done
done

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

declare -A mw mr
for c in $contenders; do
	mw[$c]=$(awk '{print $1}' "$work/$c" | median)
	mr[$c]=$(awk '{print $2}' "$work/$c" | median)
done
fw=$(awk -v a="${mw[fio-io_uring]}" -v b="${mw[fio-libaio]}" 'BEGIN {print (a > b) ? a : b}')
fr=$(awk -v a="${mr[fio-io_uring]}" -v b="${mr[fio-libaio]}" 'BEGIN {print (a > b) ? a : b}')

table=$(
	echo "| contender | write GB/s (median) | read GB/s (median) | write / best fio | read / best fio | rounds (write/read) |"
	echo "|---|---:|---:|---:|---:|---|"
	for c in $contenders; do
		all=$(awk '{printf "%s%.2f/%.2f", (NR > 1 ? " " : ""), $1, $2}' "$work/$c")
		awk -v c="$c" -v w="${mw[$c]}" -v r="${mr[$c]}" -v fw="$fw" -v fr="$fr" -v all="$all" \
			'BEGIN {printf "| %s | %.3f | %.3f | %.2f | %.2f | %s |\n", c, w, r, w / fw, r / fr, all}'
	done
)
echo
echo "$table"
echo
for p in $patterns; do
	awk -v p="$p" -v w="${mw[zinf-$p]}" -v r="${mr[zinf-$p]}" -v fw="$fw" -v fr="$fr" \
		'BEGIN {printf "zinf (%s buffers) / max(fio engines): write %.2f, read %.2f\n", p, w / fw, r / fr}'
done
if [ -n "$md" ]; then
	echo "$table" >"$md"
fi
