"""Negative controls of mpich_run.py: a crafted test/mpi tree (testlists,
programs that are scripts run by the real mpirun, build logs) with each
defect the judge must catch, and a clean one it must pass.

usage: mpich_run_test.py MPICH_RUN_PY
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

RUN = sys.argv[1]
PROGRAMS = {"pt2pt/ok": "echo ' No Errors'", "pt2pt/bad": "echo 'Found 1 errors'",
            # Says it waits, then hangs past its time limit (3 s, below).
            "pt2pt/hang": "echo waiting; exec sleep 60"}
LISTS = {"pt2pt": "ok 1\nbad 1\nhang 1\n", "coll": "gone 2\n", "comm": ""}
BUILD_LOG = "/x/coll/gone.c:12: undefined reference to `MPI_Gone_init'\n"
CLEAN = """\
totals ci t 1 2
totals full t 1 3
# The cause.
not-built coll/gone MPI_Gone_init
t pt2pt/bad 1 ~ ^Found 1 errors$
# It hangs: its signature is what it prints until its time limit kills it.
t pt2pt/hang 1
too-long-for-ci t pt2pt/hang 1 ~ \\Awaiting\\n\\Z
"""
FULL = ()  # no --ci: the too-long-for-ci runs too


class MpichRun(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psmd-mpich-")
        self.tests = os.path.join(self.dir, "mpi")
        for d, text in LISTS.items():
            os.makedirs(os.path.join(self.tests, d))
            with open(os.path.join(self.tests, d, "testlist"), "w") as f:
                f.write(text)
        for name, body in PROGRAMS.items():
            path = os.path.join(self.tests, name)
            with open(path, "w") as f:
                f.write(f"#!/bin/sh\n{body}\n")
            os.chmod(path, 0o755)
        with open(os.path.join(self.dir, "make-coll.log"), "w") as f:
            f.write(BUILD_LOG)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def run_judge(self, expected, options=("--ci",), log=None):
        if log is not None:
            with open(os.path.join(self.dir, "make-coll.log"), "w") as f:
                f.write(log)
        path = os.path.join(self.dir, "expected.txt")
        with open(path, "w") as f:
            f.write(expected)
        # mpirun's session directory goes in ours (TMPDIR).
        p = subprocess.run([sys.executable, RUN, *options, "--build-logs", self.dir,
                            self.tests, path, "t=--allow-run-as-root"],
                           capture_output=True, text=True,
                           env=dict(os.environ, TMPDIR=self.dir,
                                    # 30 s * 0.1: 3 s for each program (mpirun
                                    # starts one in 0.1-0.3 s at load 9).
                                    MPITEST_TIMEOUT_MULTIPLIER="0.1"))
        print(p.stdout, p.stderr)
        return p.returncode, p.stdout

    def test_clean(self):
        self.assertEqual(self.run_judge(CLEAN)[0], 0)

    def test_not_built_unlisted(self):
        self.assertNotEqual(self.run_judge(CLEAN.replace("not-built coll/gone MPI_Gone_init\n", ""))[0], 0)

    def test_not_built_for_another_reason(self):
        self.assertNotEqual(self.run_judge(CLEAN, log="gone.c:3:1: error: expected ';'\n")[0], 0)
        self.assertNotEqual(self.run_judge(CLEAN.replace("MPI_Gone_init", "MPI_Other"))[0], 0)

    def test_totals(self):
        self.assertNotEqual(self.run_judge(CLEAN.replace("totals ci t 1 2", "totals ci t 2 2"))[0], 0)
        self.assertNotEqual(self.run_judge(CLEAN.replace("totals ci t 1 2", "totals ci t 1 3"))[0], 0)
        self.assertNotEqual(self.run_judge(CLEAN.replace("totals ci t 1 2\n", ""))[0], 0)

    def test_unlisted_failure_and_stale_entry(self):
        self.assertNotEqual(self.run_judge(CLEAN.replace("t pt2pt/bad 1 ~ ^Found 1 errors$\n", ""))[0], 0)
        self.assertNotEqual(self.run_judge(CLEAN + "t pt2pt/ok 1 ~ .\n")[0], 0)

    def test_signature(self):
        # A listed test failing otherwise than its signature says, or
        # listed without one.
        self.assertNotEqual(self.run_judge(CLEAN.replace(
            "^Found 1 errors$", "^Found 2 errors$"))[0], 0)
        self.assertNotEqual(self.run_judge(CLEAN.replace(" ~ ^Found 1 errors$", ""))[0], 0)

    def test_at_limit(self):
        status, out = self.run_judge(CLEAN, options=FULL)
        self.assertEqual(status, 0)
        self.assertIn("killed at its time limit", out)

    def test_at_limit_without_signature(self):
        self.assertNotEqual(self.run_judge(CLEAN.replace(
            " ~ \\Awaiting\\n\\Z", ""), options=FULL)[0], 0)

    def test_at_limit_printing_otherwise(self):
        # What it printed until the kill is not what the signature says
        # (e.g. an error report before the hang).
        self.assertNotEqual(self.run_judge(CLEAN.replace(
            "\\Awaiting", "\\AFound 0 errors\\n"), options=FULL)[0], 0)

    def test_at_limit_ending_by_itself(self):
        # Listed as hanging, but it exits (with an error) before its limit,
        # though its output matches the signature.
        self.assertNotEqual(self.run_judge(
            CLEAN + "too-long-for-ci t pt2pt/bad 1 ~ Found 1 errors\n", options=FULL)[0], 0)

    def test_timeout_not_listed_as_such(self):
        # MPICH_RUN_DIAG: mpich_suite.sh's psmctl calls, here an echo.
        os.environ["MPICH_RUN_DIAG"] = "echo the diagnostic command ran"
        try:
            status, out = self.run_judge(CLEAN.replace(
                "too-long-for-ci t pt2pt/hang 1 ~ \\Awaiting\\n\\Z\n", ""),
                options=FULL)
        finally:
            del os.environ["MPICH_RUN_DIAG"]
        self.assertNotEqual(status, 0)
        # What the hung run was doing, before the kill: its processes
        # (mpirun and the test's `sleep`) with where they waited.
        self.assertRegex(out, r"\| pid \d+ S wchan \S+ cpu \d+ sleep 60")
        self.assertIn("| the diagnostic command ran", out)

    def test_may_time_out(self):
        may = CLEAN.replace("t pt2pt/hang 1\ntoo-long-for-ci", "may-time-out").replace(
            "totals full t 1 3", "totals full t 1 2")
        status, out = self.run_judge(may, options=FULL)
        self.assertEqual(status, 0)
        # Counted apart from the totals.
        self.assertIn("1 that may time out: 0 passed, 1 timed out", out)
        self.assertNotEqual(self.run_judge(may.replace("totals full t 1 2", "totals full t 1 3"),
                                           options=FULL)[0], 0)
        self.assertNotEqual(self.run_judge(may.replace("\\Awaiting", "\\Aready"),
                                           options=FULL)[0], 0)
        # One that may time out but fails by itself.
        self.assertNotEqual(self.run_judge(may.replace("t pt2pt/bad 1 ~", "may-time-out t pt2pt/bad 1 ~"),
                                           options=FULL)[0], 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
