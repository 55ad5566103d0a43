#!/bin/bash
# deploy/prometheus and deploy/grafana, offline:
#   1. every metric the rules and the dashboard name is one the server exports (a name in
#      server/metrics.cc) or one Prometheus makes (up); the dashboard is valid JSON;
#   2. promtool check config / check rules, and the rules' unit tests (promtool test rules).
# Step 2 is skipped (77) when promtool is missing, after step 1 passed.
set -euo pipefail
SRC=${CONVEYOR_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
/usr/bin/python3 - "$SRC" <<'PY'
import json, pathlib, re, sys
src = pathlib.Path(sys.argv[1])
exported = set(re.findall(r'"(conveyor_[a-z0-9_]+)"', (src / "server/metrics.cc").read_text()))
# Histograms also export _bucket, _sum and _count.
for h in re.findall(r'BuildHistogram\(\)\s*\.Name\("(conveyor_[a-z0-9_]+)"\)',
                    (src / "server/metrics.cc").read_text()):
    exported |= {h + s for s in ("_bucket", "_sum", "_count")}
dash = json.loads((src / "deploy/grafana/conveyor.json").read_text())
exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
rules = "\n".join(l for l in (src / "deploy/prometheus/conveyor_rules.yml").read_text().splitlines()
                  if not l.lstrip().startswith("#"))
exprs += [rules]
recorded = set(re.findall(r"record: (\S+)", rules))
bad = []
for e in exprs:
    for name in re.findall(r"\b(conveyor_[a-z0-9_]+)", e):
        if name not in exported:
            bad.append(name)
    for name in re.findall(r"\b(conveyor:[a-z0-9_:]+)", e):
        if name not in recorded:
            bad.append(name)
if bad:
    sys.exit(f"FAIL: metrics the server does not export: {sorted(set(bad))} "
             f"(server/metrics.cc has {sorted(exported)})")
print(f"{len(exprs) - 1} dashboard expressions and the rules name only exported metrics "
      f"({len(exported)} in server/metrics.cc)")
PY
if ! command -v promtool > /dev/null; then
  echo "SKIP: promtool not found (Debian: apt-get install prometheus; tools/setup.sh installs it)"
  exit 77
fi
cd "$SRC/deploy/prometheus"
promtool check config prometheus.yml
promtool check rules conveyor_rules.yml
promtool test rules conveyor_rules_test.yml
