#!/bin/bash
# Compares the ABI of psmd's PSM2 headers with Intel's (see BUILD.bazel).
# Usage: abi_layout_test.sh INTEL_MANIFEST OURS_MANIFEST \
#          PROBE_INTEL_C PROBE_OURS_C PROBE_INTEL_CC PROBE_OURS_CC
set -u

if [[ $# -ne 6 ]]; then
  echo "usage: $0 intel_manifest ours_manifest intel_c ours_c intel_cc ours_cc" >&2
  exit 2
fi
intel_manifest=$1 ours_manifest=$2
out=${TEST_TMPDIR:-$(mktemp -d)}
failed=0

fail() {
  echo "FAIL: $*" >&2
  failed=1
}

# 1. Same names, declared in the same headers.
if ! diff -u --label "intel (manifest)" --label "psmd (manifest)" \
    "$intel_manifest" "$ours_manifest"; then
  fail "our headers do not declare the same names as Intel's (- missing, + extra)"
fi

# 2. Same layouts, values and types, in C and in C++.
compare_probes() {
  local lang=$1 intel_bin=$2 ours_bin=$3
  local intel_out="$out/intel_$lang.txt" ours_out="$out/ours_$lang.txt"
  if ! "$intel_bin" >"$intel_out"; then
    fail "$intel_bin exited with status $?"
    return
  fi
  if ! "$ours_bin" >"$ours_out"; then
    fail "$ours_bin exited with status $?"
    return
  fi
  # Guard against a vacuous comparison (e.g. a scanner that found nothing).
  local nfunc nrec nmacro
  nfunc=$(grep -c '^func ' "$intel_out")
  nrec=$(grep -c '^record ' "$intel_out")
  nmacro=$(grep -c '^macro ' "$intel_out")
  if (( nfunc < 60 || nrec < 10 || nmacro < 40 )); then
    fail "$lang probe checks too little ($nfunc functions, $nrec records, $nmacro macros)"
  fi
  if ! diff -u --label "intel ($lang)" --label "psmd ($lang)" \
      "$intel_out" "$ours_out"; then
    fail "ABI differs from Intel's in $lang (- Intel, + psmd)"
  else
    echo "OK: $lang: $(wc -l <"$intel_out") ABI facts identical" \
         "($nfunc functions, $nrec records, $nmacro macros)"
  fi
}
compare_probes c "$3" "$4"
compare_probes c++ "$5" "$6"

if [[ $failed -eq 0 ]]; then
  echo "OK: manifest: $(wc -l <"$intel_manifest") declarations identical"
  echo "PASS"
fi
exit $failed
