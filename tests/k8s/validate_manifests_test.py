#!/usr/bin/python3
"""tests/k8s: deploy/k8s's manifests pass validate_manifests.py, and the validator fails on each
broken fixture in tests/k8s/fixtures with the findings its header names:

    # expect-errors: N        how many ERROR lines (0: the fixture must pass)
    # expect: TEXT            a text one of them contains (one line per expected finding)

Skipped (77) without Debian's python3-kubernetes.
"""
import concurrent.futures
import contextlib
import glob
import importlib.util
import io
import os
import re
import subprocess
import sys

try:
    import kubernetes  # noqa: F401
except ImportError:
    print("SKIP: python3-kubernetes is not installed (Debian: apt-get install python3-kubernetes; "
          "tools/setup.sh installs it)")
    sys.exit(77)

SRC = os.environ.get("CONVEYOR_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
VALIDATOR = os.path.join(SRC, "tests/k8s/validate_manifests.py")


def run(files):
    """The validator as a user runs it: a process of its own."""
    r = subprocess.run([sys.executable, VALIDATOR, *files], cwd=SRC, capture_output=True, text=True,
                       timeout=60)
    return r.returncode, r.stdout + r.stderr


_module = None


def run_in_process(files):
    """The same main(), loaded once: importing the client's ~700 models costs a process 0.5-1 s."""
    global _module
    if _module is None:
        spec = importlib.util.spec_from_file_location("validate_manifests", VALIDATOR)
        _module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_module)
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(SRC)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = _module.main(files)
    finally:
        os.chdir(cwd)
    return rc, out.getvalue()


def check_fixture(path, run=run_in_process):
    text = open(path).read()
    m = re.search(r"^# expect-errors: (\d+)$", text, re.M)
    if not m:
        return [f"{path}: no '# expect-errors: N' line"]
    want = int(m.group(1))
    expects = re.findall(r"^# expect: (.+)$", text, re.M)
    rc, out = run([os.path.relpath(path, SRC)])
    errors = [l for l in out.splitlines() if l.startswith("ERROR ")]
    problems = []
    if rc != (1 if want else 0):
        problems.append(f"exit {rc}, expected {1 if want else 0}")
    if len(errors) != want:
        problems.append(f"{len(errors)} findings, expected {want}")
    for e in expects:
        if not any(e in l for l in errors):
            problems.append(f"no finding contains: {e}")
    return [f"{os.path.relpath(path, SRC)}: {p}" for p in problems] + \
        ([f"  validator output:\n{out}"] if problems else [])


def main():
    manifests = sorted(glob.glob(os.path.join(SRC, "deploy/k8s/*.yaml")))
    fixtures = sorted(glob.glob(os.path.join(SRC, "tests/k8s/fixtures/*.yaml")))
    failures = []
    # The real manifests and one broken fixture as separate processes (their exit status), the
    # other fixtures in this process, meanwhile.
    first_broken = next(p for p in fixtures if "expect-errors: 0" not in open(p).read())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        real = pool.submit(run, [os.path.relpath(p, SRC) for p in manifests])
        broken = pool.submit(check_fixture, first_broken, run)
        results = {p: check_fixture(p) for p in fixtures if p != first_broken}
        results[first_broken] = broken.result()
        rc, out = real.result()
    print(out, end="")
    if rc != 0 or "all documents valid" not in out or not manifests:
        failures.append(f"deploy/k8s: the validator exited {rc} on {len(manifests)} manifests")
    broken = 0
    for path, problems in results.items():
        name = os.path.relpath(path, SRC)
        if problems:
            failures += problems
        else:
            want = re.search(r"^# expect-errors: (\d+)$", open(path).read(), re.M).group(1)
            broken += want != "0"
            print(f"ok: {name}: " + ("passes" if want == "0" else f"fails with its {want} expected finding(s)"))
    if failures:
        print("FAIL:\n" + "\n".join(failures))
        return 1
    print(f"validate_manifests_test: deploy/k8s valid; {broken} broken fixtures fail as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
