#!/usr/bin/python3
"""Writes the bucket benchmark's clips: a WebDataset folder of distinct videos of mixed shapes.

  /usr/bin/python3 bench/buckets/make_clips.py OUT [--clips N] [--divide D]

OUT/wds/00000.tar (the layout `conveyor` reads, docs/webdataset.md): per key an .mp4 and a caption
.txt. The shapes are those a crawled video set holds: 16:9 landscape at 1280x720 and 1920x1080,
9:16 portrait (phone video) at 720x1280, and 1:1 at 960x960, in the proportions of PLAN. Each clip is
H.264 (libx264, yuv420p, 24 fps, GOP 24 with B-frames, as video2dataset's re-encodes) of 3.5-5 s,
so that one 49-frame clip at 16 fps (3 s) fits in every video and none is padded. Its picture is
ffmpeg's testsrc2 turned to its own hue with its own seeded noise: every clip is distinct, and the
noise gives the encoder real-world bits to spend (about 3 Mbit/s at 720p) where the bare test
pattern would compress to almost nothing. OUT/shapes.txt lists "key width height seconds".
--divide D divides every side by D (rounded to even, as 4:2:0 needs): the quick test's tiny clips
of the same aspects.
"""
import argparse
import io
import os
import subprocess
import tarfile
import tempfile

SHAPES = [(1280, 720), (720, 1280), (960, 960), (1920, 1080)]  # width, height
# 24 clips: 9 at 1280x720, 6 at 720x1280, 5 at 960x960, 4 at 1920x1080, interleaved as a crawl
# would list them.
PLAN = [0, 1, 0, 2, 3, 0, 1, 0, 2, 0, 1, 3, 0, 2, 1, 0, 3, 2, 1, 0, 2, 1, 3, 0]
SECONDS = [3.5, 4.0, 4.5, 5.0]


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--clips", type=int, default=len(PLAN), help="clips to write (the plan repeats)")
    ap.add_argument("--divide", type=int, default=1, help="divide every side by this (the quick test)")
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "wds"), exist_ok=True)
    lines = []
    with tempfile.TemporaryDirectory() as tmp, \
            tarfile.open(os.path.join(args.out, "wds", "00000.tar"), "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(args.clips):
            w, h = (2 * round(side / args.divide / 2) for side in SHAPES[PLAN[i % len(PLAN)]])
            seconds = SECONDS[i % len(SECONDS)]
            key = f"{i:05d}"
            mp4 = os.path.join(tmp, key + ".mp4")
            subprocess.run(
                ["ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin", "-y", "-f", "lavfi",
                 "-i", f"testsrc2=size={w}x{h}:rate=24:duration={seconds}",
                 "-vf", f"hue=h={(37 * i) % 360},noise=alls=4:allf=t:all_seed={i + 1}",
                 "-c:v", "libx264", "-preset", "fast", "-crf", "23", "-pix_fmt", "yuv420p",
                 "-g", "24", "-keyint_min", "24", "-sc_threshold", "0", "-bf", "2",
                 "-movflags", "+faststart", mp4],
                check=True)
            with open(mp4, "rb") as f:
                add(tar, key + ".mp4", f.read())
            orient = "landscape" if w > h else "portrait" if h > w else "square"
            add(tar, key + ".txt", f"A {orient} test pattern at {w}x{h}, clip {i}, hue {(37 * i) % 360}.".encode())
            lines.append(f"{key} {w} {h} {seconds}")
    with open(os.path.join(args.out, "shapes.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
