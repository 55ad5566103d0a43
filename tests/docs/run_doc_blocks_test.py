#!/usr/bin/python3
"""run_doc_blocks.py fails a page for a stale flag, a failing command, a stale output or a skip
without a reason, and passes a page whose blocks work (tests/docs/fixtures/).

Usage: run_doc_blocks_test.py SOURCE_DIR BUILD_DIR
"""

import os
import subprocess
import sys
import unittest

SOURCE, BUILD = sys.argv[1], sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))


def run_page(name):
    return subprocess.run(
        ["/usr/bin/python3", os.path.join(HERE, "run_doc_blocks.py"), "--source", SOURCE,
         "--build", BUILD, os.path.join(HERE, "fixtures", name)],
        capture_output=True, text=True, timeout=120)


class RunDocBlocks(unittest.TestCase):
    def test_a_page_that_works_passes(self):
        r = run_page("passing.md")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("4 blocks ran, 1 skipped", r.stdout)
        self.assertIn("hello", r.stdout)

    def test_a_stale_flag_fails_naming_it(self):
        r = run_page("stale_flag.md")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("stale_flag.md:5: `conveyor check` has no flag --no-such-flag", r.stderr)

    def test_a_failing_command_fails_naming_its_block(self):
        r = run_page("failing_block.md")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("failing_block.md:8: the block failed at: conveyor inspect", r.stderr)
        self.assertNotIn("never reached", r.stdout)

    def test_a_stale_output_fails_showing_both(self):
        r = run_page("stale_output.md")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--- the page\nconveyor 0.1.0\n...\nprotocol version: 0\n--- printed\n",
                      r.stderr)
        self.assertIn("stale_output.md:3: the block failed", r.stderr)

    def test_a_skip_needs_a_reason(self):
        r = run_page("bad_marker.md")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("unknown doctest marker 'skip'", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
