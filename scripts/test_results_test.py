"""scripts/test_results.py, fed the build events and test.xml files of runs
with each defect it must catch: every one of them has to count as failed
(or skipped), never as passed."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
COUNTER = os.path.join(HERE, "test_results.py")

PASS_CASES = """<testsuites><testsuite name="t" tests="2">
<testcase name="a" status="run" result="completed"/>
<testcase name="b" status="run" result="completed"/>
</testsuite></testsuites>"""
ONE_FAILED = """<testsuites><testsuite name="t" tests="2">
<testcase name="a" status="run"/>
<testcase name="b" status="run"><failure message="x"/></testcase>
</testsuite></testsuites>"""
SKIPPED = """<testsuites><testsuite name="t" tests="3">
<testcase name="a" status="run" result="completed"/>
<testcase name="b" status="run" result="skipped"><skipped message="root only"/></testcase>
<testcase name="DISABLED_c" status="notrun" result="suppressed"/>
</testsuite></testsuites>"""
NO_CASES = """<testsuites tests="0"><testsuite name="t" tests="0"/></testsuites>"""


class Run:
    """A fake `bazel test` run's outputs in a directory of its own."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.events = []

    def target(self, label, status, xml=None, write_xml=True):
        outputs = []
        if xml is not None:
            path = os.path.join(self.tmp, label.strip("/").replace(":", "_") + ".xml")
            if write_xml:
                with open(path, "w") as f:
                    f.write(xml)
            outputs.append({"name": "test.xml", "uri": "file://" + path})
        self.events.append({"id": {"testResult": {"label": label, "run": 1}},
                            "testResult": {"testActionOutput": outputs}})
        if status is not None:
            self.events.append({"id": {"testSummary": {"label": label}},
                                "testSummary": {"overallStatus": status}})

    def attempt(self, label, attempt, xml):
        """One attempt of a target Bazel ran again (a `flaky` one)."""
        path = os.path.join(self.tmp, label.strip("/").replace(":", "_")
                            + f".{attempt}.xml")
        with open(path, "w") as f:
            f.write(xml)
        self.events.append(
            {"id": {"testResult": {"label": label, "run": 1, "shard": 1,
                                   "attempt": attempt}},
             "testResult": {"testActionOutput": [
                 {"name": "test.xml", "uri": "file://" + path}]}})

    def summary(self, label, status):
        self.events.append({"id": {"testSummary": {"label": label}},
                            "testSummary": {"overallStatus": status}})

    def count(self, *extra):
        bep = os.path.join(self.tmp, "bep.json")
        with open(bep, "w") as f:
            for e in self.events:
                f.write(json.dumps(e) + "\n")
        out = subprocess.run([sys.executable, COUNTER, bep, *extra],
                             capture_output=True, text=True)
        last = out.stdout.strip().splitlines()[-1]
        return last, out.returncode, out.stdout


class TestResultsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR"))
        self.run_ = Run(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()

    def test_clean_run_passes(self):
        self.run_.target("//a:t", "PASSED", PASS_CASES)
        self.assertEqual(self.run_.count()[:2], ("2 passed, 0 failed, 0 skipped", 0))

    def test_failed_case_counts(self):
        self.run_.target("//a:t", "FAILED", ONE_FAILED)
        last, rc, out = self.run_.count()
        self.assertEqual((last, rc), ("1 passed, 1 failed, 0 skipped", 1))
        # The failed case is named beside its target's count.
        self.assertIn("//a:t: 1 passed, 1 failed, 0 skipped (failed: b;", out)

    def test_flaky_target_counts_its_last_attempt_and_names_the_failed_one(self):
        self.run_.attempt("//a:t", 1, ONE_FAILED)
        self.run_.attempt("//a:t", 2, PASS_CASES)
        self.run_.summary("//a:t", "FLAKY")
        last, rc, out = self.run_.count()
        self.assertEqual((last, rc), ("2 passed, 0 failed, 0 skipped", 0))
        self.assertIn("//a:t: 2 passed, 0 failed, 0 skipped (Bazel reports "
                      "FLAKY: attempt 1 failed (b), attempt 2 passed)", out)

    def test_target_failing_every_attempt_fails(self):
        self.run_.attempt("//a:t", 1, ONE_FAILED)
        self.run_.attempt("//a:t", 2, ONE_FAILED)
        self.run_.summary("//a:t", "FAILED")
        last, rc, _ = self.run_.count()
        self.assertEqual((last, rc), ("2 passed, 2 failed, 0 skipped", 1))

    def test_skipped_cases_are_not_passes(self):
        self.run_.target("//a:t", "PASSED", SKIPPED)
        self.assertEqual(self.run_.count()[:2], ("1 passed, 0 failed, 2 skipped", 0))

    def test_target_with_no_case_fails(self):
        self.run_.target("//a:t", "PASSED", NO_CASES)
        last, rc, out = self.run_.count()
        self.assertEqual((last, rc), ("0 passed, 1 failed, 0 skipped", 1))
        self.assertIn("no test case", out)

    def test_missing_xml_fails(self):
        self.run_.target("//a:t", "PASSED", PASS_CASES, write_xml=False)
        self.run_.target("//a:u", "PASSED", None)
        last, rc, out = self.run_.count()
        self.assertEqual((last, rc), ("0 passed, 2 failed, 0 skipped", 1))
        self.assertIn("//a:u", out)

    def test_unparsable_xml_fails(self):
        self.run_.target("//a:t", "PASSED", "<testsuites><testcase")
        self.assertEqual(self.run_.count()[:2], ("0 passed, 1 failed, 0 skipped", 1))

    def test_nonzero_exit_after_all_pass_xml_fails(self):
        # The binary wrote an all-pass XML, then crashed at exit: Bazel says
        # FAILED, and that is what counts.
        self.run_.target("//a:t", "FAILED", PASS_CASES)
        last, rc, out = self.run_.count()
        self.assertEqual((last, rc), ("2 passed, 1 failed, 0 skipped", 1))
        self.assertIn("Bazel reports FAILED", out)

    def test_timeout_and_no_status_fail(self):
        self.run_.target("//a:t", "TIMEOUT", PASS_CASES)
        self.run_.target("//a:u", None, PASS_CASES)
        self.assertEqual(self.run_.count()[:2], ("4 passed, 2 failed, 0 skipped", 1))

    def test_failed_build_fails(self):
        self.run_.events.append({"id": {"targetCompleted": {"label": "//a:t"}},
                                 "completed": {"success": False}})
        self.assertEqual(self.run_.count()[:2], ("0 passed, 1 failed, 0 skipped", 1))

    def test_no_targets_fails(self):
        self.assertEqual(self.run_.count()[:2], ("0 passed, 1 failed, 0 skipped", 1))

    def test_checks_are_counted(self):
        self.run_.target("//a:t", "PASSED", PASS_CASES)
        self.assertEqual(self.run_.count("--checks", "4", "--checks-failed", "1")[:2],
                         ("5 passed, 1 failed, 0 skipped", 1))


if __name__ == "__main__":
    unittest.main()
