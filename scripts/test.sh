#!/usr/bin/env bash
# Builds psmd and runs every test. Prints "N passed, N failed, N skipped"
# (each target's test cases, as Bazel reports the target and its test.xml
# lists the cases: scripts/test_results.py) and exits non-zero on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1

bazel build //... || { echo "0 passed, 1 failed"; exit 1; }
# mpi4py's own test suite lives beside the repository (../shared/external);
# //tests/mpi:mtl_psmd_mpi4py_suite runs it on one psmd, ..._mpi4py_nodes
# with its ranks on two (..._ofi, ..._ofi_udp: linked by libfabric over
# tcp;ofi_rxm, udp;ofi_rxd), //tests/slurm:cluster_test through srun on
# three nodes. //tests:fabric_netns_test (a veth link set down
# mid-transfer) and //tests/slurm:cluster_test (Open MPI jobs from a real
# Slurm cluster in namespaces, scripts/cluster.sh) need root, as CI runs
# this, and skip themselves otherwise.
mpi4py_tests=$(cd .. && pwd)/shared/external/mpi4py-3.1.4-test/test
# Bazel's own account of the run (each target's status and test.xml) is
# what the count below reads.
events=$(mktemp /tmp/psmd-test-events-XXXXXX.json)
trap 'rm -f "$events"' EXIT
bazel test //... --test_output=errors --test_env=PSMD_MPI4PY_TESTS="$mpi4py_tests" \
  --test_env=PSMD_CLUSTER_MPI4PY_SUITE="$mpi4py_tests" \
  --build_event_json_file="$events"
status=$?
# Checks of their own, each counted once: formatting (.clang-format),
# Clang's thread-safety analysis of the daemon's and the library's lock
# annotations, the
# install into a prefix (install/uninstall), the Debian packages (built
# with debhelper, lintian, their split, installed in a clean root), psmd
# under a real systemd (those packages in a booted container), and the
# daemon's unit, tenant and conformance tests under AddressSanitizer + UBSan
# (docs/reliability.md; last, since its copts build everything again, into
# an output tree of its own). //tests:integration_test is left out of it:
# under ASan it alone takes ~7 min on this 2-core machine. The fuzz targets
# are left out too: each builds its own binary with clang's ASan and UBSan
# already (engine_state_fuzz_test ran 80 s a second time for nothing).
checks=6
checks_failed=0
scripts/format.sh --check || { checks_failed=$((checks_failed + 1)); status=1; }
bazel build --config=thread-safety //daemon/... //client/... ||
  { checks_failed=$((checks_failed + 1)); status=1; }
scripts/test_install.sh || { checks_failed=$((checks_failed + 1)); status=1; }
# test_systemd.sh boots the packages test_deb.sh built under a real systemd.
debs=$(mktemp -d /tmp/psmd-test-debs-XXXXXX)
trap 'rm -f "$events"; rm -rf "$debs"' EXIT
PSMD_DEBS_OUT=$debs scripts/test_deb.sh || { checks_failed=$((checks_failed + 1)); status=1; }
scripts/test_systemd.sh "$debs" || { checks_failed=$((checks_failed + 1)); status=1; }
bazel test --config=asan --jobs=2 -- //shm/... //daemon/... //client/... \
  -//daemon/engine:engine_fuzz_test -//daemon/remote:wire_fuzz_test \
  -//daemon/handover:registry_image_fuzz_test \
  -//daemon/engine:engine_state_fuzz_test -//daemon/remote:remote_state_fuzz_test \
  //tests:tenant_test //tests/conformance:mq_conformance_psmd \
  //tests/conformance:am_conformance_psmd \
  //tests/conformance:core_conformance_psmd \
  //tests/conformance:mq_conformance_psmd_workers2 \
  //tests/conformance:am_fanin_psmd_workers2 ||
  { checks_failed=$((checks_failed + 1)); status=1; }

python3 scripts/test_results.py "$events" --checks "$checks" \
  --checks-failed "$checks_failed" || status=1
exit $status
