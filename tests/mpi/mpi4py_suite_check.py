"""Judges a run of mpi4py's runtests.py (its output, both ranks interleaved).

usage: mpi4py_suite_check.py LOG EXPECTED_FAILURES RANKS

Passes when every rank finished ("Ran N tests") and every failing or erroring
test is listed in EXPECTED_FAILURES (one test id per line, '#' comments),
each of which names its cause there. Prints a summary either way.
"""
import re
import sys

log_path, expected_path, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = open(log_path, errors="replace").read()
expected = set()
for line in open(expected_path):
    line = line.split("#", 1)[0].strip()
    if line:
        expected.add(line)

# Anywhere in a line: the two ranks write to one file, and one's line may
# begin in the middle of the other's (CI saw a rank's "Ran 226 tests" after
# the other's unterminated line, and called that rank unfinished).
finished = re.findall(r"Ran (\d+) tests? in", log)
failing = set(re.findall(r"(?:FAIL|ERROR): \w+ \(([\w.]+)\)", log))
unexpected = sorted(failing - expected)
passing_now = sorted(expected - failing)

print(f"mpi4py suite: {len(finished)} of {ranks} ranks finished "
      f"({', '.join(finished) or 'no'} tests each); {len(failing)} failing, "
      f"{len(failing & expected)} of them expected")
for t in unexpected:
    print(f"  UNEXPECTED failure: {t}")
for t in passing_now:
    print(f"  expected to fail but did not fail (or did not run): {t}")
if len(finished) != ranks:
    print("  a rank did not finish (crash or hang): see the log above")
sys.exit(0 if len(finished) == ranks and not unexpected else 1)
