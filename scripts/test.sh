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
# Checks of their own, each counted once: formatting (.clang-format),
# Clang's thread-safety analysis of the library's lock annotations, and the
# install (prefix install/uninstall and the .deb in a clean root).
checks=3
checks_failed=0
scripts/format.sh --check || { checks_failed=$((checks_failed + 1)); status=1; }
bazel build --config=thread-safety //client:libpsm2.so.2 ||
  { checks_failed=$((checks_failed + 1)); status=1; }
scripts/test_install.sh || { checks_failed=$((checks_failed + 1)); status=1; }

CHECKS=$checks CHECKS_FAILED=$checks_failed python3 - <<'PY'
import glob, os, xml.etree.ElementTree as ET
failed = int(os.environ["CHECKS_FAILED"])
passed = int(os.environ["CHECKS"]) - failed
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
