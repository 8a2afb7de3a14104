#!/usr/bin/env bash
# Installs everything psmd needs to build and test, from Debian 12 packages
# only (the build itself downloads nothing). Idempotent; needs root.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap g++ python3
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev
  libsystemd-dev libtomlplusplus-dev libcli11-dev
  systemd  # systemd-analyze verify/security checks deploy/psmd.service
  libgtest-dev libgmock-dev libbenchmark-dev clang-format clang-14
  libpsm2-dev libpsm2-2 uuid-dev
  liburing-dev munge libmunge-dev  # hw/socket: io_uring, MUNGE auth
  libfabric-dev  # hw/ofi: the libfabric backend
  clang libclang-rt-14-dev  # hw/frame_fuzz: libFuzzer
  openmpi-bin libopenmpi-dev libfabric-bin netpipe-openmpi python3-mpi4py
  openssh-client  # Open MPI's launcher looks for ssh even for local ranks
  python3-prometheus-client  # tests parse psmctl's Prometheus output with it
  prometheus  # promtool: tests check psmctl's Prometheus output with it
  iproute2  # tests/fabric_netns_test: network namespaces and a veth pair
  # scripts/cluster.sh, //tests/slurm:cluster_test: a real Slurm cluster in
  # namespaces; srun --mpi=pmix (Slurm's mpi_pmix plugin) wires up Open MPI's
  # ranks through PMIx (Open MPI's pmix ext3x component, on libpmix2)
  slurmctld slurmd slurm-client libpmix2
  libslurm-dev  # slurm/spank.h: deploy/slurm, psmd's SPANK plugin
  scdoc dpkg-dev debootstrap  # man pages, the .deb and its clean-root test
  systemd-container  # scripts/test_systemd.sh: psmd under a booted systemd
  debhelper lintian pkg-config file  # debian/ (build_deb.sh) and test_deb.sh
  gnuplot-nox  # scripts/bench.sh's plots
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
