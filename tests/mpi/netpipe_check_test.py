"""Negative controls of netpipe_check.py: crafted NetPIPE -i outputs.

usage: netpipe_check_test.py NETPIPE_CHECK_PY
"""
import os
import subprocess
import sys
import tempfile
import unittest

CHECK = sys.argv[1]
BANNER = "Doing an integrity check instead of measuring performance\n"
GOOD = BANNER + "".join(f"{i:3d}: {1 << i:8d} bytes {100:6d} times -->  "
                        "Integrity check passed\n" for i in range(5))


class NetpipeCheck(unittest.TestCase):
    def judge(self, text):
        with tempfile.NamedTemporaryFile("w", prefix="psmd-np-", suffix=".log") as f:
            f.write(text)
            f.flush()
            return subprocess.run([sys.executable, CHECK, f.name]).returncode

    def test_clean(self):
        self.assertEqual(self.judge(GOOD), 0)

    def test_defects(self):
        for name, text in {
            "a failed size": GOOD + "Integrity check failed: Expecting 7 but received 0\n",
            "a size without its verdict": GOOD + "  5:       32 bytes    100 times -->  \n",
            "no integrity mode": GOOD.replace(BANNER, ""),
            "no sizes": BANNER,
        }.items():
            with self.subTest(name):
                self.assertNotEqual(self.judge(text), 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
