#!/usr/bin/env bash
# Installs the Debian 12 packages Conveyor needs. Idempotent, and quiet when nothing is missing.
#
#   tools/setup.sh           everything: the build, the whole test suite, benchmarks, packaging
#   tools/setup.sh --build   what building the tree needs (./run build, ./run demo): a fresh
#                            machine reaches the demo without the test suite's services (Ceph,
#                            SLURM, podman, PyTorch) in the way
set -euo pipefail

BUILD_PACKAGES=(
  # build
  cmake ninja-build ccache pkg-config g++
  # media and compression (the libraries only: the ffmpeg CLI and tjbench are the tests' references
  # and the benchmarks' baselines, and the CLI alone pulls in 85 more packages, Mesa and LLVM among
  # them, about a third of a fresh machine's install)
  libavcodec-dev libavformat-dev libavutil-dev libswscale-dev libswresample-dev libffmpeg-nvenc-dev
  libturbojpeg0-dev libzstd-dev zstd libxxhash-dev liblz4-dev
  # storage and wire
  libcurl4-openssl-dev libssl-dev curl
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler prometheus-cpp-dev
  # well-kept libraries instead of our own code
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libyaml-cpp-dev libabsl-dev
  # Parquet page codecs (datasets/parquet)
  libsnappy-dev zlib1g-dev
  # robot formats read in place (datasets/hdf5); a text stream's tokenizer (sample/tokenizer.h)
  libhdf5-dev libsentencepiece-dev
  # the trainer's collectives (trainer/, conveyor train); the test and benchmark frameworks the
  # tree configures with
  libgloo-dev libgtest-dev libgmock-dev libbenchmark-dev
)

PACKAGES=(
  "${BUILD_PACKAGES[@]}"
  # the fuzzers (tests/fuzz, libFuzzer)
  clang libclang-rt-14-dev
  # tests and benchmarks: the ffmpeg CLI and tjbench as references and baselines
  ffmpeg libjpeg-turbo-progs
  python3-numpy
  python3-grpcio python3-grpc-tools iperf3 openssl
  # tests/http: a real HTTP server on 127.0.0.1 for the HTTP storage
  nginx-light
  # tests/slurm: a real SLURM cluster on 127.0.0.1 (slurmctld + two slurmd, auth/none)
  slurmctld slurmd slurm-client munge jq
  # tests/s3: a real S3 service on 127.0.0.1 (Ceph's radosgw over one mon and one memstore osd);
  # awscli (/usr/bin/aws) is the transfer baseline of bench/s3_bench.sh
  radosgw ceph-mon ceph-osd awscli
  # tests/prometheus: a real Prometheus scraping real servers; promtool checks deploy/prometheus
  prometheus
  # tests/k8s: deploy/k8s checked offline against the Kubernetes API's typed models (official client)
  python3-kubernetes
  # the Debian package and the container image made from it (tools/package.sh, tools/image.sh;
  # tests/package): dpkg-shlibdeps for CPack, a clean Debian 12 root, the OCI image, and podman to
  # run it (with runc: crun refuses this machine's hybrid cgroups)
  dpkg-dev mmdebstrap umoci podman runc
  # the Python package (python/, pure Python over libconveyor_c; docs/python.md), its tests, and
  # its install tested in a venv with pip and a wheel (no package index needed)
  python3-venv python3-pip python3-setuptools python3-wheel python3-torch python3-av
  # the package's annotations checked with --strict (python_mypy_test)
  python3-mypy
  # plots (conveyor bench --plot, bench/peers)
  python3-matplotlib
  # robot formats read in place (datasets/rlds, datasets/hdf5): the tests' fixtures written by the
  # tools those communities use (tf.train.Example through python3-protobuf, TFRecord framing
  # checked with python3-crc32c, HDF5 episodes through h5py)
  python3-h5py python3-protobuf python3-crc32c
  # the tokenizer's tests: SentencePiece's spm_train makes the models and python3-sentencepiece
  # gives the ids they are checked against
  sentencepiece python3-sentencepiece
  # `conveyor top` under a terminal (tests/top/top_tmux_test.sh)
  tmux
)

if [[ "${1:-}" == --build ]]; then
  PACKAGES=("${BUILD_PACKAGES[@]}")
elif [[ $# -gt 0 ]]; then
  echo "usage: tools/setup.sh [--build]" >&2
  exit 2
else
  # tests/k8s/kubectl_dry_run_test.py: Debian's kubectl, unless a kubectl is there already (another
  # vendor's package also ships /usr/bin/kubectl, and the two cannot both be installed).
  command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)
  # The test fixtures' npm writers (Parquet files, LeRobot datasets, the doctor's and import's
  # fixtures; tests/fixtures/parquet, tests/fixtures/lerobot): Debian's Node.js and npm, unless a
  # Node.js with its own npm is there already (NodeSource's nodejs ships npm and conflicts with
  # Debian's npm package, so asking for it would make apt remove that Node.js).
  command -v npm >/dev/null || PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done" >&2
