"""``export --to cheXlocalize`` of a CheXlocalize run, read by CheXlocalize's own pipeline.

``data/chexlocalize_export_reference.json`` holds what their unchanged ``eval.py`` and
``heatmap_to_segmentation.py`` gave on this export (``make_chexlocalize_export_reference.md``): their code
is not in the repo, so the test checks that the export is still the one their code read (its file names)
and that their numbers are the run's own ``--model.cxl true`` numbers.
"""

import json
import pickle
from pathlib import Path

import pytest
from chexlocalize_reference import TASKS

from xbench_pl.commands import main
from xbench_pl.data.vocabulary import canonical
from xbench_pl.external_maps import parse_chexlocalize_name

REFERENCE = json.loads((Path(__file__).parent / "data" / "chexlocalize_export_reference.json").read_text())
# location_prior knows no NIH boxes of some CheXlocalize tasks and says so; the export, not the prior, is tested here
pytestmark = pytest.mark.filterwarnings("ignore:location_prior. no boxes of")

CXL_KEYS = ("cxl_hit_rate", "cxl_miou", "cxl_miou_all")


@pytest.fixture(scope="module")
def exported(real_cxr, tmp_path_factory):
    """A float32 store of ``location_prior`` on their 2-image sample (a squash model: maps over the whole image,
    as theirs), the run's own table and the export's folder."""
    root = tmp_path_factory.mktemp("cxl_export")
    assert main(["test", "--model", "location_prior", "--data", "chexlocalize", "--data.split", "val", "--model.cxl", "true",
                 "--model.bootstrap", "0", "--data.root", str(real_cxr / "chexlocalize"), "--predictions", str(root / "store"),
                 "--predictions_dtype", "float32", "--out", str(root / "run")]) == 0
    assert main(["export", "--predictions", str(root / "store"), "--to", "cheXlocalize", "--out", str(root / "export")]) == 0
    table = json.loads((root / "run" / "metrics.json").read_text())["datasets"]["chexlocalize"]["classes"]
    return {task: [table[canonical(task, "chexlocalize")][k] for k in CXL_KEYS] for task in TASKS}, root / "export"


def close(ours, theirs, tolerance):
    return all((a is None and b is None) or (a is not None and b is not None and abs(a - b) <= tolerance)
               for a, b in zip(ours, theirs))


def test_the_export_names_their_tasks(exported):
    _, folder = exported
    files = sorted(p.name for p in folder.iterdir())
    assert files == REFERENCE["cases"]["float32"]["files"]  # the files their code read
    by_image = {}
    for name in files:  # as their eval.py / heatmap_to_segmentation.py parse them: every task of theirs, for every image
        image_id, task = parse_chexlocalize_name(name)
        by_image.setdefault(image_id, set()).add(task)
    assert all(tasks == set(TASKS) for tasks in by_image.values())  # Airspace Opacity, not Lung Opacity (their KeyError)
    with open(folder / files[0], "rb") as handle:  # the model's native map, which spans the whole image as theirs
        assert pickle.load(handle)["map"].shape == (1, 1, 64, 64)


def test_their_numbers_on_the_export_are_the_runs_own(exported):
    run, _ = exported
    for task in TASKS:
        assert close(run[task], REFERENCE["cases"]["float32"]["run"][task], 1e-12), task  # the run the reference exported
        # native float32 maps: their bilinear resize is the run's full-resolution map, pair for pair
        assert close(run[task], REFERENCE["cases"]["float32"]["means"][task], 1e-9), task
        # a float16 store rounds the maps: their numbers move a little (9.8e-6 at most here; docs/store.md)
        assert close(run[task], REFERENCE["cases"]["float16"]["means"][task], 2e-5), task
