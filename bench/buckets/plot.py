#!/usr/bin/python3
"""Draws bench/RESULTS.md's bucket plot from bench/buckets/run.sh's JSON (Debian's python3-matplotlib).

  /usr/bin/python3 bench/buckets/plot.py OUT.png bench/buckets/bench_*_r*.json

Left: frames/s of the decode + bucket crop + scale row beside the ffmpeg CLI doing the same on the
same clips, and the CLI decoding them alone; right: clips/s of the shuffled pipeline and the served
rows beside the bucket bound. Per bucket mix (the config) and thread count, bars at the mean of
the rounds, a line from the lowest round to the highest.
"""
import collections
import json
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    out, paths = sys.argv[1], sys.argv[2:]
    # (mix, threads) -> series -> [value per round]
    left = collections.defaultdict(lambda: collections.defaultdict(list))
    right = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in paths:
        doc = json.load(open(path))
        mix = os.path.basename(doc["config"]).removesuffix(".yaml").removeprefix("buckets_") + "²"
        for r in doc["rows"]:
            key = (mix, r["threads"])
            if r["order"] == "bucket crop and scale":
                left[key]["Conveyor: decode, crop, scale"].append(r["value"])
                left[key]["ffmpeg CLI: decode, crop, scale"].append(r["limit"])
                left[key]["ffmpeg CLI: decode only"].append(r["stages"]["cli_decode_only_frames_per_s"])
            elif r["stage"] == "assemble" and r["order"] == "shuffled, naive":
                right[key]["Conveyor: shuffled pipeline"].append(r["value"])
                right[key]["bucket bound (CLI crop+scale rate)"].append(r["limit"])
            elif r["stage"] == "serve" and r["order"] == "gRPC to a client":
                right[key]["served over gRPC"].append(r["value"])
            elif r["stage"] == "serve" and r["order"].startswith("same host"):
                right[key]["served over shared memory"].append(r["value"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, data, unit in ((axes[0], left, "frames/s"), (axes[1], right, "clips/s")):
        keys = sorted(data)
        names = list(dict.fromkeys(n for k in keys for n in data[k]))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            xs, ys, lo, hi = [], [], [], []
            for x, k in enumerate(keys):
                v = data[k].get(name)
                if not v:
                    continue
                mean = sum(v) / len(v)
                xs.append(x - 0.4 + width * (i + 0.5))
                ys.append(mean)
                lo.append(mean - min(v))
                hi.append(max(v) - mean)
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=name)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"{m} px buckets\n{t} thread{'s' if t > 1 else ''}" for m, t in keys])
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    axes[0].set_title("Each frame to its bucket (whole clips, the same clips)")
    axes[1].set_title("One 49-frame clip per video, one bucket per batch")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main()
