"""Run CheXlocalize's own evaluation code on seeded maps and write ``chexlocalize_reference.json``.

Run in a scratch environment OUTSIDE the repo (see ``make_chexlocalize_reference.md``)::

    python tests/data/make_chexlocalize_reference.py --cxl PATH/TO/cheXlocalize --python SCRATCH/bin/python \
        --real REAL_CXR/chexlocalize [--out tests/data/chexlocalize_reference.json]

It writes each map as CheXlocalize distributes them (``{cxr_id}_{task}_map.pkl``: a pickled dict
with ``map [1, 1, h, w]``, ``prob``, ``task``, ``gt``, ``cxr_dims (W, H)``), the synthetic ground
truth as their COCO RLE JSON, then runs THEIR scripts unchanged as subprocesses::

    eval.py --metric hitmiss --gt_path GT --pred_path MAPS
    heatmap_to_segmentation.py --map_dir MAPS --output_path SEGS   (Otsu, their default)
    eval.py --metric iou --gt_path GT --pred_path SEGS [--true_pos_only False]

and keeps the per-image CSVs' values: per case, per image, per task ``[hit, iou, iou_all]`` (null =
their NaN). The ``gradcam`` case is their shipped ``sample/gradcam_maps_val`` Grad-CAM maps.
Nothing of theirs is imported here; only pycocotools (for the synthetic RLE) beyond numpy/torch.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chexlocalize_reference import REAL_GRID, SEED, TASKS, make_maps, synthetic_regions  # noqa: E402


def write_pickles(maps: dict, sizes: dict, folder: Path) -> None:
    folder.mkdir(parents=True)
    for image_id, per_task in maps.items():
        height, width = sizes[image_id]
        for task, native in per_task.items():
            info = {"map": native[None, None].clone(), "prob": 0.5, "task": task, "gt": 0, "cxr_dims": (width, height)}
            with open(folder / f"{image_id}_{task}_map.pkl", "wb") as handle:
                pickle.dump(info, handle, protocol=2)


def write_rle(regions: dict, path: Path) -> None:
    from pycocotools import mask as coco

    out = {}
    for image_id, per_task in regions.items():
        out[image_id] = {}
        for task, m in per_task.items():
            rle = coco.encode(np.asfortranarray(m.astype(np.uint8)))
            out[image_id][task] = {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode()}
    path.write_text(json.dumps(out))


def read_rle(path: Path) -> dict:
    from pycocotools import mask as coco

    return {image_id: {task: coco.decode(item).astype(bool) for task, item in per_task.items()}
            for image_id, per_task in json.loads(path.read_text()).items()}


def per_cxr(csv_path: Path) -> dict[str, dict[str, float | None]]:
    with open(csv_path) as handle:
        rows = list(csv.DictReader(handle))
    return {row["img_id"]: {task: (None if row.get(task, "") in ("", "nan") else float(row[task])) for task in TASKS}
            for row in rows}


def run_theirs(cxl: Path, python: str, gt: Path, maps: Path, work: Path) -> dict:
    def call(*args):
        subprocess.run([python, *args], cwd=cxl, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    call("eval.py", "--metric", "hitmiss", "--gt_path", str(gt), "--pred_path", str(maps), "--save_dir", str(work / "hit"))
    call("heatmap_to_segmentation.py", "--map_dir", str(maps), "--output_path", str(work / "segs.json"))
    call("eval.py", "--metric", "iou", "--gt_path", str(gt), "--pred_path", str(work / "segs.json"), "--save_dir", str(work / "iou"))
    call("eval.py", "--metric", "iou", "--gt_path", str(gt), "--pred_path", str(work / "segs.json"),
         "--save_dir", str(work / "iou_all"), "--true_pos_only", "False")
    hit = per_cxr(work / "hit" / "hitmiss_results_per_cxr.csv")
    iou = per_cxr(work / "iou" / "iou_results_per_cxr.csv")
    iou_all = per_cxr(work / "iou_all" / "iou_results_per_cxr.csv")
    return {image_id: {task: [hit[image_id][task], iou[image_id][task], iou_all[image_id][task]] for task in TASKS}
            for image_id in sorted(iou_all)}


def means(pairs: dict) -> dict[str, list[float | None]]:
    """Per task, the NaN-skipping mean of each of hit, iou, iou_all over images (pandas' ``mean``)."""
    out = {}
    for task in TASKS:
        columns = zip(*(pairs[image_id][task] for image_id in pairs))
        out[task] = [None if not [v for v in col if v is not None] else
                     math.fsum(v for v in col if v is not None) / len([v for v in col if v is not None])
                     for col in map(list, columns)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cxl", type=Path, required=True, help="a checkout of rajpurkarlab/cheXlocalize")
    parser.add_argument("--python", default=sys.executable, help="python of the scratch env that runs their code")
    parser.add_argument("--real", type=Path, required=True, help="shared/data/real_cxr/chexlocalize")
    parser.add_argument("--commit", default=None, help="their commit, when --cxl is no git checkout")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("chexlocalize_reference.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cxl_ref_"))
    cases = {}
    try:
        real_gt = args.real / "gt_segmentations_val.json"
        real = read_rle(real_gt)
        sizes = {i: next(iter(t.values())).shape for i, t in real.items()}
        write_pickles(make_maps(real, SEED, REAL_GRID), sizes, work / "real_maps")
        cases["real"] = run_theirs(args.cxl, args.python, real_gt, work / "real_maps", work / "real")

        synthetic = synthetic_regions(SEED)
        write_rle(synthetic, work / "synthetic_gt.json")
        sizes = {i: next(iter(t.values())).shape for i, t in synthetic.items()}
        write_pickles(make_maps(synthetic, SEED), sizes, work / "synthetic_maps")
        cases["synthetic"] = run_theirs(args.cxl, args.python, work / "synthetic_gt.json", work / "synthetic_maps",
                                        work / "synthetic")

        cases["gradcam"] = run_theirs(args.cxl, args.python, args.cxl / "sample" / "gt_segmentations_val.json",
                                      args.cxl / "sample" / "gradcam_maps_val", work / "gradcam")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.cxl, capture_output=True, text=True).stdout.strip()
    versions = subprocess.run([args.python, "-c", "import torch, numpy, cv2, PIL, pandas, pycocotools; print(torch.__version__, "
                               "numpy.__version__, cv2.__version__, PIL.__version__, pandas.__version__)"],
                              capture_output=True, text=True).stdout.split()
    reference = {
        "source": "rajpurkarlab/cheXlocalize eval.py + heatmap_to_segmentation.py (default Otsu), run unchanged",
        "commit": commit or None,
        "versions": dict(zip(("torch", "numpy", "opencv", "pillow", "pandas"), versions)),
        "seed": SEED,
        "values": "per case, image, task: [hit, iou (true_pos_only=True), iou (true_pos_only=False)]; null = NaN",
        "cases": cases,
        "means": {name: means(pairs) for name, pairs in cases.items()},
    }
    args.out.write_text(json.dumps(reference, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
