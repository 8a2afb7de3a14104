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
PROGRAMS = {"pt2pt/ok": "echo ' No Errors'", "pt2pt/bad": "echo 'Found 1 errors'"}
LISTS = {"pt2pt": "ok 1\nbad 1\n", "coll": "gone 2\n", "comm": ""}
BUILD_LOG = "/x/coll/gone.c:12: undefined reference to `MPI_Gone_init'\n"
CLEAN = """\
totals ci t 1 2
# The cause.
not-built coll/gone MPI_Gone_init
t pt2pt/bad 1
"""


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
                           env=dict(os.environ, TMPDIR=self.dir))
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
        self.assertNotEqual(self.run_judge(CLEAN.replace("t pt2pt/bad 1\n", ""))[0], 0)
        self.assertNotEqual(self.run_judge(CLEAN + "t pt2pt/ok 1\n")[0], 0)

    def test_signature(self):
        self.assertEqual(self.run_judge(CLEAN.replace(
            "t pt2pt/bad 1", "t pt2pt/bad 1 ~ ^Found 1 errors$"))[0], 0)
        # A listed test failing otherwise than its signature says.
        self.assertNotEqual(self.run_judge(CLEAN.replace(
            "t pt2pt/bad 1", "t pt2pt/bad 1 ~ ^Found 2 errors$"))[0], 0)

    def test_only_listed(self):
        status, out = self.run_judge(CLEAN.replace("totals ci t 1 2", "totals ci t 0 1"),
                                     options=("--ci", "--only-listed", "t"))
        self.assertEqual(status, 0)
        self.assertNotIn("pt2pt/ok", out)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
