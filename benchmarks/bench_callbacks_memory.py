"""Peak memory of a run with and without the visual callbacks, on 100 and 400 images.

The callbacks keep per (dataset, finding) only the ``per_finding`` sampled pairs (bounded heaps),
so the peak RSS of a run with them must not grow with the dataset beyond what the run without
them grows. Images: the synthetic demo's 12 boxed phantoms copied under new ids into an NIH-format
folder (``nih_bbox`` reader). Each run is one ``python -m xbench_pl test`` process; its peak RSS
comes from ``wait4``. Prints one row per (images, callbacks).

    python benchmarks/bench_callbacks_memory.py [--sizes 100 400] [--model center]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_dataset(root: Path, images: int) -> Path:
    from xbench_pl.data.synthetic import ensure_demo

    demo = ensure_demo() / "nih"
    boxes = (demo / "BBox_List_2017.csv").read_text().splitlines()
    entries = (demo / "Data_Entry_2017_v2020.csv").read_text().splitlines()
    boxed = sorted({line.split(",")[0] for line in boxes[1:]})
    (root / "images").mkdir(parents=True)
    out_boxes, out_entries = [boxes[0]], [entries[0]]
    for i in range(images):
        source = boxed[i % len(boxed)]
        new = f"copy{i:05d}_{source}"
        shutil.copyfile(demo / "images" / source, root / "images" / new)
        out_boxes += [line.replace(source, new, 1) for line in boxes[1:] if line.startswith(source + ",")]
        out_entries += [line.replace(source, new, 1) for line in entries[1:] if line.startswith(source + ",")]
    (root / "BBox_List_2017.csv").write_text("\n".join(out_boxes) + "\n")
    (root / "Data_Entry_2017_v2020.csv").write_text("\n".join(out_entries) + "\n")
    return root


def peak_rss_mb(command: list[str]) -> tuple[float, float, int]:
    env = {**os.environ, "WANDB_MODE": "offline", "NO_ALBUMENTATIONS_UPDATE": "1"}
    started = time.time()
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(process.stderr.read().decode()[-2000:])
    return usage.ru_maxrss / 1024, time.time() - started, process.returncode  # ru_maxrss is in KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--model", default="center")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            data = make_dataset(Path(tmp) / f"nih{n}", n)
            for callbacks in (False, True):
                out = Path(tmp) / f"out{n}_{int(callbacks)}"
                command = [sys.executable, "-m", "xbench_pl", "test", "--model", args.model, "--data", "nih_bbox",
                           "--data.root", str(data), "--out", str(out)]
                if callbacks:
                    command += ["--config", str(REPO / "callbacks" / "png.yaml")]
                rss, wall, _ = peak_rss_mb(command)
                rows.append((n, callbacks, rss, wall))
                print(f"{n:>6} images  callbacks {'on ' if callbacks else 'off'}  peak RSS {rss:7.0f} MB  wall {wall:6.1f} s", flush=True)
    by = {(n, c): rss for n, c, rss, _ in rows}
    small, large = min(args.sizes), max(args.sizes)
    if small != large:
        print(f"\ngrowth {small} -> {large} images: without callbacks {by[large, False] - by[small, False]:+.0f} MB, "
              f"with {by[large, True] - by[small, True]:+.0f} MB; callbacks' extra at {large}: "
              f"{by[large, True] - by[large, False]:+.0f} MB (at {small}: {by[small, True] - by[small, False]:+.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
