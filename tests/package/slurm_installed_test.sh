#!/usr/bin/env bash
# ctest slurm_installed_test: deploy/slurm works from the installed package as from the build
# tree. tests/slurm/slurm_cluster_test.sh (a real two-node SLURM cluster on 127.0.0.1, the job's
# scenarios: train, kill -9 of a server, scancel and resubmission, resize, checkpoints) run with
# what the Debian package installs instead of the build tree: `cmake --install --strip` of
# tools/package.sh's tree (the files of the .deb) into a temporary /usr, its bin/conveyor as the
# CLI and its share/conveyor/deploy/slurm/conveyor_job.sbatch as the job script.
#
#   tests/package/slurm_installed_test.sh SOURCE_DIR PACKAGE_BUILD_DIR
set -euo pipefail
SRC="$(realpath "$1")"; PB="$(realpath -m "$2")"
source "$SRC/tests/package/common.sh"
[[ -f "$PB/cmake_install.cmake" && -x "$PB/tools/conveyor" ]] ||
  skip "no package build tree at $PB: tools/package.sh makes it (./run test does)"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
cmake --install "$PB" --prefix "$TMP/usr" --strip > /dev/null
[[ -f "$TMP/usr/share/conveyor/deploy/slurm/conveyor_job.sbatch" ]] || fail "the package has no deploy/slurm"
echo "CLI: $TMP/usr/bin/conveyor ($("$TMP/usr/bin/conveyor" --version | head -1)); job script: the installed one"
CONVEYOR_CLI="$TMP/usr/bin/conveyor" CONVEYOR_SOURCE_DIR="$TMP/usr/share/conveyor" \
  bash "$SRC/tests/slurm/slurm_cluster_test.sh"
