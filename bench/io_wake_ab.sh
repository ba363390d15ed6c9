#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# bench/io_wake_ab.sh: the engine before and after a change (two zinf binaries), against fio,
# in interleaved rounds. Made for the wake-up of workers asleep in reap (small buffers cycled:
# submit one block, wait for the oldest, resubmit), but any two binaries work. Contenders, in
# an order that rotates from round to round: fio io_uring, fio libaio, zinf OLD small, zinf NEW
# small, zinf NEW large, zinf NEW small on the libaio backend. Each writes then reads the same
# size. Prints every run and the medians.
#
# usage: bench/io_wake_ab.sh --old PATH --new PATH [--dir DIR] [--size 512M] [--bs 1M]
#                            [--qd 32] [--rounds 9]
set -euo pipefail

dir=./zinf-wake-ab
size=512M
bs=1M
qd=32
rounds=9
old=
new=

while [ $# -gt 0 ]; do
	case "$1" in
	--dir) dir=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--bs) bs=$2; shift 2 ;;
	--qd) qd=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--old) old=$2; shift 2 ;;
	--new) new=$2; shift 2 ;;
	-h|--help) sed -n '3,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "io_wake_ab.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
[ -x "$old" ] && [ -x "$new" ] || { echo "io_wake_ab.sh: --old and --new zinf binaries" >&2; exit 1; }
command -v fio >/dev/null && command -v jq >/dev/null || { echo "io_wake_ab.sh: needs fio and jq" >&2; exit 1; }

made_dir=0
if [ ! -d "$dir" ]; then mkdir -p "$dir"; made_dir=1; fi
work=$(mktemp -d)
cleanup() {
	rm -f "$dir"/fio-ab.dat
	[ "$made_dir" = 1 ] && rmdir "$dir" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

set -- fio-io_uring fio-libaio old-small new-small new-large new-small-libaio
n=$#

run_one() {
	local name=$1 w r out bin args
	case "$name" in
	fio-*)
		local common=(--filename="$dir/fio-ab.dat" --size="$size" --bs="$bs" --iodepth="$qd"
			--ioengine="${name#fio-}" --direct=1 --output-format=json)
		rm -f "$dir/fio-ab.dat"
		out=$(fio --name=w --rw=write "${common[@]}")
		w=$(jq '.jobs[0].write.bw_bytes / 1e9' <<<"$out")
		out=$(fio --name=r --rw=read "${common[@]}")
		r=$(jq '.jobs[0].read.bw_bytes / 1e9' <<<"$out")
		rm -f "$dir/fio-ab.dat"
		;;
	*)
		bin=$new
		args=(--buffer-pattern small --backend io_uring)
		case "$name" in
		old-small) bin=$old ;;
		new-large) args=(--buffer-pattern large --backend io_uring) ;;
		new-small-libaio) args=(--buffer-pattern small --backend libaio) ;;
		esac
		out=$("$bin" bench io --path "$dir" --size "$size" --block-size "$bs" \
			--queue-depth "$qd" "${args[@]}" --json)
		w=$(jq '.write_GBps' <<<"$out")
		r=$(jq '.read_GBps' <<<"$out")
		;;
	esac
	echo "$w $r" >>"$work/$name"
	printf '  %-17s write %6.3f GB/s  read %6.3f GB/s\n' "$name" "$w" "$r"
}

echo "io_wake_ab: size $size, block $bs, queue depth $qd, $rounds rounds, dir $dir;" \
	"load: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((k = 0; k < rounds; k++)); do
	echo "round $((k + 1))/$rounds"
	for ((i = 0; i < n; i++)); do
		idx=$(((i + k) % n + 1))
		run_one "${!idx}"
	done
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo
echo "| contender | write GB/s (median) | read GB/s (median) | rounds (write/read) |"
echo "|---|---:|---:|---|"
for c in "$@"; do
	w=$(awk '{print $1}' "$work/$c" | median)
	r=$(awk '{print $2}' "$work/$c" | median)
	all=$(awk '{printf "%s%.2f/%.2f", (NR > 1 ? " " : ""), $1, $2}' "$work/$c")
	printf '| %s | %.3f | %.3f | %s |\n' "$c" "$w" "$r" "$all"
done
