"""Negative controls of mpi4py_suite_check.py: crafted rank directories (as
Open MPI's --output-filename writes them) with each defect the judge must
catch, and clean ones it must pass. Also parses the real list.

usage: mpi4py_suite_check_test.py CHECK_PY EXPECTED_LIST
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

CHECK, REAL_LIST = sys.argv[1], sys.argv[2]
SEP, LINE = "=" * 70, "-" * 70
LIST = """\
# The cause of these two.
dropin mod_a.TestA.testListed fails in testListed\\n +self\\.check\\(\\)\\nAssertionError: wrong thing
intel mod_a.TestA.testCrash crashes Signal: Segmentation fault \\(11\\)
"""
LISTED_BLOCK = f"""{SEP}
FAIL: testListed (mod_a.TestA.testListed)
{LINE}
Traceback (most recent call last):
  File "mod_a.py", line 9, in testListed
    self.check()
AssertionError: wrong thing
"""


def rank_log(tests="ok", blocks=LISTED_BLOCK, ran=3, summary="FAILED (failures=1)",
             status=1):
    """One rank's stderr: runtests.py -v output and the wrapper's status."""
    started = {"testListed": "FAIL", "testOther": tests, "testMore": "ok"}
    text = "".join(f"{name} (mod_a.TestA.{name}) ... {result}\n"
                   for name, result in started.items())
    text += f"\n{blocks}\n{LINE}\nRan {ran} tests in 0.1s\n\n{summary}\n"
    if status is not None:
        text += f"mpi4py-rank: exit status {status}\n"
    return text


class Judge(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psmd-judge-")
        self.list = os.path.join(self.dir, "list.txt")
        with open(self.list, "w") as f:
            f.write(LIST)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def judge(self, ranks, status=0, library="dropin", mpirun_log="", crash=None,
              stdout=""):
        """Writes the rank directory and runs the judge: its exit status."""
        run = tempfile.mkdtemp(dir=self.dir)  # one per call: a test may judge several
        rank_dir = os.path.join(run, "ranks")
        for r, text in enumerate(ranks):
            d = os.path.join(rank_dir, "1", f"rank.{r}")
            os.makedirs(d)
            with open(os.path.join(d, "stderr"), "w") as f:
                f.write(text)
            with open(os.path.join(d, "stdout"), "w") as f:
                f.write(stdout)
        log = os.path.join(run, "mpirun.log")
        with open(log, "w") as f:
            f.write(mpirun_log)
        cmd = [sys.executable, CHECK, "judge"] + (["--crash", crash] if crash else [])
        cmd += [library, self.list, str(status), "2", rank_dir, log]
        p = subprocess.run(cmd, capture_output=True, text=True)
        print(p.stdout, p.stderr)
        return p.returncode

    def assertPasses(self, *args, **kwargs):
        self.assertEqual(self.judge(*args, **kwargs), 0)

    def assertFails(self, *args, **kwargs):
        self.assertNotEqual(self.judge(*args, **kwargs), 0)

    def test_clean_run_passes(self):
        self.assertPasses([rank_log(), rank_log()])

    def test_nonzero_mpirun_status(self):
        self.assertFails([rank_log(), rank_log()], status=1)

    def test_sanitizer_reports(self):
        for report in ["==42==ERROR: AddressSanitizer: heap-use-after-free on address",
                       "client/ep.cc:12:3: runtime error: load of misaligned address",
                       "==42==ERROR: LeakSanitizer: detected memory leaks"]:
            with self.subTest(report=report, where="rank stdout"):
                self.assertFails([rank_log(), rank_log()], stdout=report + "\n")
            with self.subTest(report=report, where="after the summary"):
                self.assertFails([rank_log() + report + "\n", rank_log()])
            with self.subTest(report=report, where="mpirun's log"):
                self.assertFails([rank_log(), rank_log()], mpirun_log=report + "\n")

    def test_zero_tests(self):
        self.assertFails([rank_log(), rank_log(ran=0)])

    def test_rank_without_ran_line(self):
        crashed = rank_log().split(LINE + "\nRan")[0]
        self.assertFails([rank_log(), crashed])

    def test_missing_rank_log(self):
        self.assertFails([rank_log()])

    def test_summary_disagrees_with_reports(self):
        # unittest counted two failures; only one report is in the log (a
        # report lost or spliced).
        self.assertFails([rank_log(), rank_log(summary="FAILED (failures=2)")])
        self.assertFails([rank_log(), rank_log(summary="FAILED (failures=1, errors=1)")])

    def test_unexpected_success(self):
        self.assertFails([rank_log(), rank_log(
            summary="FAILED (failures=1, unexpected successes=1)")])

    def test_exit_status_after_summary(self):
        # Crashed in MPI_Finalize after its report (SIGSEGV), or no status.
        self.assertFails([rank_log(), rank_log(status=139)])
        self.assertFails([rank_log(), rank_log(status=None)])
        self.assertFails([rank_log(), rank_log(status=0)])

    def test_stale_entry(self):
        passing = rank_log(blocks="", summary="OK", status=0).replace(
            "testListed (mod_a.TestA.testListed) ... FAIL", "testListed (mod_a.TestA.testListed) ... ok")
        self.assertFails([rank_log(), passing])
        self.assertFails([passing, passing])

    def test_listed_test_gone_from_its_module(self):
        gone = rank_log(blocks="", summary="OK", status=0).replace(
            "testListed (mod_a.TestA.testListed) ... FAIL\n", "")
        self.assertFails([gone, gone])

    def test_listed_test_failing_differently(self):
        other = LISTED_BLOCK.replace("wrong thing", "something else")
        self.assertFails([rank_log(), rank_log(blocks=other)])
        error = LISTED_BLOCK.replace("AssertionError: wrong thing",
                                     "mpi4py.MPI.Exception: MPI_ERR_OTHER")
        self.assertFails([rank_log(), rank_log(blocks=error)])

    def test_unlisted_failure(self):
        extra = LISTED_BLOCK + f"\n{SEP}\n" + LISTED_BLOCK.split("\n", 1)[1].replace(
            "testListed", "testOther")
        self.assertFails([rank_log(), rank_log(
            tests="FAIL", blocks=extra, summary="FAILED (failures=2)")])
        # Listed for another library only.
        self.assertFails([rank_log(), rank_log()], library="intel")

    def test_crash_run(self):
        crashed = ("testCrash (mod_a.TestA.testCrash) ... [vm:1] *** Process received signal ***\n"
                   "[vm:1] Signal: Segmentation fault (11)\n")
        self.assertPasses([crashed, ""], status=1, library="intel",
                          crash="mod_a.TestA.testCrash")
        # It no longer crashes: passes, or fails as a test would.
        ran = "testCrash (mod_a.TestA.testCrash) ... ok\n"
        self.assertFails([ran, ran], status=0, library="intel",
                         crash="mod_a.TestA.testCrash")
        # It crashes some other way.
        self.assertFails([crashed.replace("Segmentation fault (11)", "Aborted (6)"), ""],
                         status=1, library="intel", crash="mod_a.TestA.testCrash")
        # Not listed as crashing on that library.
        self.assertFails([crashed, ""], status=1, library="dropin",
                         crash="mod_a.TestA.testCrash")

    def test_entry_without_cause_refused(self):
        with open(self.list, "w") as f:
            f.write(LIST.split("\n", 1)[1])
        self.assertFails([rank_log(), rank_log()])

    def test_real_list_parses_with_causes(self):
        p = subprocess.run([sys.executable, CHECK, "crashes", "intel", REAL_LIST],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("testAlltoallwBottom", p.stdout)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
