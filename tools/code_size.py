#!/usr/bin/python3
"""Product files and functions over the size goals of issue 42 (no product file over 900 lines,
no function over 150), measured with Universal Ctags' `end` field (a function's last line).

Usage: tools/code_size.py [--functions N] [--files N] [FOLDER...]
Product code: the C++ sources of the library folders, not tests/, bench/ or generated files.
Prints one line per file over --files lines and per function over --functions lines, largest
first; exits 0 (a report, not a check)."""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_PRODUCT = {"tests", "bench", "python", "examples", "deploy", "docs"}


def is_product_folder(name):
    # Every build tree (build, build-package, build-dev, build-fuzz, build-h5, ...) holds
    # generated sources (.pb.cc) that are not ours to size; `./run` and engineers name them build*.
    return not name.startswith((".", "build")) and name not in NOT_PRODUCT


def sources(folders):
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith((".cc", ".h", ".cu")):
                    yield os.path.relpath(os.path.join(dirpath, name), ROOT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--functions", type=int, default=150)
    ap.add_argument("--files", type=int, default=900)
    ap.add_argument("folders", nargs="*")
    args = ap.parse_args()
    folders = args.folders or sorted(
        d for d in os.listdir(ROOT)
        if os.path.isdir(os.path.join(ROOT, d)) and is_product_folder(d))
    files = list(sources(folders))
    big_files = []
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as fh:
            n = sum(1 for _ in fh)
        if n > args.files:
            big_files.append((n, f))
    out = subprocess.run(["ctags", "--output-format=json", "--fields=+ne", "--c++-kinds=f",
                          "--kinds-c++=f", "-o", "-", *files], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    big_functions = []
    for line in out.splitlines():
        tag = json.loads(line)
        if tag.get("kind") != "function" or "end" not in tag:
            continue
        n = tag["end"] - tag["line"] + 1
        if n > args.functions:
            scope = tag.get("scope", "").replace("conveyor::", "")
            name = f"{scope}::{tag['name']}" if scope else tag["name"]
            big_functions.append((n, f"{tag['path']}:{tag['line']}", name))
    print(f"files over {args.files} lines: {len(big_files)}")
    for n, f in sorted(big_files, reverse=True):
        print(f"  {n:6d}  {f}")
    print(f"functions over {args.functions} lines: {len(big_functions)}")
    for n, where, name in sorted(big_functions, reverse=True):
        print(f"  {n:6d}  {name}  ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
