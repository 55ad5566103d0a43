#!/usr/bin/env python3
"""Plots served / offline against --cpu-slots from the `conveyor bench --json` files beside it.

bench/RESULTS.md "8 consumers at 16 threads per stream" has the commands. Usage:
    /usr/bin/python3 bench/cpu_slots/plot.py   # writes bench/cpu_slots/cpu_slots.png
"""
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    series = {}  # (consumers, transport) -> [(slots, ratio)]
    for path in sorted(glob.glob(os.path.join(HERE, "c8_s*_r*.json"))):
        doc = json.load(open(path))
        for row in doc["rows"]:
            if row["stage"] != "serve" or row["unit"] != "samples/s":
                continue
            transport = "gRPC" if row["order"].startswith("gRPC") else "same host"
            series.setdefault(transport, []).append((doc["cpu_slots"], row["ratio"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for (transport, points), marker in zip(sorted(series.items()), "os"):
        xs = [s for s, _ in points]
        ax.scatter(xs, [r for _, r in points], marker=marker, label=transport)
    ax.axhline(0.9, color="black", linewidth=0.8, linestyle="--", label="goal 0.9")
    ax.set_xticks([0, 2, 3, 4])
    ax.set_xticklabels(["none", "2", "3 (default)", "4"])
    ax.set_xlabel("--cpu-slots (2 cores)")
    ax.set_ylabel("8 consumers together / offline pipeline")
    ax.set_ylim(0, 1.2)
    ax.set_title("8 consumers of 16-worker streams on 2 cores")
    ax.legend()
    fig.tight_layout()
    out = os.path.join(HERE, "cpu_slots.png")
    fig.savefig(out, dpi=100)
    print("wrote", out)


if __name__ == "__main__":
    main()
