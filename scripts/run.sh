#!/usr/bin/env bash
# Set up, build and run zinf's main job: install dependencies (Debian 12), configure, build,
# and run `zinf bench io` on a default scratch directory. Extra arguments go to `zinf bench io`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
exec build/zinf bench io "$@"
