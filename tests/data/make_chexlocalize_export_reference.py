"""Run CheXlocalize's own evaluation code on our ``export --to cheXlocalize`` and write
``chexlocalize_export_reference.json`` (see ``make_chexlocalize_export_reference.md``).

Per case (the store's dtype): ``test --model location_prior`` on the real CheXlocalize sample with
``--model.cxl true`` and a prediction store, ``export --to cheXlocalize`` of the store, then THEIR scripts
unchanged on the export (``make_chexlocalize_reference.run_theirs``: ``eval.py --metric hitmiss``,
``heatmap_to_segmentation.py``, ``eval.py --metric iou`` with ``--true_pos_only`` True and False).
Keeps their per-pair values and per-task means, and the run's own ``cxl_*`` means beside them.

    python tests/data/make_chexlocalize_export_reference.py --cxl PATH/TO/cheXlocalize --python SCRATCH/bin/python \
        --real REAL_CXR/chexlocalize [--out tests/data/chexlocalize_export_reference.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests"))
from make_chexlocalize_reference import means, run_theirs  # noqa: E402

from chexlocalize_reference import TASKS  # noqa: E402

#: the run exported: a squash model (its map spans the whole image, as CheXlocalize's own), on their 2-image sample
RUN = ["--model", "location_prior", "--data", "chexlocalize", "--data.split", "val", "--model.cxl", "true",
       "--model.bootstrap", "0"]
CASES = ("float32", "float16")
CXL_KEYS = ("cxl_hit_rate", "cxl_miou", "cxl_miou_all")


def xbench(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "xbench_pl", *args], cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


def run_means(metrics_json: Path) -> dict[str, list[float | None]]:
    """The run's own ``[cxl_hit_rate, cxl_miou, cxl_miou_all]`` per task, by their task names."""
    from xbench_pl.data.vocabulary import canonical

    classes = json.loads(metrics_json.read_text())["datasets"]["chexlocalize"]["classes"]
    return {task: [classes[canonical(task, "chexlocalize")][k] for k in CXL_KEYS] for task in TASKS}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cxl", type=Path, required=True, help="a checkout of rajpurkarlab/cheXlocalize")
    parser.add_argument("--python", required=True, help="python of the scratch env that runs their code")
    parser.add_argument("--real", type=Path, required=True, help="shared/data/real_cxr/chexlocalize")
    parser.add_argument("--commit", default=None, help="their commit, when --cxl is no git checkout")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("chexlocalize_export_reference.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cxl_export_"))
    cases = {}
    try:
        for dtype in CASES:
            folder = work / dtype
            xbench("test", *RUN, "--data.root", str(args.real), "--predictions", str(folder / "store"),
                   "--predictions_dtype", dtype, "--out", str(folder / "run"))
            xbench("export", "--predictions", str(folder / "store"), "--to", "cheXlocalize", "--out", str(folder / "export"))
            pairs = run_theirs(args.cxl, args.python, args.real / "gt_segmentations_val.json", folder / "export", folder)
            cases[dtype] = {"theirs": pairs, "means": means(pairs), "run": run_means(folder / "run" / "metrics.json"),
                            "files": sorted(p.name for p in (folder / "export").iterdir())}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.cxl, capture_output=True, text=True).stdout.strip()
    reference = {
        "source": "rajpurkarlab/cheXlocalize eval.py + heatmap_to_segmentation.py (default Otsu), run unchanged "
                  "on export --to cheXlocalize of the run below",
        "commit": commit or None,
        "run": ["test", *RUN, "--data.root", "REAL_CXR/chexlocalize", "--predictions", "STORE", "--predictions_dtype", "DTYPE"],
        "values": "per case (store dtype): theirs (image, task: [hit, iou, iou_all]; null = NaN), their means per task "
                  "and the run's own [cxl_hit_rate, cxl_miou, cxl_miou_all] per task",
        "cases": cases,
    }
    args.out.write_text(json.dumps(reference, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
