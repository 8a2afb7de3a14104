#!/usr/bin/env bash
# Builds psmd and runs every test. Prints "N passed, N failed" (GoogleTest
# cases, counted from Bazel's test.xml files) and exits non-zero on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1

bazel build //... || { echo "0 passed, 1 failed"; exit 1; }
# mpi4py's own test suite lives beside the repository (../shared/external).
mpi4py_tests=$(cd .. && pwd)/shared/external/mpi4py-3.1.4-test/test
bazel test //... --test_output=errors --test_env=PSMD_MPI4PY_TESTS="$mpi4py_tests"
status=$?
# Formatting is a check of its own (the tree follows .clang-format).
if scripts/format.sh --check; then format_failed=0; else format_failed=1; status=1; fi
# So is the install: prefix install/uninstall and the .deb in a clean root.
if scripts/test_install.sh; then install_failed=0; else install_failed=1; status=1; fi

FORMAT_FAILED=$format_failed INSTALL_FAILED=$install_failed python3 - <<'PY'
import glob, os, xml.etree.ElementTree as ET
failed = int(os.environ["FORMAT_FAILED"]) + int(os.environ["INSTALL_FAILED"])
passed = 2 - failed
for path in glob.glob("bazel-testlogs/**/test.xml", recursive=True):
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        failed += 1
        continue
    cases = root.iter("testcase")
    n = 0
    for case in cases:
        n += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        else:
            passed += 1
    if n == 0:  # a test binary that is not GoogleTest: one result per target
        if root.get("failures", "0") != "0" or root.get("errors", "0") != "0":
            failed += 1
        else:
            passed += 1
print(f"{passed} passed, {failed} failed")
PY
exit $status
