#!/usr/bin/env python3
"""Counts a `bazel test` run's results, target by target, from what Bazel
itself reports (its build event protocol, --build_event_json_file) and from
each target's test.xml.

usage: test_results.py BEP_JSON [--checks N --checks-failed M]
prints: "N passed, N failed, N skipped" (the checks counted as one case each),
        and one line per target whose result is not a clean pass, saying why.
exits:  0 if nothing failed, else 1.

A target's cases are the <testcase> elements of its test.xml (GoogleTest's,
or the one Bazel writes for a test that writes none). Counted as failed:
  - each case with <failure> or <error>;
  - a target with no test.xml, or one that does not parse;
  - a target whose test.xml has no case (a filter that matched nothing, a
    binary that never reached its tests);
  - a target that Bazel did not report as PASSED (a timeout, a crash after
    an all-pass XML was written, a failed build), on top of its cases: one
    failure, unless its XML already shows one.
A target marked `flaky` in its BUILD file that Bazel reports FLAKY (an
attempt failed, the one it ran again passed) counts by its last attempt,
and its line below names the attempts that failed and their cases: the
retry is what the BUILD file says it has (tests/mpi/BUILD.bazel, the
udp;ofi_rxd targets), never silent.
Counted as skipped: GoogleTest's GTEST_SKIP() (<skipped>, result="skipped")
and disabled cases (status="notrun"). Nothing is counted as passed that a
target did not report as run and passed.
"""
import json
import sys
import urllib.parse
import xml.etree.ElementTree as ET


def xml_cases(path):
    """(passed, failed, skipped, why, names) of one test.xml; why explains
    a target-level failure of the file itself, names are the failed cases'."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return 0, 1, 0, f"test.xml unreadable ({e.__class__.__name__})", []
    passed = failed = skipped = 0
    names = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            names.append(case.get("name", "?"))
        elif (case.find("skipped") is not None or case.get("result") == "skipped"
              or case.get("status") == "notrun"):
            skipped += 1
        else:
            passed += 1
    if passed + failed + skipped == 0:
        return 0, 1, 0, "test.xml has no test case", []
    return passed, failed, skipped, None, names


def file_path(uri):
    parsed = urllib.parse.urlparse(uri)
    return urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else None


def read_events(bep_path):
    """label -> {"status": overall status or None, "xml": [paths],
    "attempts": {(run, shard): {attempt: [paths]}}}"""
    targets = {}
    with open(bep_path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            event = json.loads(line)
            ident = event.get("id", {})
            if "testResult" in ident:
                t = targets.setdefault(ident["testResult"]["label"],
                                       {"status": None, "xml": [], "attempts": {}})
                r = ident["testResult"]
                attempt = t["attempts"].setdefault(
                    (r.get("run", 1), r.get("shard", 1)), {}).setdefault(
                        r.get("attempt", 1), [])
                for out in event.get("testResult", {}).get("testActionOutput", []):
                    if out.get("name") == "test.xml":
                        t["xml"].append(file_path(out.get("uri", "")))
                        attempt.append(file_path(out.get("uri", "")))
            elif "testSummary" in ident:
                t = targets.setdefault(ident["testSummary"]["label"],
                                       {"status": None, "xml": [], "attempts": {}})
                t["status"] = event.get("testSummary", {}).get("overallStatus")
            elif "targetCompleted" in ident and event.get("completed", {}).get(
                    "success") is False:
                # A test target that failed to build has no testSummary.
                label = ident["targetCompleted"]["label"]
                targets.setdefault(label, {"status": None, "xml": [], "attempts": {}})
                targets[label]["status"] = "FAILED_TO_BUILD"
    return targets


def count(targets):
    passed = failed = skipped = 0
    notes = []
    for label in sorted(targets):
        t = targets[label]
        p = f = s = 0
        why = []
        failed_names = []
        paths = [x for x in t["xml"] if x]
        status = t["status"]
        if status == "FLAKY":
            # Its last attempt of each run and shard counts; the others are
            # named.
            paths = []
            for key in sorted(t["attempts"]):
                attempts = t["attempts"][key]
                last = max(attempts)
                paths += [x for x in attempts[last] if x]
                for n in sorted(attempts):
                    if n == last:
                        continue
                    names = []
                    for x in attempts[n]:
                        if x:
                            names += xml_cases(x)[4]
                    why.append(f"attempt {n} failed"
                               + (" (" + ", ".join(sorted(set(names))[:5]) + ")"
                                  if names else "")
                               + f", attempt {last} passed")
            status = "PASSED"
            flaky_notes = list(why)
            why = []
        if not paths:
            f, reason = 1, "no test.xml"
            why.append(reason)
        for path in paths:
            dp, df, ds, reason, names = xml_cases(path)
            p, f, s = p + dp, f + df, s + ds
            failed_names += names
            if reason:
                why.append(reason)
        if failed_names:
            # Named here, at the end of CI's output, since a test's own
            # log may be cut from what a reader gets to see.
            shown = sorted(set(failed_names))
            more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
            why.append("failed: " + ", ".join(shown[:5]) + more)
        if status != "PASSED":
            why.append(f"Bazel reports {status or 'no status'}")
            if f == 0:
                f = 1
        passed, failed, skipped = passed + p, failed + f, skipped + s
        if t["status"] == "FLAKY":
            why = [f"Bazel reports FLAKY: " + "; ".join(flaky_notes)] + why
        if f or s or t["status"] == "FLAKY":
            detail = "; ".join(why) or f"{f} case(s) failed"
            notes.append(f"  {label}: {p} passed, {f} failed, {s} skipped ({detail})")
    return passed, failed, skipped, notes


def main(argv):
    args = argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    bep = args[0]
    checks = checks_failed = 0
    rest = args[1:]
    while rest:
        if rest[0] == "--checks":
            checks = int(rest[1])
        elif rest[0] == "--checks-failed":
            checks_failed = int(rest[1])
        else:
            print(f"test_results: unknown argument {rest[0]}", file=sys.stderr)
            return 2
        rest = rest[2:]
    try:
        targets = read_events(bep)
    except (OSError, ValueError) as e:
        print(f"test_results: cannot read {bep}: {e}", file=sys.stderr)
        print("0 passed, 1 failed, 0 skipped")
        return 1
    passed, failed, skipped, notes = count(targets)
    if not targets:
        notes.append("  no test target reported by Bazel")
        failed += 1
    passed += checks - checks_failed
    failed += checks_failed
    for note in notes:
        print(note)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
