#!/usr/bin/python3
"""The chaos soak's checks (bench/soak/soak.sh): reads the soak's work dir, prints PASS/FAIL lines
with figures and a markdown table, writes the figures as JSON. Exit 0: every check passed.

usage: soak_check.py WORK_DIR JSON_OUT
"""
import collections
import glob
import json
import os
import re
import sys

# Flatness slack, per server process: once idle again after the run, its fds and threads may
# exceed what it had when it first became ready by at most this much (gRPC starts a few threads
# and opens a few fds lazily on the first streams; a leak per stream or per reconnect grows
# with the dozens to hundreds of streams a process serves in a soak).
FD_SLACK = 4
THREAD_SLACK = 4

LINE = re.compile(r"^(\d+):(\d+) consumer (\d+)/(\d+) samples (\d+) ids (\S+) sha256 (\S+) \[(.*)\]$")
STATS = re.compile(r"^fetch: (\d+) batches, (\d+) samples in ([\d.]+) s .*?; (\d+) messages, "
                   r"(\d+) reconnects, waited ([\d.]+) s")


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


def main():
    work, json_out = sys.argv[1], sys.argv[2]
    p = {}
    for line in read_lines(os.path.join(work, "params.txt")):
        k, _, v = line.partition("=")
        p[k] = v
    n_cons = int(p["consumers"])
    total_steps = int(p["total_steps"])
    epochs = int(p["epochs"])
    spe = int(p["samples_per_epoch"])
    budget = int(p["budget_bytes"])
    checks = []  # (name, ok, figures)

    # Consumers' exits and --stats.
    cons = []
    for i in range(n_cons):
        rc = p.get(f"consumer_rc.{i}", "none")
        log = read_lines(os.path.join(work, "log", f"fetch.{i}.log"))
        st = None
        for l in log:
            m = STATS.match(l)
            if m:
                st = {"batches": int(m[1]), "samples": int(m[2]), "seconds": float(m[3]),
                      "reconnects": int(m[5]), "waited_s": float(m[6])}
        errors = [l for l in log if "error" in l.lower()]
        cons.append({"consumer": i, "rc": rc, "stats": st, "errors": errors[:3]})
    bad_exit = [c for c in cons if c["rc"] != "0"]
    checks.append(("consumers exit 0", not bad_exit,
                   f"{n_cons - len(bad_exit)}/{n_cons} exited 0" +
                   "".join(f"; consumer {c['consumer']} rc {c['rc']}: {c['errors']}" for c in bad_exit)))

    # (a) each consumer's lines == conveyor batches for its slice.
    a_ok = True
    a_fig = []
    per_epoch = collections.defaultdict(collections.Counter)
    lines_total = 0
    for i in range(n_cons):
        got = read_lines(os.path.join(work, "out", f"consumer.{i}.txt"))
        ref = read_lines(os.path.join(work, "ref", f"consumer.{i}.txt"))
        lines_total += len(got)
        first_diff = next((k for k, (x, y) in enumerate(zip(got, ref)) if x != y), None)
        ok = len(ref) == total_steps and len(got) == len(ref) and first_diff is None
        if not ok:
            a_ok = False
            a_fig.append(f"consumer {i}: {len(got)} lines vs {len(ref)} reference lines (want {total_steps})"
                         + ("" if first_diff is None else
                            f", first difference at line {first_diff + 1}: got {got[first_diff][:90]!r} "
                            f"want {ref[first_diff][:90]!r}"))
        for l in got:
            m = LINE.match(l)
            if not m:
                continue
            for sid in m[8].split():
                per_epoch[int(m[1])][sid] += 1
    checks.append(("(a) batches == conveyor batches", a_ok,
                   f"{lines_total} lines of {n_cons} consumers, {total_steps} each, equal line by line "
                   f"(cursor, ids checksum, sha256 of the tensors, ids)" if a_ok else "; ".join(a_fig)))

    # (b) every sample id exactly once per epoch across the consumers.
    b_bad = []
    for e in range(epochs):
        c = per_epoch.get(e, collections.Counter())
        dups = sum(1 for v in c.values() if v > 1)
        if len(c) != spe or dups:
            b_bad.append(f"epoch {e}: {len(c)} distinct ids of {spe}, {dups} repeated")
    extra = sorted(set(per_epoch) - set(range(epochs)))
    if extra:
        b_bad.append(f"unexpected epochs {extra[:5]}")
    checks.append(("(b) every id once per epoch", not b_bad,
                   f"{epochs} epochs x {spe} ids: each exactly once" if not b_bad else "; ".join(b_bad[:5])))

    # Events.
    events = []
    for l in read_lines(os.path.join(work, "events.tsv")):
        f = l.split("\t")
        events.append({"t_ms": int(f[0]), "event": f[1], "server": f[2], "incarnation": f[3],
                       "pid": f[4], "note": f[5] if len(f) > 5 else ""})
    kills = [e for e in events if e["event"] == "kill"]
    restarts = [e for e in events if e["event"] == "start" and e["incarnation"] != "0"]
    readies = [e for e in events if e["event"] == "ready" and e["incarnation"] != "0"]
    start_failed = [e for e in events if e["event"] == "start_failed"]
    stall_kills = [e for e in kills if "stalled" in e["note"]]

    # (c) memory budget; fds and threads flat.
    samples = collections.defaultdict(list)
    for l in read_lines(os.path.join(work, "samples.tsv")):
        t, k, inc, pid, rss, fds, thr, phase = l.split("\t")
        samples[(int(k), int(inc))].append((int(t), int(rss) * 1024, int(fds), int(thr), phase))
    streams = {}
    for path in glob.glob(os.path.join(work, "log", "serve.*.*.log")):
        _, k, inc, _ = os.path.basename(path).split(".")
        txt = read_lines(path)
        streams[(int(k), int(inc))] = {
            "streams_ended": sum(1 for l in txt if " stream job=" in l and " ended: " in l),
            "ended_not_ok": sum(1 for l in txt if " stream job=" in l and " ended: " in l and " ended: OK" not in l),
        }
    incs = []
    rss_peak = 0
    flat_bad = []
    for key in sorted(samples):
        s = samples[key]
        run = [x for x in s if x[4] == "run"]
        ready = next((x for x in s if x[4] == "ready"), None)
        idle = next((x for x in s if x[4] == "idle_end"), None)
        third = max(1, len(run) // 3)
        first, last = run[:third], run[-third:]
        d = {
            "server": key[0], "incarnation": key[1], "samples": len(s),
            "rss_peak_bytes": max(x[1] for x in s),
            "fds_ready": ready[2] if ready else None, "threads_ready": ready[3] if ready else None,
            "fds_idle_end": idle[2] if idle else None, "threads_idle_end": idle[3] if idle else None,
            "rss_idle_end_bytes": idle[1] if idle else None,
            "fds_max": max(x[2] for x in s), "threads_max": max(x[3] for x in s),
            "fds_max_first_third": max((x[2] for x in first), default=None),
            "fds_max_last_third": max((x[2] for x in last), default=None),
            "threads_max_first_third": max((x[3] for x in first), default=None),
            "threads_max_last_third": max((x[3] for x in last), default=None),
            "killed": any(e["server"] == str(key[0]) and e["incarnation"] == str(key[1]) for e in kills),
        }
        d.update(streams.get(key, {}))
        rss_peak = max(rss_peak, d["rss_peak_bytes"])
        if idle and ready:
            if idle[2] > ready[2] + FD_SLACK or idle[3] > ready[3] + THREAD_SLACK:
                flat_bad.append(f"server {key[0]}.{key[1]}: fds {ready[2]} -> {idle[2]}, threads "
                                f"{ready[3]} -> {idle[3]} after {d.get('streams_ended', '?')} streams")
        incs.append(d)
    over = [d for d in incs if d["rss_peak_bytes"] > budget]
    checks.append(("(c) RSS within budget", not over and bool(incs),
                   f"peak {rss_peak / 2**20:.1f} MiB of {budget / 2**20:.0f} MiB over {len(incs)} processes" +
                   "".join(f"; server {d['server']}.{d['incarnation']} {d['rss_peak_bytes'] / 2**20:.1f} MiB"
                           for d in over)))
    checked = [d for d in incs if d["fds_idle_end"] is not None and d["fds_ready"] is not None]
    checks.append(("(c) fds and threads flat", not flat_bad and bool(checked),
                   (f"{len(checked)} live processes idle at the end, after "
                    f"{sum(d.get('streams_ended', 0) for d in checked)} streams: fds "
                    + ", ".join(f"{d['fds_ready']}->{d['fds_idle_end']}" for d in checked)
                    + "; threads " + ", ".join(f"{d['threads_ready']}->{d['threads_idle_end']}" for d in checked)
                    + f" (ready -> idle at end, slack {FD_SLACK} fds / {THREAD_SLACK} threads)")
                   if not flat_bad else "; ".join(flat_bad)))
    reconnects = sum(c["stats"]["reconnects"] for c in cons if c["stats"])
    d_ok = len(kills) >= 1 and len(readies) == len(kills) and not start_failed and bool(stall_kills)
    checks.append(("(d) chaos: kills, restarts, reconnects", d_ok,
                   f"{len(kills)} SIGKILLs ({len(stall_kills)} of the stalled consumer's server), "
                   f"{len(readies)} restarts on the same port ready, {len(start_failed)} failed starts, "
                   f"{reconnects} consumer reconnects"))

    ok = all(c[1] for c in checks)
    for name, good, fig in checks:
        print(f"{'PASS' if good else 'FAIL'}: {name}: {fig}")
    out = {
        "params": p,
        "pass": ok,
        "checks": [{"check": n, "pass": g, "figures": f} for n, g, f in checks],
        "kills": len(kills), "stall_kills": len(stall_kills), "restarts": len(readies),
        "start_failed": len(start_failed), "reconnects": reconnects,
        "rss_peak_bytes": rss_peak, "budget_bytes": budget,
        "consumers": cons, "servers": incs, "events": events,
    }
    os.makedirs(os.path.dirname(os.path.abspath(json_out)), exist_ok=True)
    with open(json_out, "w") as f:
        json.dump(out, f, indent=1)
    print()
    print("| check | result | figures |")
    print("|---|---|---|")
    for name, good, fig in checks:
        print(f"| {name} | {'PASS' if good else 'FAIL'} | {fig} |")
    print()
    print("| server.incarnation | killed | streams ended | RSS peak MiB | fds ready / max / idle end | threads ready / max / idle end |")
    print("|---|---|---|---|---|---|")
    for d in incs:
        print(f"| {d['server']}.{d['incarnation']} | {'yes' if d['killed'] else 'no'} | "
              f"{d.get('streams_ended', '?')} | {d['rss_peak_bytes'] / 2**20:.1f} | "
              f"{d['fds_ready']} / {d['fds_max']} / {d['fds_idle_end'] if d['fds_idle_end'] is not None else '-'} | "
              f"{d['threads_ready']} / {d['threads_max']} / {d['threads_idle_end'] if d['threads_idle_end'] is not None else '-'} |")
    print(f"\nsoak: {'PASS' if ok else 'FAIL'} (figures in {json_out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
