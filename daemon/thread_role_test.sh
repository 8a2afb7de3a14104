#!/usr/bin/env bash
# The negative control of the progress worker's thread role
# (base/thread_role.h, daemon/progress.h): the thread-safety build
# (--config=thread-safety) must reject code off the worker's thread that
# touches what only that thread may. Compiles daemon/progress.cc as it is
# with Clang's analysis (it must pass: the headers are all here), then once
# per case with one line of such code put into a method that control threads
# call, and checks that each fails with the diagnostic that names it.
# The Bazel test //daemon:thread_role_test.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/psmd-thread-role-XXXXXX")
trap 'rm -rf "$work"' EXIT
compile() {
  clang++-14 -std=c++17 -fsyntax-only -I. -Iinclude \
    -DSPDLOG_SHARED_LIB -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL \
    -Wthread-safety -Werror=thread-safety "$1"
}
if ! compile daemon/progress.cc >"$work/clean.log" 2>&1; then
  cat "$work/clean.log"
  echo "thread_role_test: daemon/progress.cc does not compile as it is"
  exit 1
fi
# Each case: the method whose first line gets the code | the code | what
# the compiler must say.
cases=(
  "SetPeer|engine_.PollAll();|reading variable 'engine_' requires holding thread role 'role_'"
  "SetPeer|muted_doorbells_ = 0;|writing variable 'muted_doorbells_' requires holding thread role 'role_' exclusively"
  "SetPeer|NoteTurn(0);|calling function 'NoteTurn' requires holding thread role 'role_' exclusively"
  "SetPeer|remote_->Poll();|reading the value pointed to by 'remote_' requires holding thread role 'role_'"
  "AddEndpoint|ep->posted.size();|'posted' is a private member of 'psmd::Endpoint'"
)
failed=0
for c in "${cases[@]}"; do
  IFS='|' read -r method code expected <<<"$c"
  src=$work/progress_$method.cc
  # After the opening line of ProgressWorker::<method>'s definition.
  awk -v m="ProgressWorker::$method(" -v code="$code" '
    { print }
    !done && /^[^ ]/ && index($0, m) > 0 && /\{$/ {
      print "  " code; done = 1 }
    END { if (!done) exit 1 }' daemon/progress.cc >"$src" ||
    { echo "FAIL: no ProgressWorker::$method in daemon/progress.cc"; failed=1; continue; }
  if compile "$src" >"$work/log" 2>&1; then
    echo "FAIL: \`$code\` in ProgressWorker::$method compiled"
    failed=1
  elif ! grep -qF "$expected" "$work/log"; then
    cat "$work/log"
    echo "FAIL: \`$code\` in ProgressWorker::$method: no \"$expected\""
    failed=1
  else
    echo "ok: \`$code\` in ProgressWorker::$method: $expected"
  fi
done
[ "$failed" = 0 ] && echo "thread_role_test: ok (${#cases[@]} cases)"
exit "$failed"
