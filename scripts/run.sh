#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Set up, build and run zinf's main job: install dependencies (Debian 12), configure, build what
# the main job needs (zinf_gpt and the library it links; the tests, benches and the zinf command
# are the README's test command's to build), and train the example GPT (build/zinf_gpt,
# examples/gpt/) with its default configuration: ZeRO-3 with parameters and optimizer state on
# NVMe, under a scratch directory made here (in the current file system, not /tmp, which may be
# tmpfs) and removed afterwards.
# Extra arguments go to zinf_gpt (scripts/run.sh --steps 500 --config examples/gpt/configs/...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target zinf_gpt
scratch=$(mktemp -d "$PWD/zinf-run-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
build/zinf_gpt --scratch-parent "$scratch" "$@"
