#!/usr/bin/env bash
# Locks the compiler checks: every translation unit of the libraries and tools that uses a mutex
# is compiled by clang with -Wthread-safety -Werror=thread-safety (syntax only; the g++ build
# makes the objects), so a field marked ABSL_GUARDED_BY(mu) read without `mu`, or a function
# marked ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) called without it, fails the suite. The flags and
# include paths are the real build's (compile_commands.json). Also enforced here, by grep: no
# std::mutex or std::condition_variable (libstdc++'s carry no annotations, so the analysis would
# not see them) and no thread started outside base/worker_pool.cc in those directories.
# The directories are every folder of cmake/floors.txt but tests/ (a test may start its own
# threads to race the code it tests), so a new folder is covered from the day it has a floor.
#   thread_safety_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
ROOT="$1"
BUILD="$2"
EXEMPT=(tests)
DIRS=()
while read -r dir; do
  [[ " ${EXEMPT[*]} " == *" $dir "* ]] || DIRS+=("$dir")
done < <(grep -v '^#' "$ROOT/cmake/floors.txt" | tr -s ' \t' '\n' | grep .)
[[ " ${DIRS[*]} " == *" base "* && " ${DIRS[*]} " == *" capi "* ]] ||
  { echo "FAIL: no floors read from $ROOT/cmake/floors.txt (got: ${DIRS[*]})"; exit 1; }
CXX="${CONVEYOR_CLANGXX:-clang++}"
command -v "$CXX" >/dev/null || { echo "FAIL: $CXX not found (tools/setup.sh installs clang)"; exit 1; }
[[ -f "$BUILD/compile_commands.json" ]] || { echo "FAIL: no $BUILD/compile_commands.json"; exit 1; }
fail=0

# 1. The grep rules.
cd "$ROOT"
while IFS= read -r hit; do
  echo "FAIL: $hit: use absl::Mutex/absl::CondVar (annotated) instead"
  fail=1
done < <(grep -rnE 'std::(mutex|shared_mutex|condition_variable|lock_guard|unique_lock)\b' \
           --include='*.cc' --include='*.h' "${DIRS[@]}" || true)
while IFS= read -r hit; do
  [[ "$hit" == base/worker_pool.* ]] && continue
  echo "FAIL: $hit: threads start in base/worker_pool.h (WorkerPool, ParallelFor)"
  fail=1
done < <(grep -rnE 'std::(thread|jthread)\b[^:]|std::async\(' --include='*.cc' --include='*.h' \
           "${DIRS[@]}" | grep -v 'std::thread::' || true)

# 2. The analysis. A control first: a violation must be reported, or the check checks nothing.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/control.cc" <<'CC'
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
struct Counter {
  absl::Mutex mu;
  int n ABSL_GUARDED_BY(mu) = 0;
  void Bump() { ++n; }  // without mu: must be an error
};
int main() { Counter c; c.Bump(); }
CC
# Only the thread-safety analysis: the g++ build reports every other warning.
FLAGS="-fsyntax-only -Wno-everything -Wthread-safety -Werror=thread-safety"
if "$CXX" -std=c++20 $FLAGS "$tmp/control.cc" 2>/dev/null; then
  echo "FAIL: clang accepted an unguarded write: the analysis is not running"
  exit 1
fi

/usr/bin/python3 - "$BUILD/compile_commands.json" "$ROOT" "$tmp/commands" "${DIRS[@]}" <<'PY'
import json, os, re, shlex, sys
db, root, out, dirs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
lines = []
for e in json.load(open(db)):
    # A unity build (CONVEYOR_FAST_BUILD) lists its batch files (Unity/unity_N_cxx.cxx), each
    # including its sources by absolute path: every source is checked on its own, with the
    # batch's command.
    sources = [e["file"]]
    if re.search(r"/Unity/unity_\d+_cxx\.cxx$", e["file"]):
        sources = re.findall(r'^#include "(.+)"$', open(e["file"]).read(), re.M)
    for source in sources:
        f = os.path.relpath(source, root)
        if f.split("/")[0] not in dirs or not f.endswith(".cc"):
            continue
        text = open(os.path.join(root, f), errors="replace").read()
        if not re.search(r"absl::Mutex|ABSL_GUARDED_BY|ABSL_EXCLUSIVE_LOCKS_REQUIRED|WorkerPool", text):
            continue
        args = shlex.split(e["command"])[1:]
        keep, skip = [], False
        for a in args:
            if skip:
                skip = False
                continue
            if a in ("-o", "-c"):
                skip = a == "-o"
                continue
            keep.append(source if a == e["file"] else a)
        lines.append(f + "\t" + e["directory"] + "\t" + shlex.join(keep))
open(out, "w").write("\n".join(lines) + "\n")
PY
n=$(grep -c . "$tmp/commands")
[[ $n -gt 0 ]] || { echo "FAIL: no translation unit selected"; exit 1; }
export CXX tmp FLAGS
check_one() {
  IFS=$'\t' read -r file dir args <<<"$1"
  eval "set -- $args"
  if ! (cd "$dir" && "$CXX" "$@" $FLAGS > "$tmp/$(echo "$file" | tr / _).log" 2>&1); then
    echo "FAIL: $file"
    cat "$tmp/$(echo "$file" | tr / _).log" | head -40
    return 1
  fi
  echo "ok: $file"
}
export -f check_one
if ! tr '\n' '\0' < "$tmp/commands" | xargs -0 -n1 -P "${CONVEYOR_JOBS:-2}" bash -c 'check_one "$0"'; then
  fail=1
fi
if [[ $fail -eq 0 ]]; then
  echo "thread safety: ${DIRS[*]}: $n translation units checked by clang -Wthread-safety; no std::mutex, no thread outside base/worker_pool"
fi
exit $fail
