"""Runs MPICH's test/mpi programs of some directories over several Open MPI
transports and judges them against an expected-failures list.

usage: mpich_run.py [--ci] [--build-logs DIR]
                    TESTDIR EXPECTED_FAILURES TRANSPORT=MPIRUN_ARGS...

TESTDIR is a configured and built test/mpi tree. Each directory's testlist
names a program, its rank count and options; this runs every distinct
(program, ranks, args) of pt2pt, coll and comm with at most 4 ranks, leaving
out what Open MPI 4.1 cannot run: MPI 4.0 features (mpiversion=4.x), MPICH
tuning variants (env=MPIR_CVAR_*: the same program again) and GPU lists.

A test passes when it exits 0 and prints "No Errors" (MPICH's convention).
Each transport is "name=mpirun arguments", e.g. "psmd=--mca pml cm --mca mtl
psmd". Prints one line per test and transport, then the counts; exits non-zero
when a test fails that EXPECTED_FAILURES does not list for that transport
("transport dir/program ranks [args] ~ REGEX  # cause": the failing run's
output must match REGEX, how it fails; only a test that ends at its time
limit, below, is judged by another line's), or a listed one passes. A
line "too-long-for-ci transport dir/program ranks [args] [~ REGEX]" lists a
test that can only end at its time limit here (it hangs, or needs minutes):
with --ci it is not run (and reported as such). A line "may-time-out
transport dir/program ranks [args] ~ REGEX" lists a test whose run time
straddles its limit on this machine: it must pass or be killed at its limit.
A test listed as failing and too-long-for-ci must be killed at its limit
(ending by itself, even with a matching output, fails the run). Such runs
ended at their limit are judged by the REGEX of their too-long-for-ci or
may-time-out line, matched against what they printed until the kill (the
line must give one), and any other run killed at its limit fails.
may-time-out runs are counted apart from the totals (passed, timed out), so
that these do not depend on the machine's load.

A program of the testlists that did not build fails the run unless a line
"not-built dir/program SYMBOL" lists it and its directory's build log
(DIR/make-<dir>.log, --build-logs) shows SYMBOL as that program's error
(an undefined reference or an undeclared name). A line "totals ci|full
TRANSPORT PASSED RUN" is required and asserted for every transport of the
run (ci with --ci; RUN without the may-time-out runs).
With MPICH_RUN_SHOW_OUTPUT set, the whole output of every failure is printed
(indented with "| "), for writing an entry's signature.
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import time

DIRS = ["pt2pt", "coll", "comm"]
MAX_RANKS = 4
TIMEOUT_S = 30  # unless the testlist gives a timeLimit
# MPICH's own knob (its runtests reads it too): the limits assume a machine
# with a core per rank; CI runs up to 4 ranks and psmd, beside another test,
# on 2 cores (tests/mpi/BUILD.bazel sets 3).
TIMEOUT_MULTIPLIER = float(os.environ.get("MPITEST_TIMEOUT_MULTIPLIER", "1"))


def tests(testdir):
    """The tests to run, and those whose program did not build."""
    seen, missing = [], []
    for d in DIRS:
        for line in open(os.path.join(testdir, d, "testlist")):
            line = line.split("#", 1)[0].strip()
            if not line or "@" in line:
                continue
            words = line.split()
            if len(words) < 2 or not words[1].isdigit():
                continue
            name, ranks, opts = words[0], int(words[1]), words[2:]
            if ranks > MAX_RANKS:
                continue
            if any(o.startswith("mpiversion=4") or o.startswith("env=")
                   for o in opts):
                continue
            args = [o[4:] for o in opts if o.startswith("arg=")]
            limits = [int(o[10:]) for o in opts if o.startswith("timeLimit=")]
            prog = os.path.join(testdir, d, name)
            test = (f"{d}/{name}", ranks, tuple(args),
                    max(limits + [TIMEOUT_S]) * TIMEOUT_MULTIPLIER)
            if test in seen or test in missing:
                continue
            (seen if os.path.exists(prog) else missing).append(test)
    return seen, missing


def label(test):
    name, ranks, args, _ = test
    return f"{name} {ranks}" + (" " + " ".join(args) if args else "")


def kill_session(sid):
    """SIGKILLs every process of session `sid` (mpirun puts its ranks in
    process groups of their own, but they stay in mpirun's session)."""
    for pid in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            # Fields after the command name: state ppid pgrp session ...
            if int(stat.rsplit(")", 1)[1].split()[3]) == sid:
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass


def session_state(sid):
    """What each process of session `sid` is doing: pid, state, the kernel
    function it waits in, its CPU time (ticks) and command line."""
    lines = []
    for pid in sorted(os.listdir("/proc"), key=lambda p: (len(p), p)):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            rest = stat.rsplit(")", 1)[1].split()
            if int(rest[3]) != sid:
                continue
            wchan = open(f"/proc/{pid}/wchan").read().strip() or "-"
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
            lines.append(f"pid {pid} {rest[0]} wchan {wchan} "
                         f"cpu {int(rest[11]) + int(rest[12])} {cmd[:120]}")
        except (OSError, ValueError, IndexError):
            pass
    return "\n".join(lines)


def diagnose(sid):
    """Before a hung test is killed: its processes' state and, where
    MPICH_RUN_DIAG names a command (mpich_suite.sh: psmctl's view of the
    endpoints), that command's output; so a hang seen once in CI says
    where it waited."""
    text = session_state(sid)
    cmd = os.environ.get("MPICH_RUN_DIAG")
    if cmd:
        try:
            r = subprocess.run(cmd, shell=True, capture_output=True, timeout=20)
            text += "\n" + (r.stdout + r.stderr).decode(errors="replace")
        except subprocess.TimeoutExpired:
            text += f"\n{cmd}: no answer within 20 s"
    return text


def run(testdir, test, mpirun_args):
    """Runs one test: (passed, timed out, why, output, seconds, what a hung
    one was doing). A test killed at its time limit keeps the output it
    printed until then."""
    name, ranks, args, timeout = test
    cmd = (["mpirun", "--oversubscribe", "-np", str(ranks)] + mpirun_args +
           [os.path.join(testdir, name)] + list(args))
    start = time.time()
    shm_before = set(os.listdir("/dev/shm"))
    # Its own session: a hung test is ended with its ranks.
    p = subprocess.Popen(cmd, cwd=os.path.join(testdir, name.split("/")[0]),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        out = p.communicate(timeout=timeout)[0].decode(errors="replace")
        ok = p.returncode == 0 and "No Errors" in out
        why = "" if ok else f"exit {p.returncode}: " + " | ".join(
            out.strip().splitlines()[-3:])[:300]
        return ok, False, why, out, time.time() - start, ""
    except subprocess.TimeoutExpired:
        state = diagnose(p.pid)
        kill_session(p.pid)
        # What it printed before the kill (communicate keeps what it read).
        out = p.communicate()[0].decode(errors="replace")
        # Killed ranks leave vader's shared-memory segments behind.
        for leftover in set(os.listdir("/dev/shm")) - shm_before:
            path = os.path.join("/dev/shm", leftover)
            try:
                if (leftover.startswith("vader_segment.") and
                        os.stat(path).st_uid == os.getuid()):
                    os.unlink(path)
            except OSError:
                pass
        return (False, True, f"timed out after {timeout:.0f} s", out,
                time.time() - start, state)


def judge(key, ok, timed_out, out, expected, slow, long, signatures):
    """What is wrong with a run's result against the list ("" when
    nothing), and the note to print."""
    listed = key in expected
    # A test that ends only at its time limit here: listed as failing and
    # too-long-for-ci (it hangs), or may-time-out. Its signature (on that
    # line) is matched against what it printed until the kill.
    at_limit = key in slow or (listed and key in long)
    limit_sig = (signatures.get(f"may-time-out {key}") or
                 signatures.get(f"too-long-for-ci {key}"))
    if at_limit and not limit_sig:
        return ("listed as ending at its time limit, but the line gives no "
                "signature of its output until then", "")
    if ok:
        return ("expected failure PASSED", "") if listed else ("", "")
    if timed_out:
        if not at_limit:
            return "timed out (not listed as ending at its time limit)", ""
        if not limit_sig.search(out):
            return ("killed at its time limit as listed, but its output until "
                    f"then is not /{limit_sig.pattern}/"), ""
        return "", ("(listed: may time out; its output until the limit matches)"
                    if key in slow else
                    "(expected: killed at its time limit, its output until "
                    "then matches)")
    if key in slow:
        return "listed as may-time-out, but it failed otherwise", ""
    if at_limit:
        return ("listed as ending only at its time limit, but it ended by "
                "itself"), ""
    if not listed:
        return "not listed", ""
    if key not in signatures:
        return "listed, but the entry gives no signature (how it fails)", ""
    if not signatures[key].search(out):
        return f"listed, but it fails otherwise: not /{signatures[key].pattern}/", ""
    return "", "(expected)"


def not_built_cause(build_logs, test, symbol):
    """Whether the directory's build log shows `symbol` as the program's
    error."""
    d, name = test[0].split("/")
    try:
        log = open(os.path.join(build_logs, f"make-{d}.log"), errors="replace").read()
    except OSError:
        return False
    return re.search(rf"\b{re.escape(name)}\.c:\d+(?::\d+)?: (?:undefined reference "
                     rf"to |error: ).?{re.escape(symbol)}\b", log) is not None


def main():
    argv = sys.argv[1:]
    ci = build_logs = None
    while argv and argv[0].startswith("--"):
        if argv[0] == "--ci":
            ci, argv = True, argv[1:]
        elif argv[0] == "--build-logs":
            build_logs, argv = argv[1], argv[2:]
        else:
            sys.exit(f"unknown option {argv[0]}")
    testdir, expected_path = argv[:2]
    transports = [t.split("=", 1) for t in argv[2:]]
    expected, slow, long = set(), set(), set()
    not_built, totals, signatures = {}, {}, {}
    for line in open(expected_path):
        line, _, signature = line.split("#", 1)[0].partition(" ~ ")
        line = re.sub(r"\s+", " ", line.strip())
        if signature.strip():
            signatures[line] = re.compile(signature.strip(), re.M)
        if line.startswith("not-built "):
            _, prog, symbol = line.split(" ")
            not_built[prog] = symbol
        elif line.startswith("totals "):
            _, mode, transport, passed, run_ = line.split(" ")
            totals[(mode, transport)] = (int(passed), int(run_))
        elif line.startswith("may-time-out "):
            slow.add(line[len("may-time-out "):])
        elif line.startswith("too-long-for-ci "):
            long.add(line[len("too-long-for-ci "):])
        elif line:
            expected.add(line)
    todo, missing = tests(testdir)
    bad = skipped = 0
    for test in missing:
        symbol = not_built.get(test[0])
        if symbol and build_logs and not_built_cause(build_logs, test, symbol):
            print(f"not built: {label(test)} (listed: Open MPI 4.1 lacks {symbol})")
        else:
            bad += 1
            print(f"not built: {label(test)} FAIL ("
                  + (f"the build log does not show {symbol} as its error)"
                     if symbol else "not listed as not-built)"))
    counts = {}
    for test in todo:
        for transport, args in transports:
            key = f"{transport} {label(test)}"
            if ci and key in long:
                print(f"{transport:6} {label(test):50} not run (too long for "
                      "CI: see the expected-failures list)", flush=True)
                skipped += 1
                continue
            ok, timed_out, why, out, secs, state = run(testdir, test,
                                                       shlex.split(args))
            problem, note = judge(key, ok, timed_out, out, expected, slow, long,
                                  signatures)
            bad += bool(problem)
            verdict = ("pass" if ok else "FAIL") + (
                f" ({problem})" if problem else f" {note}" if note else "")
            # may-time-out runs are counted apart (passed, timed out): the
            # totals do not depend on how loaded the machine is.
            c = counts.setdefault(transport, [0, 0, 0, 0])
            if key in slow:
                c[2 if ok else 3] += 1
            else:
                c[0] += ok
                c[1] += 1
            print(f"{transport:6} {label(test):50} {verdict} {secs:.1f}s "
                  f"{why}", flush=True)
            # A hang nobody listed: where it waited, and what it printed.
            if problem and timed_out:
                print("    | " + (state + "\n" + out).rstrip().replace(
                    "\n", "\n    | "), flush=True)
            # The whole output of a failure, for writing its signature.
            if not ok and os.environ.get("MPICH_RUN_SHOW_OUTPUT"):
                print("    | " + out.rstrip().replace("\n", "\n    | "),
                      flush=True)
    mode = "ci" if ci else "full"
    for transport, _ in transports:
        p, n, slow_passed, slow_timed_out = counts.get(transport, [0, 0, 0, 0])
        claim = totals.get((mode, transport))
        print(f"mpich suite over {transport}: {p} passed, {n - p} failed "
              f"of {n}" + (f" (the list says {claim[0]} of {claim[1]})"
                           if claim else "") +
              (f"; apart, {slow_passed + slow_timed_out} that may time out: "
               f"{slow_passed} passed, {slow_timed_out} timed out"
               if slow_passed + slow_timed_out else ""))
        if not claim:
            bad += 1
            print(f"mpich suite over {transport}: FAIL: the list states no "
                  f"{mode} totals")
        elif claim != (p, n):
            bad += 1
            print(f"mpich suite over {transport}: FAIL: not the list's totals")
    if skipped:
        print(f"mpich suite: {skipped} runs too long for CI not run")
    print(f"mpich suite: {bad} results differ from the expected-failures list")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
