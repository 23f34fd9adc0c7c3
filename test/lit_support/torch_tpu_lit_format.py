"""The lit test format of the torch_tpu suite (imported by test/lit.cfg.py).

It lives in a module, not in lit.cfg.py, because lit pickles the format to send it to
its worker processes; multiprocessing passes sys.path on, so this module is found there.
"""

from __future__ import annotations

import lit.formats


class ShTestWithRunLines(lit.formats.ShTest):
    """ShTest that skips `.py` files without a `RUN:` line (helpers, not tests)."""

    def getTestsForPath(self, testSuite, path_in_suite, litConfig, localConfig):
        for test in super().getTestsForPath(testSuite, path_in_suite, litConfig, localConfig):
            path = test.getSourcePath()
            if path.endswith(".py"):
                with open(path, encoding="utf-8", errors="replace") as f:
                    if "RUN:" not in f.read():
                        continue
            yield test
