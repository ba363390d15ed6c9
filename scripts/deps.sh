#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install zinf's build and test dependencies from Debian's packages (Debian 12). Does nothing
# when they are all present. Needs root or sudo for apt-get. libopenblas-openmp-dev: the example
# trainer's CPU matrix products (OpenBLAS's OpenMP build, examples/gpt/README.md says why).
set -euo pipefail
pkgs=(build-essential cmake pkg-config liburing-dev libaio-dev libhwloc-dev libjansson-dev
	libopenmpi-dev openmpi-bin libcriterion-dev fio valgrind patchelf libopenblas-openmp-dev)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
