#!/usr/bin/python3
"""Runs the shell and Python blocks of one Markdown page (README.md, docs/*.md) as a user would.

A user follows a page command by command from the repository root, after a build, with the CLI
on PATH (`export PATH="$PWD/build/tools:$PATH"`, README "Quick start") and the build tree's Python
package on PYTHONPATH (`PYTHONPATH=build/python`, docs/python.md "Installing"). This does the same
in a fresh directory that looks like the repository root (its top-level entries linked, `build`
linking the build tree under test), so what the commands write stays out of the checkout:

- every ```bash, ```sh, ```console and ```python block runs, in page order, in one bash session per page (so
  an `export` or a server started with `&` carries on to the next block); a failing command fails
  the test, naming the page's line. Python blocks run with /usr/bin/python3 from another
  directory (a snippet must not depend on the working directory). Untagged blocks are output or
  listings and are not run. A ```console block is a transcript: each `$ COMMAND` line runs and
  must print the lines below it (stdout and stderr; a line `...` stands for any lines).
- the word DATASET in a block is the one thing a user replaces: it becomes a small robot dataset
  made as README's Quick start makes one (`conveyor synth --episodes 4 --episode-seconds 3`).
- paths under /tmp/ in shell blocks become paths under this run's own temporary directory, so
  pages tested in parallel (ctest -j) never share files; servers a page leaves running are
  stopped at the end.

Markers, in an HTML comment on the line(s) right before a block's fence (invisible on the page):

  <!-- doctest: skip (why) -->   not run; the reason is required (needs a GPU, a cluster, S3
                                  credentials, the reader's own data, ...)
  <!-- doctest: flags -->        a synopsis or an example over data we do not have: not run, but
                                  every --flag of each `conveyor SUBCOMMAND` in it must be one that
                                  `conveyor SUBCOMMAND --help` lists (a renamed flag fails here)

Usage: run_doc_blocks.py --source SRC --build BUILD PAGE.md
(DOCTEST_KEEP=1 keeps the run's directory, with the page's script, page.sh, for a look.)
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*doctest:\s*(.*?)\s*-->\s*$")
RUN_TAGS = {"bash", "sh", "python", "console"}
TIMEOUT_S = 170


class Block:
    def __init__(self, line, tag, body, markers):
        self.line, self.tag, self.body, self.markers = line, tag, body, markers


def parse(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, tag, start = len(m.group(1)), m.group(2), i
        markers, j = [], i - 1
        while j >= 0 and MARKER.match(lines[j]):
            markers.insert(0, MARKER.match(lines[j]).group(1))
            j -= 1
        i += 1
        body = []
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        blocks.append(Block(start + 1, tag, "\n".join(body) + "\n", markers))
        i += 1
    return blocks


def fail(page, line, message):
    sys.exit(f"{page}:{line}: {message}")


def help_text(cli, words, cache):
    key = tuple(words)
    if key not in cache:
        r = subprocess.run([cli, *words, "--help"], capture_output=True, text=True, timeout=30)
        cache[key] = r.stdout + r.stderr if r.returncode == 0 else None
    return cache[key]


def check_flags(page, block, cli, cache):
    """Each `conveyor SUB [SUB2] ... --flag` of the block: --flag is in SUB's --help."""
    text = re.sub(r"\\\n", " ", block.body)
    global_help = help_text(cli, [], cache)
    checked = 0
    for n, line in enumerate(text.split("\n")):
        for call in re.split(r"(?=(?:^|\s)(?:\S*/)?conveyor\s)", line):
            m = re.match(r"\s*(?:\S*/)?conveyor\s+(.*)", call)
            if not m:
                continue
            words = m.group(1).split()
            # Storage options may come before the subcommand (`conveyor --s3-endpoint URL serve`).
            while len(words) >= 2 and words[0].startswith("--"):
                words = words[2:]
            if not words or not re.match(r"^[a-z]+$", words[0]):
                continue
            sub = [words[0]]
            help_ = help_text(cli, sub, cache)
            if help_ is None:
                fail(page, block.line, f"`conveyor {words[0]}` is not a subcommand")
            # A second level (`conveyor cache warm`), when the first lists it.
            for w in words[1:2]:
                for alt in w.split("|"):
                    if re.match(r"^[a-z]+$", alt) and re.search(rf"^\s+{alt}\b", help_, re.M):
                        if help_text(cli, sub + [alt], cache) is not None:
                            sub = sub + [alt]
                            help_ = help_text(cli, sub, cache)
                            break
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", call):
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_ + global_help):
                    fail(page, block.line + 1 + n,
                         f"`conveyor {' '.join(sub)}` has no flag {flag} (see `conveyor "
                         f"{' '.join(sub)} --help`)")
                checked += 1
    return checked


def shell_words(text):
    """What a user changes in a shell command: DATASET; /tmp/ becomes this run's own."""
    text = re.sub(r"(?<![\w./-])/tmp/", "$DOCTEST_TMP/", text)
    return re.sub(r"\bDATASET\b", "$DOCTEST_DATASET", text)


def console_script(block, n):
    """A ```console transcript: each `$ COMMAND` runs, and what it prints (stdout and stderr) must
    be the lines that follow it, a line `...` standing for any number of lines."""
    parts, cmd, expected = [], None, []

    def flush():
        if cmd is None:
            return
        k = len(parts)
        parts.append(
            f"cat > \"$DOCTEST_WORK/expected-{n}-{k}\" <<'DOCTEST_OUT'\n" + "".join(
                l + "\n" for l in expected) + "DOCTEST_OUT\n"
            # In a subshell, its exit status left to the transcript (`; echo "exit $?"`).
            f"( {shell_words(cmd)} ) > \"$DOCTEST_WORK/actual-{n}-{k}\" 2>&1 || true\n"
            f"/usr/bin/python3 \"$DOCTEST_RUNNER\" --match \"$DOCTEST_WORK/expected-{n}-{k}\" "
            f"\"$DOCTEST_WORK/actual-{n}-{k}\"\n")

    for line in block.body.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            flush()
            cmd, expected = line[2:], []
        elif cmd is None:
            sys.exit(f"line {block.line}: a console block starts with '$ COMMAND'")
        else:
            expected.append(line)
    flush()
    return "".join(parts)


def matches(expected, actual):
    """Line by line; `...` matches any run of lines (fewest first)."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


def match_main(expected_path, actual_path):
    expected = open(expected_path).read().rstrip("\n").split("\n")
    actual = open(actual_path).read().rstrip("\n").split("\n")
    if not matches(expected, actual):
        sys.exit("the output differs from the page's:\n--- the page\n" + "\n".join(expected) +
                 "\n--- printed\n" + "\n".join(actual))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--match":
        return match_main(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("page")
    a = ap.parse_args()
    source, build = os.path.abspath(a.source), os.path.abspath(a.build)
    page = os.path.relpath(os.path.abspath(a.page), source)
    cli = os.path.join(build, "tools", "conveyor")

    blocks = [b for b in parse(os.path.join(source, page)) if b.tag in RUN_TAGS]
    cache, script, runs, skips, flag_checks = {}, [], 0, 0, 0
    for b in blocks:
        kinds = [m.split()[0] for m in b.markers if m]
        for m in b.markers:
            if not re.match(r"^(skip \(.+\)|flags)$", m):
                fail(page, b.line, f"unknown doctest marker '{m}' (skip (why) | flags)")
        if "skip" in kinds:
            skips += 1
            continue
        if "flags" in kinds:
            flag_checks += check_flags(page, b, cli, cache)
            continue
        if b.tag == "console":
            body = console_script(b, len(script))
        elif b.tag == "python":
            # From another directory: a Python snippet must not depend on where it runs.
            body = f"(cd \"$DOCTEST_TMP\" && /usr/bin/python3 - <<'DOCTEST_PY'\n{b.body}DOCTEST_PY\n)\n"
        else:
            body = shell_words(b.body)
        script.append(f"DOCTEST_LINE={b.line}\n{body}")
        runs += 1

    if not script:
        print(f"{page}: nothing to run ({skips} skipped, {flag_checks} flags checked)")
        return
    work = tempfile.mkdtemp(prefix="doctest-")
    try:
        root = os.path.join(work, "repo")
        os.makedirs(os.path.join(work, "tmp"))
        os.makedirs(root)
        for entry in os.listdir(source):
            if entry.startswith(".") or entry.startswith("build") or entry == "out":
                continue
            os.symlink(os.path.join(source, entry), os.path.join(root, entry))
        os.symlink(build, os.path.join(root, "build"))
        prelude = [
            "set -e",
            'trap \'echo "doctest: $DOCTEST_PAGE:$DOCTEST_LINE: the block failed at: '
            '$BASH_COMMAND (exit $?)" >&2\' ERR',
            # Servers a page starts with `&` are its own: stop them (and wait) at the end.
            "trap 'rc=$?; trap - ERR; kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; exit $rc' EXIT",
            'export PATH="$PWD/build/tools:$PATH"',      # README "Quick start"
            'export PYTHONPATH="$PWD/build/python"',     # docs/python.md "Installing"
        ]
        if any("$DOCTEST_DATASET" in s for s in script):
            prelude.append("conveyor synth --out \"$DOCTEST_DATASET\" --episodes 4 "
                           "--episode-seconds 3 --quiet")
        path = os.path.join(work, "page.sh")
        with open(path, "w") as f:
            f.write("\n".join(prelude) + "\n" + "\n".join(script))
        env = dict(os.environ, DOCTEST_PAGE=page, DOCTEST_TMP=os.path.join(work, "tmp"),
                   DOCTEST_WORK=work, DOCTEST_RUNNER=os.path.abspath(__file__),
                   DOCTEST_DATASET=os.path.join(work, "tmp", "dataset"))
        env.pop("PYTHONPATH", None)
        proc = subprocess.Popen(["/bin/bash", path], cwd=root, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            sys.exit(f"{page}: the page's blocks ran past {TIMEOUT_S} s")
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # anything the page left behind
            except ProcessLookupError:
                pass
        if rc != 0:
            sys.exit(f"{page}: a block failed (exit {rc})")
        print(f"{page}: {runs} blocks ran, {skips} skipped, {flag_checks} flags checked")
    finally:
        if os.environ.get("DOCTEST_KEEP") == "1":
            print(f"doctest: kept {work} (the page's script: {work}/page.sh)", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
