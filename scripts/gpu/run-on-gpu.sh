#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run-on-gpu.sh (copied into the bundle by scripts/gpu/bundle.sh): zinf's GPU checks in one
# command on a machine with an NVIDIA GPU, within a time budget, one log per check in $OUT and a
# summary printed last (and in $OUT/summary.txt). Nothing is installed: the bundle carries
# zinf's binaries and libraries; the machine supplies the driver, cuBLAS and NCCL (a CUDA
# toolkit, ldconfig's paths, or PyTorch's nvidia-* pip wheels: searched in that order).
#
#   usage: bash run-on-gpu.sh [--cpu-only] [--budget SECONDS] [--only 'NAME...'] [--list]
#     --cpu-only  a machine without a GPU (CI): every GPU check must skip (exit 77), every CPU
#                 control must pass; this is how the kit is kept from rotting between GPU runs
#     --budget S  wall-clock seconds for everything (default 480): a check gets what is left
#     --only L    only the checks named in L
#     --list      the checks, then exit
#   env: OUT (default ./zinf-gpu-out), SCRATCH (default: the first of $TMPDIR, /tmp, /var/tmp
#        and the bundle's parent that takes O_DIRECT: the NVMe tiers' swap files go there),
#        ZINF_BUNDLE_GLIBC=own (run on the bundle's glibc even where the machine's would do)
#   exit: 0 every check as expected, 1 otherwise
#
# The checks, in order: probe (the device and the runtime behaviours zinf assumes); three CPU
# controls (the bundle's Criterion, MPI singleton and host GPT work here); every ctest entry labelled gpu
# (checks.list: the bundle's own copy of their commands); the benches (pcie with its >= 0.95
# target and its unpinned mode, comm on nccl, engine on cuda with every tier); zinf_gpt on cuda
# against the host layers, GPT-2 and Llama; a 160M-parameter GPT in GPU memory and on NVMe
# (tokens/s, MFU); compute-sanitizer over the device tests and the GPT's kernels (both).
set -uo pipefail
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-$PWD/zinf-gpu-out}
BUDGET=480 CPU_ONLY=0 ONLY="" LIST=0
while [ $# -gt 0 ]; do
	case $1 in
	--cpu-only) CPU_ONLY=1 ;;
	--budget) BUDGET=$2 && shift ;;
	--only) ONLY=" $2 " && shift ;;
	--list) LIST=1 ;;
	*) echo "run-on-gpu.sh: unknown argument $1 (see the head of this file)" >&2 && exit 2 ;;
	esac
	shift
done
T0=$(date +%s)
[ "$LIST" = 1 ] && OUT=$(mktemp -d) && trap 'rm -rf "$OUT"' EXIT
mkdir -p "$OUT"
: >"$OUT/summary.txt"
: >"$OUT/run.log"
log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/run.log"; }
chmod +x "$B"/bin/* "$B"/bin/.real/* "$B"/bin/.own-glibc/* "$B"/glibc/ld-linux-x86-64.so.2 2>/dev/null

# ---- scratch: a file system that takes O_DIRECT (not tmpfs) -------------------------------------
SCR=${SCRATCH:-} SCR_OURS=0
if [ -z "$SCR" ]; then
	SCR_OURS=1
	for d in "${TMPDIR:-/tmp}" /tmp /var/tmp "$B/.."; do
		mkdir -p "$d/zinf-gpu-scratch" 2>/dev/null || continue
		if dd if=/dev/zero of="$d/zinf-gpu-scratch/.probe" bs=4096 count=1 oflag=direct 2>/dev/null; then
			SCR=$(cd "$d/zinf-gpu-scratch" && pwd)
			break
		fi
	done
	[ -n "$SCR" ] || { log "no directory takes O_DIRECT: set SCRATCH"; exit 1; }
	rm -f "$SCR/.probe"
fi
mkdir -p "$SCR"

# ---- what the machine supplies: libcublas, libcublasLt, libnccl ------------------------------
libdir_of() {
	local n=$1 f d
	f=$(ldconfig -p 2>/dev/null | awk -v n="$n" '$1 == n { print $NF; exit }')
	[ -n "$f" ] && [ -e "$f" ] && { dirname "$f"; return; }
	for d in ${CUDA_HOME:-} /usr/local/cuda /usr/local/cuda-1* /opt/cuda; do
		for f in "$d"/lib64/"$n" "$d"/lib/"$n" "$d"/targets/x86_64-linux/lib/"$n"; do
			[ -e "$f" ] && { dirname "$f"; return; }
		done
	done
	for d in $(python3 -c 'import site; print(*site.getsitepackages())' 2>/dev/null) /opt/*/.venv/lib/python3*/site-packages; do
		f=$(find "$d/nvidia" "$d/torch/lib" -maxdepth 4 -name "$n" 2>/dev/null | head -1)
		[ -n "$f" ] && { dirname "$f"; return; }
	done
	return 1
}
LIBPATH=$B/lib
for n in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
	if d=$(libdir_of $n); then
		log "$n: $d"
		[[ ":$LIBPATH:" == *":$d:"* ]] || LIBPATH=$LIBPATH:$d
	else
		log "$n: not found on this machine (zinf_gpt needs cuBLAS; every binary needs NCCL)"
	fi
done
# The bundle's glibc only where the machine's is older than what its libraries need
# (ZINF_BUNDLE_GLIBC=own forces it: how CI tries that path on a machine whose glibc is recent).
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
need=$(cat "$B/glibc-needed")
export ZINF_BUNDLE_DIR=.real
if [ "${ZINF_BUNDLE_GLIBC:-}" = own ] ||
	[ "$(printf '%s\n%s\n' "$need" "${have:-0}" | sort -V | head -1)" != "$need" ]; then
	mkdir -p /tmp/zinf-gpu-ld && ln -sfn "$B/glibc/ld-linux-x86-64.so.2" /tmp/zinf-gpu-ld/ld.so
	export ZINF_BUNDLE_DIR=.own-glibc
	LIBPATH=$B/glibc:$LIBPATH
fi
export ZINF_BUNDLE_LIBPATH=$LIBPATH
log "glibc: machine ${have:-?}, bundle needs $need: running bin/$ZINF_BUNDLE_DIR"

# ---- Open MPI as a singleton (no mpirun, no orted) from the bundle ------------------------------
export OPAL_PREFIX=$B/ompi OMPI_MCA_mca_base_component_path=$B/lib/openmpi
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mca_base_component_disable_dlclose=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMI_RANK PMIX_RANK
export ZINF_TEST_SCRATCH=$SCR

{
	date -u
	uname -a
	head -2 /etc/os-release 2>/dev/null
	grep -m1 'model name' /proc/cpuinfo
	nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version,compute_mode --format=csv 2>&1
	strings "$(echo "$LIBPATH" | tr : '\n' | while read -r d; do [ -e "$d/libnccl.so.2" ] && echo "$d/libnccl.so.2"; done | head -1)" 2>/dev/null | grep -m1 'NCCL version'
	for f in "$B"/bin/$ZINF_BUNDLE_DIR/*; do
		echo "== $f"
		LD_LIBRARY_PATH=$LIBPATH ldd "$f" 2>&1 | grep -E 'not found|cublas|nccl|cudart'
	done
	head -8 "$B/MANIFEST"
} >"$OUT/env.txt" 2>&1
if grep -q '=> not found' "$OUT/env.txt"; then
	log "libraries not found (details in env.txt):"
	grep '=> not found' "$OUT/env.txt" | sort -u | tee -a "$OUT/run.log"
fi

# ---- one check ------------------------------------------------------------------------------------
# check NAME KIND LIMIT CMD...: KIND gpu (skips without a GPU: with --cpu-only it must), cpu
# (must pass everywhere) or tool (a GPU check that may skip for want of a tool on the machine).
# Exit 0 PASS, 77 SKIP, 124/137 TIMEOUT, else FAIL.
declare -a NAMES=()
verdict() { # the line of a log that says most
	{ grep -E 'Synthesis|passed, [0-9]+ failed|worst relative|^OK|^FAIL|probe:|median|SKIP|no GPU' "$1" || tail -1 "$1"; } |
		tail -1 | cut -c1-110
}
check() {
	local name=$1 kind=$2 limit=$3
	shift 3
	NAMES+=("$name")
	[ "$LIST" = 1 ] && { printf '%-28s %s\n' "$name" "$kind"; return; }
	[ -n "$ONLY" ] && [[ $ONLY != *" $name "* ]] && return
	local left=$((BUDGET - ($(date +%s) - T0) - 5)) t=$(date +%s) rc st
	[ "$left" -lt "$limit" ] && limit=$left
	if [ "$limit" -lt 5 ]; then
		printf '%-28s %-9s %5s  %s\n' "$name" "NOT RUN" "" "the budget is spent" | tee -a "$OUT/summary.txt"
		return
	fi
	{
		echo "## $name ($kind, limit ${limit}s): $*"
		# a child bash: CMD may be one of the functions exported below
		timeout -k 10 "$limit" bash -c 'set -o pipefail; "$@"' check "$@"
	} >"$OUT/$name.log" 2>&1
	rc=$?
	case $rc in 0) st=PASS ;; 77) st=SKIP ;; 124 | 137) st=TIMEOUT ;; *) st=FAIL ;; esac
	if [ "$kind" != cpu ] && [ "$CPU_ONLY" = 1 ]; then
		[ "$st" = SKIP ] && st=ok:SKIP || st=BAD:$st # a GPU check must skip without one
	elif [ "$st" = SKIP ] && [ "$kind" = tool ]; then
		st=ok:SKIP
	elif [ "$st" = SKIP ]; then
		st=BAD:SKIP # a GPU check that found no GPU on the GPU machine, or a control that skipped
	fi
	printf '%-28s %-9s %4ss  rc=%-3d %s\n' "$name" "$st" "$(($(date +%s) - t))" "$rc" \
		"$(verdict "$OUT/$name.log")" | tee -a "$OUT/summary.txt"
}
export B OUT SCR

# ---- what some checks run -------------------------------------------------------------------
# pcie: zinf_device_copy against cudaMemcpyAsync of the same pinned buffers: >= 0.95 each way
pcie() {
	"$B/bin/zinf" bench pcie --size 256M --iters 5 | tee "$OUT/pcie.txt" || return $?
	grep -q 'no GPU' "$OUT/pcie.txt" && return 77
	awk '$1 == "pinned" && ($2 == "h2d" || $2 == "d2h") { n++; if ($5 < 0.95) { bad = 1; print "FAIL: " $0 } }
	     END { if (n != 2) { print "FAIL: no pinned rows (pinned: false?)"; exit 1 }
	           if (!bad) print "OK: pinned h2d and d2h at >= 0.95 of cudaMemcpyAsync"; exit bad }' "$OUT/pcie.txt"
}
# pcie where pinning is refused (no CAP_IPC_LOCK, RLIMIT_MEMLOCK 64 KiB): says pinned: false
pcie_unpinned() {
	command -v setpriv >/dev/null || { echo "SKIP: no setpriv to drop CAP_IPC_LOCK"; return 77; }
	setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock bash -c \
		'ulimit -l 64 && "$B/bin/zinf" bench pcie --size 16M --iters 2' | tee "$OUT/pcie_unpinned.txt" || return $?
	grep -q 'no GPU' "$OUT/pcie_unpinned.txt" && return 77
	grep -q 'pinned: false' "$OUT/pcie_unpinned.txt" && grep -q '^pool-unpinned' "$OUT/pcie_unpinned.txt" &&
		! grep -q '^pinned ' "$OUT/pcie_unpinned.txt" && echo "OK: unpinned and said so" && return 0
	echo "FAIL: pinning refused, yet the output does not say pinned: false"
	return 1
}
# zinf_gpt, 4 blocks of hidden 256 (rows past the 128-thread kernels), 5 steps: cuda against
# the host layers within check_gpt.sh's stated tolerance (1e-5 x step relative).
# gpt_mid DEVICE [TAG [FLAGS...]]: one run, records in $OUT/TAG.DEVICE.jsonl (TAG default
# gpt_mid), FLAGS after the model's (the Llama: --arch llama ...); gpt_mid_compare [TAG [FLAGS...]]
gpt_mid() {
	local dev=$1 tag=${2:-gpt_mid}
	shift $(($# < 2 ? $# : 2))
	"$B/bin/zinf_gpt" --layers 4 --heads 4 --hidden 256 --context 64 --vocab 512 --batch 8 \
		--steps 5 --config "$B/share/configs/zero0_memory.json" --device "$dev" --no-progress \
		--scratch-parent "$SCR" --json "$OUT/$tag.$dev.jsonl" "$@"
}
gpt_mid_compare() {
	local tag=${1:-gpt_mid}
	shift $(($# < 1 ? $# : 1))
	gpt_mid cuda "$tag" "$@" || return $?
	gpt_mid host "$tag" "$@" || return 1
	paste <(sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$OUT/$tag.cuda.jsonl") \
		<(sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$OUT/$tag.host.jsonl") | awk -v tag="$tag" '
		{ d = $1 - $2; d = d < 0 ? -d : d; r = d / ($2 < 0 ? -$2 : $2); w = r > w ? r : w
		  if (r > 1e-5 * NR) { bad = 1; printf "FAIL: step %d: cuda %s host %s\n", NR, $1, $2 } }
		END { printf "%s cuda vs host: worst relative difference %.3g over %d steps\n", tag, w, NR
		      exit bad || NR != 5 }'
}
# A larger GPT: 12 blocks, hidden 1024, context 512, vocabulary 8192 (160M parameters), batch 8,
# on the cuda layers: CONFIG all in GPU memory (zero0_memory) or ZeRO-3 with parameters and
# optimizer on NVMe (zero3_nvme with room for a layer's 12 tensors gathered at once and the next
# one's prefetch: 40 buffers of 1e7). tokens/s: median of steps 2..; model FLOPs per token
# 6 N + 12 L C T (PaLM's accounting) against the dense bf16 peak of an H100/H200 SXM (989e12) and
# its fp32 peak (67e12): the GPT's GPU layers are fp32.
gpt_large() {
	local tag=$1 steps=$2 cfg=$B/share/configs/zero0_memory.json
	if [ "$tag" = nvme ]; then
		cfg=$SCR/zero3_nvme_large.json
		sed -e 's/"buffer_count": 8/"buffer_count": 40/' -e 's/"buffer_size": 1e8/"buffer_size": 1e7/' \
			"$B/share/configs/zero3_nvme.json" >"$cfg"
	fi
	"$B/bin/zinf_gpt" --layers 12 --heads 16 --hidden 1024 --context 512 --vocab 8192 --batch 8 \
		--steps "$steps" --config "$cfg" --device cuda --no-progress --scratch-parent "$SCR" \
		--nvme-path "$SCR" --json "$OUT/gpt_large.$tag.jsonl" || return $?
	sed -n '2,$s/.*"tokens_per_s": \([0-9.e+]*\).*/\1/p' "$OUT/gpt_large.$tag.jsonl" | sort -g | awk -v tag="$tag" '
		{ v[NR] = $1 }
		END { if (NR < 1) exit 1; m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		      L = 12; C = 1024; T = 512; V = 8192
		      N = L * (12 * C * C + 13 * C) + V * C + T * C + 2 * C; f = 6 * N + 12 * L * C * T
		      printf "gpt_large %s: %d parameters, median %.0f tokens/s, %.3g TFLOP/s: MFU %.4f of the bf16 peak, %.3f of the fp32 peak\n",
		             tag, N, m, m * f / 1e12, m * f / 989e12, m * f / 67e12 }'
}
# gpu_only CMD...: CMD's status, except that a failure for want of a CUDA device (the probe found
# none, and CMD's output says so) is a skip (77): without a GPU the command still runs as far as
# it can (the bundle's libraries load, its arguments parse) and must fail for that reason alone
gpu_only() {
	local rc=0
	"$@" >"$OUT/.gpu_only.out" 2>&1 || rc=$?
	cat "$OUT/.gpu_only.out"
	[ "$rc" = 0 ] && return 0
	if grep -q '^probe .*SKIP' "$OUT/summary.txt" &&
		grep -Eq 'no CUDA device|No such device|no GPU' "$OUT/.gpu_only.out"; then
		echo "SKIP: no GPU (exit $rc for that reason)"
		return 77
	fi
	return "$rc"
}
export -f pcie pcie_unpinned gpt_mid gpt_mid_compare gpt_large gpu_only

# ---- the checks -------------------------------------------------------------------------------
Z=$B/bin
[ "$LIST" = 0 ] && log "checks: budget ${BUDGET}s, logs in $OUT, scratch $SCR"
check probe gpu 30 "$Z/probe"
if [ "$LIST" = 0 ] && [ "$CPU_ONLY" = 0 ] && grep -q '^probe .*BAD:SKIP' "$OUT/summary.txt"; then
	log "no CUDA device: nothing else can run here"
	{ nvidia-smi 2>&1 | head -15; ls -l /dev/nvidia* 2>&1 | head -5; } | tee -a "$OUT/run.log"
	exit 1
fi
# CPU controls: the bundle's libraries, Criterion (its worker processes) and the MPI singleton
check control.device_host cpu 60 env ZINF_TEST_VARIANT=host "$Z/test_device" --jobs=2
check control.comm_mpi cpu 60 "$Z/test_comm_ranks" mpi
check control.gpt_host cpu 60 bash -c 'gpt_mid host'

# every ctest entry labelled gpu, as bundle.sh rewrote it (NAME \t K=V... or - \t ARGV...; the
# K=V words shell-quoted, printf %q: a value may hold spaces)
while IFS=$'\t' read -r name envs argv; do
	[ "$envs" = - ] && envs=""
	env_words=()
	eval "env_words=($envs)"
	read -r -a words <<<"$argv"
	for i in "${!words[@]}"; do
		words[$i]=${words[$i]//@B@/$B}
		words[$i]=${words[$i]//@SCR@/$SCR}
	done
	check "$name" gpu 300 env "${env_words[@]}" "${words[@]}"
done <"$B/checks.list"


check bench_pcie gpu 90 bash -c pcie
check bench_pcie_unpinned gpu 60 bash -c pcie_unpinned
check bench_comm_nccl gpu 60 gpu_only "$Z/zinf" bench comm --backend nccl --size 64M --iters 10 --warmup 2
check bench_engine_cuda gpu 60 gpu_only "$Z/zinf" bench engine --device cuda --layers 2 --hidden 512 --steps 3
check bench_engine_cuda_cpu gpu 60 gpu_only "$Z/zinf" bench engine --device cuda --layers 2 --hidden 512 \
	--steps 3 --offload-optimizer cpu --offload-param cpu
check bench_engine_cuda_nvme gpu 150 gpu_only "$Z/zinf" bench engine --device cuda --layers 4 --hidden 1024 \
	--steps 3 --offload-optimizer nvme --offload-param nvme --nvme-path "$SCR"
check gpt_mid.cuda_vs_host gpu 120 gpu_only bash -c gpt_mid_compare
# the same size as a Llama: 4 query heads over 2 key-value heads of 64, an MLP of 688, its own head
check gpt_mid_llama.cuda_vs_host gpu 120 gpu_only bash -c 'gpt_mid_compare gpt_mid_llama \
	--arch llama --kv-heads 2 --ffn 688 --untied'
check gpt_large.memory gpu 90 gpu_only bash -c 'gpt_large memory 6'
check gpt_large.nvme gpu 150 gpu_only bash -c 'gpt_large nvme 4'
# compute-sanitizer, where the machine has it (a GPU check that may skip for want of the tool)
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
sanitize() {
	[ -n "$CS" ] || { echo "SKIP: no compute-sanitizer on this machine"; return 77; }
	gpu_only "$CS" "$@"
}
export -f sanitize
export CS
check sanitizer.device_cuda tool 150 env ZINF_TEST_VARIANT=cuda bash -c 'sanitize --tool memcheck \
	--target-processes all --error-exitcode 99 "$B/bin/test_device" --jobs=1'
# --report-api-errors no: libnccl probes its kernels with cudaFuncGetAttributes at init and
# gets cudaErrorNoKernelImageForDevice for other architectures' images (4 per run on an H200);
# zinf checks the status of every runtime call itself
check sanitizer.gpt_cuda tool 120 bash -c 'sanitize --tool memcheck --report-api-errors no \
	--error-exitcode 99 "$B/bin/zinf_gpt" --device cuda --layers 2 --heads 4 --hidden 256 \
	--context 64 --vocab 512 --batch 4 --steps 2 --no-progress --scratch-parent "$SCR" \
	--config "$B/share/configs/zero0_memory.json"'
# the same over Llama's kernels (RMSNorm, rotary, SwiGLU, 4 query heads over 2 key-value heads)
check sanitizer.gpt_llama_cuda tool 120 bash -c 'sanitize --tool memcheck --report-api-errors no \
	--error-exitcode 99 "$B/bin/zinf_gpt" --device cuda --layers 2 --heads 4 --hidden 256 \
	--context 64 --vocab 512 --batch 4 --steps 2 --no-progress --scratch-parent "$SCR" \
	--config "$B/share/configs/zero0_memory.json" --arch llama --kv-heads 2 --ffn 688 --untied'
[ "$LIST" = 1 ] && exit 0
if [ "$SCR_OURS" = 1 ]; then
	rm -rf "$SCR"
else
	rm -f "$SCR"/zero3_nvme_large.json
fi

# the end of each failed check's log, then the summary last (a tool may keep only the tail)
grep -E ' (FAIL|TIMEOUT|BAD:)' "$OUT/summary.txt" | awk '{ print $1 }' | while read -r n; do
	echo "--- $n: the last 15 lines of $OUT/$n.log"
	tail -15 "$OUT/$n.log" | cut -c1-240
done
echo
echo "=== zinf GPU checks$([ "$CPU_ONLY" = 1 ] && echo ' (--cpu-only)'): $(($(date +%s) - T0)) s, logs in $OUT ==="
grep -E '^\[[0-9]+s\] (lib|glibc|no )' "$OUT/run.log"
cat "$OUT/summary.txt"
! grep -qE ' (FAIL|TIMEOUT|BAD:|NOT RUN)' "$OUT/summary.txt"
