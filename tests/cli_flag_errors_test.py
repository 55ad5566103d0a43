#!/usr/bin/python3
"""A mistake on `conveyor`'s command line (an unknown flag, a missing or malformed value) comes out
as the CLI's one error line, `conveyor SUBCOMMAND: error: ...` with exit status 2, for every
subcommand (docs/check.md "Exit status"), not CLI11's own text and usage dump; --help still
prints the usage and exits 0.

Usage: CONVEYOR_CLI=build/tools/conveyor cli_flag_errors_test.py
"""

import os
import re
import subprocess
import unittest

CLI = os.environ.get("CONVEYOR_CLI", "build/tools/conveyor")


def run(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60)


def subcommands():
    """The subcommands `conveyor --help` lists."""
    r = run("--help")
    assert r.returncode == 0, r.stderr
    listing = r.stdout.split("Subcommands:")[1]
    return re.findall(r"^  ([a-z]+) ", listing, re.M)


class FlagErrors(unittest.TestCase):
    def assertOneErrorLine(self, r, name, says):
        self.assertEqual(r.returncode, 2, r.stderr)
        lines = r.stderr.strip().split("\n")
        self.assertEqual(len(lines), 1, f"one line, not a usage dump:\n{r.stderr}")
        self.assertTrue(lines[0].startswith(f"{name}: error: "), lines[0])
        self.assertIn(says, lines[0])
        self.assertIn(f"(see {name} --help)", lines[0])
        self.assertEqual(r.stdout, "")

    def test_every_subcommand_names_itself(self):
        # CLI11 reports a missing required argument before an unexpected one, so what the line
        # says varies; that it is one line of Conveyor's own format does not.
        subs = subcommands()
        self.assertIn("check", subs)
        self.assertGreaterEqual(len(subs), 14, subs)
        for sub in subs:
            with self.subTest(sub=sub):
                self.assertOneErrorLine(run(sub, "--no-such-flag"), f"conveyor {sub}", "")

    def test_an_unknown_flag_is_named(self):
        self.assertOneErrorLine(run("check", "/nonexistent", "--no-such-flag"), "conveyor check",
                                "--no-such-flag")

    def test_a_missing_required_flag(self):
        self.assertOneErrorLine(run("synth"), "conveyor synth", "--out is required")

    def test_a_malformed_value(self):
        self.assertOneErrorLine(run("check", "/nonexistent", "--episodes", "many"),
                                "conveyor check", "many")

    def test_a_nested_subcommand(self):
        self.assertOneErrorLine(run("cache", "info", "--no-such-flag"), "conveyor cache info",
                                "--no-such-flag")

    def test_no_subcommand(self):
        r = run()
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertTrue(r.stderr.startswith("conveyor: error: "), r.stderr)

    def test_help_and_version_still_print_and_exit_0(self):
        r = run("check", "--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--write-quarantine", r.stdout)
        r = run("--version")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("conveyor "), r.stdout)


if __name__ == "__main__":
    unittest.main()
