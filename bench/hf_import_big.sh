#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/hf_import_big.sh: a Hugging Face checkpoint larger than the memory zinf_gpt may use,
# imported into the NVMe tiers (--from-hf) and trained for one step under a memory cgroup.
#
# usage: bench/hf_import_big.sh BUILD_DIR WORK_DIR [LAYERS] [LIMIT_GIB]
#   (as root: it makes the memory cgroup zinf-import, v1 or v2). Writes WORK_DIR/llama-big with
#   bench/hf_big_checkpoint.py (numpy and safetensors from PyPI; default 48 layers: 2.15e9
#   parameters, 8.6 GB of f32) unless it is there, then runs zinf_gpt --from-hf on it with
#   examples/gpt/configs/llama_nvme.json (the optimizer pool's buffer_count cut to 2) in a cgroup
#   of LIMIT_GIB (default 3), scratch under WORK_DIR (about 18 bytes a parameter on NVMe), and
#   prints the peak resident memory (/usr/bin/time -v) and the cgroup's peak (page cache
#   included, which the kernel reclaims at the limit).
set -euo pipefail
build=$1 work=$2 layers=${3:-48} limit=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
mkdir -p "$work"
[ -f "$work/llama-big/config.json" ] ||
	"$py" "$here/hf_big_checkpoint.py" "$work/llama-big" --layers "$layers"
du -sh "$work/llama-big"
sed 's/"buffer_count": 4/"buffer_count": 2/' "$here/../examples/gpt/configs/llama_nvme.json" \
	>"$work/demo.json"
bytes=$((limit * 1024 * 1024 * 1024))
if [ -d /sys/fs/cgroup/memory ]; then # v1
	cg=/sys/fs/cgroup/memory/zinf-import
	mkdir -p "$cg"
	echo "$bytes" >"$cg/memory.limit_in_bytes"
	echo 0 >"$cg/memory.max_usage_in_bytes"
	peak="$cg/memory.max_usage_in_bytes"
else # v2
	cg=/sys/fs/cgroup/zinf-import
	mkdir -p "$cg"
	echo "$bytes" >"$cg/memory.max"
	peak="$cg/memory.peak"
fi
sync
echo 1 >/proc/sys/vm/drop_caches
(
	echo $BASHPID >"$cg/cgroup.procs"
	exec /usr/bin/time -v "$build/zinf_gpt" --from-hf "$work/llama-big" --config "$work/demo.json" \
		--context 16 --batch 1 --steps 1 --device host --no-progress --scratch-parent "$work" \
		--lr 1e-5
) >"$work/run.log" 2>&1 || { tail -20 "$work/run.log"; exit 1; }
grep -E '^(model|step|summary|nvme)' "$work/run.log"
grep -E 'Maximum resident|Elapsed' "$work/run.log"
echo "cgroup limit $limit GiB, peak $(($(cat "$peak") / 1048576)) MiB (page cache included)"
