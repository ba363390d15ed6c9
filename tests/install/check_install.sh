#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install zinf into a scratch prefix and build the examples against it the two ways a user
# would (CMake find_package and pkg-config), then run them: the installed headers, library,
# CMake package and .pc file must be enough on their own.
# usage: check_install.sh BUILD_DIR SOURCE_DIR [SANITIZERS]
set -euo pipefail
build=$1 src=$2 sanitize=${3:-}
if [ -n "$sanitize" ]; then
	# A sanitized libzinf.so loaded by a plain executable: ASan demands its runtime come first
	# in the library list ("ASan runtime does not come first"), which no user's build does.
	echo "install: SKIPPED: sanitizer build (ZINF_SANITIZE=$sanitize): an unsanitized consumer" \
		"cannot load a sanitized libzinf.so (the ASan runtime must come first)"
	exit 77
fi
work=$(mktemp -d "$build/test-scratch/install-XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/examples" -B "$work/ex" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/ex" >/dev/null
mkdir "$work/data"
LD_LIBRARY_PATH="$work/prefix/lib" "$work/ex/offload_step" "$work/data"
# The GPT trainer, built against the installed package only: a few steps on NVMe (scratch
# directory under $work/data, removed by the trainer).
OMP_NUM_THREADS=1 LD_LIBRARY_PATH="$work/prefix/lib" "$work/ex/zinf_gpt" --steps 3 --layers 1 \
	--hidden 16 --heads 2 --context 8 --vocab 16 --batch 2 --quiet --scratch-parent "$work/data"
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
cc "$src/examples/offload_step.c" $(pkg-config --cflags --libs zinf) \
	-Wl,-rpath,"$work/prefix/lib" -o "$work/offload_step_pc"
"$work/offload_step_pc" "$work/data"
test -z "$(ls -A "$work/data")" || { echo "files left behind in $work/data"; exit 1; }
# Only the public API is exported from the shared library.
if nm -D --defined-only "$work/prefix/lib/libzinf.so" | awk '{print $3}' | grep -v '^zinf_' | grep -v '^ZINF_0$' | grep -q .; then
	echo "libzinf.so exports symbols outside zinf_*:"; nm -D --defined-only "$work/prefix/lib/libzinf.so" | grep -v ' zinf_'
	exit 1
fi
if nm -D --defined-only "$work/prefix/lib/libzinf.so" | grep -q ' zinf_test_'; then
	echo "libzinf.so exports test hooks"; exit 1
fi
echo "install: find_package and pkg-config consumers built and ran"
