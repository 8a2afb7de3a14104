"""Judges a run of mpi4py's runtests.py -v under mpirun from each rank's own
log, against tests/mpi/mpi4py_expected_failures.txt.

usage:
  mpi4py_suite_check.py rank CMD [ARGS...]
      runs CMD (one rank's runtests.py) and prints its exit status last on
      stderr ("mpi4py-rank: exit status N"), then exits 0: mpirun keeps only
      one status, the judge needs each rank's, and a rank that crashes (does
      not reach MPI_Finalize) still makes mpirun's own status non-zero.
  mpi4py_suite_check.py judge [--crash TEST_ID] LIBRARY EXPECTED STATUS RANKS
                        RANK_DIR [MPIRUN_LOG]
      STATUS is mpirun's exit status, RANK_DIR the directory given to Open
      MPI 4.1's --output-filename (RANK_DIR/1/rank.N/{stdout,stderr}),
      MPIRUN_LOG what mpirun itself printed. LIBRARY names the stack the
      list's entries are for (dropin, intel, mtl-psmd, slurm).
      Fails on: a non-zero mpirun status; a sanitizer report in any of the
      files; a rank without its exit status, without "Ran N tests", with 0
      tests, or whose status is not 0 with "OK" or 1 with "FAILED (...)";
      unittest's counts (failures=, errors=) differing from the FAIL:/ERROR:
      blocks found; an unexpected success; a failure not listed for LIBRARY
      as "fails", or listed but whose traceback does not match the entry's
      signature; a listed test that ran and passed on a rank, or that did
      not run although other tests of its module did (stale entries).
      With --crash TEST_ID the run was that one test alone, listed for
      LIBRARY as "crashes": passes only when a rank died in it (mpirun
      status non-zero, no "Ran") printing what the signature says.
  mpi4py_suite_check.py crashes LIBRARY EXPECTED
      prints the ids LIBRARY's entries list as "crashes", one a line.
"""
import os
import re
import signal
import subprocess
import sys

LIBRARIES = {"dropin", "intel", "mtl-psmd", "slurm"}
OUTCOMES = {"fails", "crashes"}
# What AddressSanitizer, LeakSanitizer, UBSan (and the others) print.
SANITIZER = re.compile(r"^.*(?:(?:Address|Leak|Thread|Memory|UndefinedBehavior)"
                       r"Sanitizer|: runtime error: ).*$", re.M)
STATUS = re.compile(r"^mpi4py-rank: exit status (\d+)$", re.M)
# unittest's block for one failure: its header, through the next separator.
HEADER = re.compile(r"^(FAIL|ERROR): \w+ \(([\w.]+)\)", re.M)
SEPARATOR = re.compile(r"^(?:={70}|Ran \d+ tests? in )", re.M)
# A test started (-v prints "name (module.Class.name) ... result").
STARTED = re.compile(r"^\w+ \(([\w.]+)\)", re.M)


def read_list(path):
    """{(library, test id): (outcome, signature regex)}. Entries are
    "LIBRARIES TEST_ID OUTCOME SIGNATURE"; each group of entries (lines
    between blank lines) must open with the comment that states its cause."""
    entries, cause = {}, False
    for n, line in enumerate(open(path), 1):
        line = line.rstrip("\n")
        if not line.strip():
            cause = False
            continue
        if line.startswith("#"):
            cause = True
            continue
        where = f"{path}:{n}"
        fields = line.split(None, 3)
        if len(fields) != 4 or fields[2] not in OUTCOMES:
            sys.exit(f"{where}: want 'LIBRARIES TEST_ID fails|crashes SIGNATURE'")
        if not cause:
            sys.exit(f"{where}: an entry without its cause (a comment above it)")
        libs, test, outcome, signature = fields
        for lib in libs.split(","):
            if lib not in LIBRARIES:
                sys.exit(f"{where}: unknown library {lib} (one of {sorted(LIBRARIES)})")
            entries[(lib, test)] = (outcome, re.compile(signature))
    return entries


def read(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return None


def blocks(text):
    """[(test id, FAIL or ERROR, block text)] of unittest's reports."""
    out = []
    for m in HEADER.finditer(text):
        end = SEPARATOR.search(text, m.end())
        out.append((m.group(2), m.group(1),
                    text[m.start():end.start() if end else len(text)]))
    return out


def summary_counts(text, after):
    """unittest's counts from the line after "Ran N tests": None if absent."""
    m = re.compile(r"^(OK|FAILED)(?: \((.*)\))?$", re.M).search(text, after)
    if not m:
        return None
    counts = {"OK": m.group(1) == "OK"}
    for item in (m.group(2) or "").split(", "):
        if "=" in item:
            key, value = item.split("=")
            counts[key] = int(value)
    return counts


def judge(argv):
    crash = None
    if argv[:1] == ["--crash"]:
        crash, argv = argv[1], argv[2:]
    lib, expected_path, status, ranks, rank_dir = argv[:5]
    status, ranks = int(status), int(ranks)
    mpirun_log = argv[5] if len(argv) > 5 else None
    if lib not in LIBRARIES:
        sys.exit(f"unknown library {lib}")
    expected = read_list(expected_path)
    problems, notes = [], []

    files = {}
    for r in range(ranks):
        for stream in ("stdout", "stderr"):
            path = os.path.join(rank_dir, "1", f"rank.{r}", stream)
            files[path] = read(path)
            if files[path] is None:
                problems.append(f"rank {r}: no {stream} log ({path})")
    if mpirun_log:
        files[mpirun_log] = read(mpirun_log) or ""
    for path, text in files.items():
        for m in SANITIZER.finditer(text or ""):
            problems.append(f"sanitizer report in {path}: {m.group(0).strip()[:200]}")

    started, failed = {}, {}  # test id -> ranks
    for r in range(ranks):
        text = files[os.path.join(rank_dir, "1", f"rank.{r}", "stderr")] or ""
        for test in STARTED.findall(text):
            started.setdefault(test, set()).add(r)
        if crash:
            continue
        exits = STATUS.findall(text)
        ran = list(re.finditer(r"^Ran (\d+) tests? in ", text, re.M))
        if not exits:
            problems.append(f"rank {r}: no exit status (killed before runtests.py ended)")
        if len(ran) != 1:
            problems.append(f"rank {r}: {len(ran)} 'Ran N tests' lines (crash or hang?)")
            continue
        if int(ran[0].group(1)) == 0:
            problems.append(f"rank {r}: ran 0 tests")
        counts = summary_counts(text, ran[0].end())
        if counts is None:
            problems.append(f"rank {r}: no OK/FAILED line after 'Ran'")
            continue
        if exits and int(exits[-1]) != (0 if counts["OK"] else 1):
            problems.append(f"rank {r}: runtests.py exit status {exits[-1]} after "
                            f"{'OK' if counts['OK'] else 'FAILED'}")
        if counts.get("unexpected successes"):
            problems.append(f"rank {r}: {counts['unexpected successes']} unexpected successes")
        found = blocks(text[:ran[0].start()])
        for kind, key in (("FAIL", "failures"), ("ERROR", "errors")):
            n = sum(1 for _, k, _ in found if k == kind)
            if n != counts.get(key, 0):
                problems.append(f"rank {r}: unittest counts {key}={counts.get(key, 0)} "
                                f"but the log has {n} {kind}: reports")
        for test, kind, block in found:
            failed.setdefault(test, set()).add(r)
            outcome, signature = expected.get((lib, test), (None, None))
            if outcome != "fails":
                problems.append(f"rank {r}: UNEXPECTED {kind}: {test}")
            elif not signature.search(block):
                last = [l for l in block.strip().splitlines()
                        if not l.startswith("-" * 70)][-1][:200]
                problems.append(f"rank {r}: {test} fails, but not as listed "
                                f"(/{signature.pattern}/): {last}")

    modules = {t.split(".")[0] for t in started}
    for (entry_lib, test), (outcome, signature) in sorted(expected.items()):
        if entry_lib != lib or (crash and test != crash):
            continue
        if crash:
            problems += check_crash(test, outcome, signature, status, ranks,
                                    rank_dir, files)
            continue
        ran_on = started.get(test, set())
        if outcome == "crashes":
            if ran_on:
                problems.append(f"{test} is listed as crashing on {lib} but ran "
                                "here (run it alone with --crash)")
        elif not ran_on:
            if test.split(".")[0] in modules:
                problems.append(f"listed {test} did not run though its module "
                                "did (renamed or removed?)")
            else:
                notes.append(f"listed {test}: not in this run")
        elif ran_on - failed.get(test, set()):
            problems.append(f"STALE: listed {test} passed on rank(s) "
                            f"{sorted(ran_on - failed.get(test, set()))}")
    if crash and (lib, crash) not in expected:
        problems.append(f"{crash} is not listed for {lib}")
    if status != 0 and not crash:
        problems.append(f"mpirun exit status {status}")

    n_failed = sum(len(v) for v in failed.values())
    print(f"mpi4py suite on {lib}: {ranks} ranks, mpirun status {status}, "
          f"{len(started)} tests started, {n_failed} failures (rank x test)"
          + (f"; crash run of {crash}" if crash else ""))
    for line in notes + problems:
        print("  " + line)
    print("mpi4py suite: " + ("PASS" if not problems else f"FAIL ({len(problems)} problems)"))
    return 1 if problems else 0


def check_crash(test, outcome, signature, status, ranks, rank_dir, files):
    if outcome != "crashes":
        return [f"{test} is listed as '{outcome}' on this library, not 'crashes'"]
    problems = []
    if status == 0:
        problems.append(f"mpirun exit status 0: {test} did not crash")
    died = []
    for r in range(ranks):
        text = files[os.path.join(rank_dir, "1", f"rank.{r}", "stderr")] or ""
        at = re.compile(rf"^\w+ \({re.escape(test)}\) \.\.\. ", re.M).search(text)
        if at and not re.search(r"^Ran \d+ tests? in ", text, re.M) and \
                signature.search(text, at.end()):
            died.append(r)
    if not died:
        problems.append(f"no rank died in {test} as listed (/{signature.pattern}/)")
    return problems


def crashes(lib, expected_path):
    for (entry_lib, test), (outcome, _) in sorted(read_list(expected_path).items()):
        if entry_lib == lib and outcome == "crashes":
            print(test)
    return 0


def rank(cmd):
    child = subprocess.Popen(cmd)
    # mpirun ends a job by signalling what it started: pass it on.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda n, _: child.send_signal(n))
    status = child.wait()
    print(f"mpi4py-rank: exit status {status if status >= 0 else 128 - status}",
          file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    sys.exit({"rank": rank, "judge": judge}[mode](args) if mode in ("rank", "judge")
             else crashes(*args))
