"""Judges NetPIPE's output in its integrity mode (NPopenmpi -i), where each
message size is checked byte by byte instead of timed.

usage: netpipe_check.py LOG...   (one rank's stdout and stderr)

Passes when NetPIPE says it ran the integrity check, reported at least one
size, every size "Integrity check passed", and nothing "failed". NetPIPE
prints a failure and goes on (its exit status does not say), so this is the
only place a corrupted payload shows.
"""
import re
import sys

log = "".join(open(path, errors="replace").read() for path in sys.argv[1:])
sizes = re.findall(r"^ *\d+: +\d+ bytes +\d+ times --> +(.*)$", log, re.M)
passed = sum(1 for s in sizes if s.strip() == "Integrity check passed")
failed = re.findall(r"^.*Integrity check failed.*$", log, re.M)
problems = []
if "Doing an integrity check instead of measuring performance" not in log:
    problems.append("NetPIPE did not run its integrity check (-i)")
if not sizes:
    problems.append("no message size reported")
problems += [f"no verdict: {s}" for s in sizes if s.strip() != "Integrity check passed"]
problems += failed[:10]
print(f"netpipe: {passed} of {len(sizes)} sizes passed the integrity check"
      + "".join(f"\n  {p}" for p in problems))
sys.exit(1 if problems else 0)
