#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# bench/io_patterns.sh: the I/O engine's buffer patterns (bench/io_patterns.c: one large buffer
# or small cycled ones, registered or not, in 4 KiB pages, THP pages or zinf_io_buf_alloc())
# interleaved round by round with fio --direct=1 (io_uring and libaio) on the same size, block
# size and queue depth. Prints the median GB/s (10^9 B/s) of every contender.
#
# usage: bench/io_patterns.sh [--dir DIR] [--size-mib 256] [--bs-kib 1024] [--qd 32]
#                             [--threads 1] [--rounds 5] [--build BUILD_DIR]
set -euo pipefail

dir=./zinf-io-patterns
size=256
bs=1024
qd=32
threads=1
rounds=5
build=build

while [ $# -gt 0 ]; do
	case "$1" in
	--dir) dir=$2; shift 2 ;;
	--size-mib) size=$2; shift 2 ;;
	--bs-kib) bs=$2; shift 2 ;;
	--qd) qd=$2; shift 2 ;;
	--threads) threads=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--build) build=$2; shift 2 ;;
	-h|--help) sed -n '3,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "io_patterns.sh: unknown option $1" >&2; exit 2 ;;
	esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
bin=$build/io_patterns
if [ ! -x "$bin" ] || [ "$root/bench/io_patterns.c" -nt "$bin" ] || [ "$build/libzinf.a" -nt "$bin" ]; then
	cmake --build "$build" --target zinf_static >/dev/null
	cc -O2 -D_GNU_SOURCE -I "$root/include" "$root/bench/io_patterns.c" "$build/libzinf.a" \
		-o "$bin" $(pkg-config --libs liburing jansson) $(pkg-config --libs hwloc 2>/dev/null) \
		-laio -fopenmp -lpthread -lm
fi
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$dir"/fio.dat "$dir"/io_patterns.*' EXIT INT TERM

fio_run() { # engine rw -> GB/s
	fio --name=z --filename="$dir/fio.dat" --size="${size}M" --bs="${bs}k" --iodepth="$qd" \
		--numjobs=1 --ioengine="$1" --direct=1 --rw="$2" --output-format=terse 2>/dev/null |
		awk -F';' -v rw="$2" '{ kb = (rw == "read") ? $7 : $48; printf "%.3f\n", kb * 1024 / 1e9 }'
}

for r in $(seq 1 "$rounds"); do
	for eng in io_uring libaio; do
		echo "fio-$eng - $(fio_run $eng read) $(fio_run $eng write)" >>"$tmp/all"
	done
	"$bin" "$dir" "$size" "$bs" "$qd" "$threads" 1 io_uring | awk 'NR > 2' >>"$tmp/all"
done

echo "size ${size} MiB, bs ${bs} KiB, qd ${qd}, threads ${threads}, ${rounds} rounds, load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-10s %-7s %10s %10s\n" contender memory "read GB/s" "write GB/s"
awk '{ k = $1 " " $2; print k }' "$tmp/all" | awk '!seen[$0]++' | while read -r name mem; do
	rd=$(awk -v n="$name" -v m="$mem" '$1 == n && $2 == m { print $3 }' "$tmp/all" | sort -g |
		awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
	wr=$(awk -v n="$name" -v m="$mem" '$1 == n && $2 == m { print $4 }' "$tmp/all" | sort -g |
		awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
	printf "%-10s %-7s %10s %10s\n" "$name" "$mem" "$rd" "$wr"
done
