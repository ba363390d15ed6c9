#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/gpu/bundle.sh: pack zinf's GPU checks into one relocatable folder that runs on a GPU
# machine which has the NVIDIA driver, cuBLAS and NCCL (a CUDA toolkit, or PyTorch's pip wheels)
# but none of zinf's build dependencies: no compiler, Open MPI, jansson, liburing, libaio, hwloc
# or Criterion. Then, on that machine: bash DEST/run-on-gpu.sh (see that script).
#
#   usage: scripts/gpu/bundle.sh [BUILD [DEST]]
#     BUILD  a configured build with CUDA, NCCL and MPI (default: build, the README's); the
#            targets the checks need are built first
#     DEST   the bundle (default: build-gpu-bundle beside BUILD; ignored by git: name it in the
#            device tool's carry)
#   exit: 0 made; 77 BUILD has no CUDA, NCCL or MPI (nothing to check on a GPU); else an error
#
# What goes in, all derived from the tree as it is, so that the kit follows it:
#  - checks.list: every ctest entry labelled gpu, its command rewritten for the bundle (the
#    build's binaries -> bin/, the source files and folders it names -> share/, the test scratch
#    -> the run's scratch, `mpiexec ... -np 1 PROG` -> PROG: an Open MPI singleton does what
#    one rank under mpiexec does), with its ZINF_* and GPT_MODEL_FLAGS environment (the
#    gpt.llama.* entries' model) as shell-quoted words. An entry of several ranks cannot run on
#    one GPU: refused here.
#  - bin/: those binaries, zinf, zinf_gpt and probe (probe.cu beside this script), stripped,
#    each behind a wrapper that sets the bundle's library path (never exported to the machine's
#    own tools). bin/.own-glibc/ holds the same files with their ELF interpreter set to
#    /tmp/zinf-gpu-ld/ld.so, which run-on-gpu.sh points at glibc/ on a machine whose glibc is
#    older than the bundle needs (patchelf: a real interpreter, since Criterion re-executes
#    /proc/self/exe).
#  - lib/: every shared library they load, except glibc's and what the GPU machine supplies
#    (the driver's libcuda, libcublas, libcublasLt, libnccl: 780 MiB that run-on-gpu.sh finds
#    there); lib/openmpi/: the Open MPI components a singleton can load without fabric libraries.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$SRC/scripts/gpu
BUILD=$(cd "${1:-$SRC/build}" && pwd)
DEST=${2:-$(dirname "$BUILD")/build-gpu-bundle}
say() { echo "bundle.sh: $*" >&2; }

cfg=$BUILD/zinf_config.h
[ -f "$cfg" ] || { say "$BUILD is not a configured zinf build (no zinf_config.h)"; exit 1; }
for f in CUDA NCCL MPI; do
	if ! grep -Eq "define ZINF_HAVE_$f +1" "$cfg"; then
		say "$BUILD has no $f (zinf_config.h): no GPU checks to pack"
		exit 77
	fi
done
command -v patchelf >/dev/null || { say "patchelf is missing (scripts/deps.sh installs it)"; exit 1; }
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

# ---- the checks: ctest's gpu entries, rewritten -------------------------------------------------
# `ctest -N -V` prints, per test: "N: Test command: PROG "ARG"...", "N: Environment variables:",
# " N:  K=V"..., then "  Test  #N: NAME".
declare -A bins=() share=([configs]=$SRC/examples/gpt/configs) # run-on-gpu.sh's own checks
# one word of a command -> its bundle form in $word (and what must be packed, in bins and share)
rewrite() {
	local w=$1
	case $w in
	"$BUILD"/test-scratch*) word="@SCR@${w#"$BUILD"/test-scratch}" ;;
	"$BUILD"/*) # a target's binary, built below (scripts/run.sh builds zinf_gpt alone)
		bins[$(basename "$w")]=$w
		word="@B@/bin/$(basename "$w")"
		;;
	"$SRC"/*)
		[ -e "$w" ] || { say "$w: not in the tree"; return 1; }
		share[$(basename "$w")]=$w
		word="@B@/share/$(basename "$w")"
		;;
	*/bash | */sh) word=bash ;;
	/*) say "$w: an absolute path outside the tree and the build"; return 1 ;;
	*) word=$w ;;
	esac
}
checks=$(mktemp)
trap 'rm -f "$checks"' EXIT
ctest --test-dir "$BUILD" -N -V -L gpu >"$checks.raw"
n=0
while IFS= read -r line; do
	case $line in
	*": Test command: "*)
		read -r -a words <<<"${line#*: Test command: }"
		envs=()
		;;
	[0-9]*":  "*=*) # an environment line
		kv=${line#*:  }
		case $kv in ZINF_TEST_SCRATCH=*) ;; ZINF_* | GPT_MODEL_FLAGS=*) envs+=("$kv") ;; esac
		;;
	"  Test "*"#"[0-9]*": "*) # "  Test  #20: NAME", "  Test #122: NAME"
		name=${line##*: }
		args=() np=1 i=0
		w0=${words[0]//\"/}
		if [[ $(basename "$w0") == mpiexec || $(basename "$w0") == mpirun ]]; then
			# drop the launcher and its options up to the program (the first absolute path
			# after -np N)
			i=1
			while [ $i -lt ${#words[@]} ]; do
				w=${words[$i]//\"/}
				[ "$w" = -np ] && np=${words[$((i + 1))]//\"/}
				[[ $w == /* ]] && break
				i=$((i + 1))
			done
		fi
		if [ "$np" != 1 ]; then
			say "ctest $name runs $np ranks: a one-GPU kit cannot run it"
			exit 1
		fi
		for ((; i < ${#words[@]}; i++)); do
			rewrite "${words[$i]//\"/}" || exit 1
			args+=("$word")
		done
		# the environment as shell words (printf %q: GPT_MODEL_FLAGS holds spaces); -: none
		ev=-
		[ ${#envs[@]} -eq 0 ] || ev=$(printf '%q ' "${envs[@]}")
		printf '%s\t%s\t%s\n' "$name" "${ev% }" "${args[*]}" >>"$checks"
		n=$((n + 1))
		;;
	esac
done <"$checks.raw"
rm -f "$checks.raw"
[ "$n" -gt 0 ] || { say "ctest lists no test labelled gpu in $BUILD"; exit 1; }

# ---- build what the bundle carries ----------------------------------------------------------------
targets=(zinf zinf_gpt)
for b in "${!bins[@]}"; do targets+=("$b"); done
cmake --build "$BUILD" --target "${targets[@]}" -j"$(nproc)" >/dev/null
bins[zinf]=$BUILD/zinf
bins[zinf_gpt]=$BUILD/zinf_gpt
for b in "${!bins[@]}"; do
	[ -f "${bins[$b]}" ] && [ -x "${bins[$b]}" ] ||
		{ say "${bins[$b]}: not an executable of the build (target $b)"; exit 1; }
done
probe=$BUILD/zinf-gpu-probe
if [ ! -x "$probe" ] || [ "$HERE/probe.cu" -nt "$probe" ]; then
	"$NVCC" -O2 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90] \
		-o "$probe" "$HERE/probe.cu"
fi
bins[probe]=$probe

rm -rf "$DEST"
mkdir -p "$DEST"/{bin/.real,bin/.own-glibc,lib/openmpi,glibc,share,ompi/share/openmpi}
for b in "${!bins[@]}"; do
	strip -o "$DEST/bin/.real/$b" "${bins[$b]}"
	cp "$DEST/bin/.real/$b" "$DEST/bin/.own-glibc/$b"
	patchelf --set-interpreter /tmp/zinf-gpu-ld/ld.so "$DEST/bin/.own-glibc/$b"
	cat >"$DEST/bin/$b" <<EOF
#!/bin/sh
# zinf GPU bundle: $b with the bundle's libraries (ZINF_BUNDLE_LIBPATH, ZINF_BUNDLE_DIR set by
# run-on-gpu.sh; .own-glibc when the machine's glibc is older than the bundle's)
d=\$(dirname "\$0")
LD_LIBRARY_PATH=\$ZINF_BUNDLE_LIBPATH\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec "\$d/\${ZINF_BUNDLE_DIR:-.real}/$b" "\$@"
EOF
	chmod +x "$DEST/bin/$b"
done
for s in "${!share[@]}"; do
	cp -r "${share[$s]}" "$DEST/share/$s"
done
mv "$checks" "$DEST/checks.list"
trap - EXIT
cp "$HERE/run-on-gpu.sh" "$DEST/"

# ---- libraries ------------------------------------------------------------------------------------
# Not packed: glibc's own libraries (the machine's, or glibc/ below) and what the GPU machine has.
supplied='^(linux-vdso|ld-linux-x86-64|libc|libm|libmvec|libpthread|libdl|librt|libutil|libresolv|libanl|libcuda|libnvidia-.*|libcublas|libcublasLt|libnccl)\.so'
ompi_comp=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 # Debian 12's Open MPI 4.1
# Open MPI components that need fabric, launcher or PMIx libraries the bundle does not carry.
ompi_skip='libuc[pst]|libfabric|ibverbs|rdmacm|psm|libpmix|libnl-|libmunge|jvm'
for c in "$ompi_comp"/mca_*.so; do
	ldd "$c" | grep -Eq "$ompi_skip" || cp "$c" "$DEST/lib/openmpi/"
done
cp /usr/share/openmpi/help-*.txt "$DEST/ompi/share/openmpi/" 2>/dev/null || true
# the closure of what the binaries and components load
ldd "$DEST"/bin/.real/* "$DEST"/lib/openmpi/*.so 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' |
	sort -u | while read -r soname path; do
	[[ $soname =~ $supplied ]] && continue
	[ -e "$DEST/lib/$soname" ] || cp -L "$path" "$DEST/lib/$soname"
done
for g in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libmvec.so.1 libpthread.so.0 libdl.so.2 librt.so.1 \
	libresolv.so.2 libutil.so.1 libanl.so.1; do
	cp -L "/lib/x86_64-linux-gnu/$g" "$DEST/glibc/"
done
objdump -T "$DEST"/bin/.real/* "$DEST"/lib/*.so* "$DEST"/lib/openmpi/*.so 2>/dev/null |
	grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n -u | tail -1 | sed 's/GLIBC_//' >"$DEST/glibc-needed"

{
	echo "zinf $(git -C "$SRC" describe --always --dirty 2>/dev/null) bundled $(date -u +%FT%TZ) from $BUILD"
	grep -E '^CMAKE_BUILD_TYPE:|^CMAKE_CUDA_ARCHITECTURES:' "$BUILD/CMakeCache.txt" || true
	echo "nvcc: $("$NVCC" --version | tail -2 | head -1)"
	echo "glibc needed: $(cat "$DEST/glibc-needed") (older machines: glibc/ through bin/.own-glibc)"
	echo "from the GPU machine: libcuda.so.1, libcublas.so.13, libcublasLt.so.13, libnccl.so.2"
	echo "checks from ctest (label gpu):"
	cut -f1 "$DEST/checks.list" | sed 's/^/  /'
	echo "files:"
	(cd "$DEST" && find . -type f -printf '  %s %p\n' | sort -k2)
} >"$DEST/MANIFEST"
say "$DEST: $(du -sh "$DEST" | cut -f1), $(find "$DEST" -type f | wc -l) files, $n ctest checks"
