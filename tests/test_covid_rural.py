import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from xbench_pl import create_datamodule
from xbench_pl.data.covid_rural import COVIDRuralDataModule
from xbench_pl.data.errors import DataError
from xbench_pl.geometry import Preprocess

H, W = 40, 50
STEMS = ("COVID-19-AR-16406513_01-16-1900-XR", "COVID-19-AR-16406514_02-03-1900-XR", "COVID-19-AR-16406515_03-04-1900-XR")


def ready(dm, eval_size=W):
    dm.preprocess, dm.eval_size = Preprocess(resize="squash", size=32), eval_size
    dm.setup("test")
    return dm


def labelme(shapes, image: Image.Image) -> dict:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG")
    return {"version": "4.5.6", "flags": {}, "shapes": [
        {"label": label, "points": points, "group_id": None, "shape_type": "polygon", "flags": {}} for label, points in shapes],
        "imagePath": "../x.jpg", "imageData": base64.b64encode(buffer.getvalue()).decode(), "imageHeight": H, "imageWidth": W}


def write_covid(root: Path, masks: dict, shapes: dict) -> Path:
    """masks: stem -> [H, W] array (None: no mask file); shapes: stem -> LabelMe shapes."""
    (root / "jpgs" / "jsons").mkdir(parents=True)
    (root / "pngs_masks").mkdir()
    rgb = np.zeros((H, W, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 200, 100, 50  # 3-channel, as the real JPEGs
    for stem in STEMS:
        image = Image.fromarray(rgb)
        image.save(root / "jpgs" / f"{stem}.jpg")
        (root / "jpgs" / "jsons" / f"{stem}.json").write_text(json.dumps(labelme(shapes.get(stem, []), image)))
        if masks.get(stem) is not None:
            Image.fromarray(masks[stem].astype(np.uint8)).save(root / "pngs_masks" / f"{stem}.png")
    return root


LUNGS = [("left_lung", [[2, 2], [20, 2], [20, 38], [2, 38]]), ("right_lung", [[28, 2], [48, 2], [48, 38], [28, 38]])]


def opacity_mask():
    mask = np.zeros((H, W), np.uint8)
    mask[10:20, 5:15] = 1
    return mask


def test_masks_are_the_default_and_only_annotated_images_count(tmp_path):
    write_covid(tmp_path, {STEMS[0]: opacity_mask(), STEMS[1]: np.zeros((H, W))}, {})  # STEMS[2]: no mask
    dm = ready(create_datamodule("covid_rural", root=str(tmp_path)))
    assert dm.classes == ["COVID-19 Opacity"] and dm.problems == []
    assert [r.image_id for r in dm.test_set.records] == [STEMS[0]]  # empty and absent masks: no ground truth
    sample = dm.test_set[0]
    assert sample["labels"].tolist() == [1.0] and sample["original_size"].tolist() == [H, W]
    expected = np.zeros((W, W), bool)
    expected[12:25, 5:15] = True  # eval-pixel centres (0.8 px apart vertically, 1 px across) in rows 10-19, cols 5-14
    assert (sample["region_masks"][0].numpy() == expected).all()
    grey = 0.299 * 200 + 0.587 * 100 + 0.114 * 50  # the 3-channel JPEG read as luminance
    assert abs(dm.test_set.images(dm.test_set.records[0].path)[0].mean() * 255 - grey) < 2


def test_polygons_skip_lungs_and_match_masks(tmp_path):
    square = [[5, 10], [14, 10], [14, 19], [5, 19]]
    write_covid(tmp_path, {STEMS[0]: opacity_mask()},
                {STEMS[0]: LUNGS + [("groud_glass_opacity", square)], STEMS[1]: LUNGS})
    dm = ready(COVIDRuralDataModule(root=str(tmp_path), regions="polygons"))
    assert dm.problems == [] and [r.image_id for r in dm.test_set.records] == [STEMS[0]]  # STEMS[1]: lungs only
    masks = ready(COVIDRuralDataModule(root=str(tmp_path)))
    assert (dm.test_set[0]["region_masks"] == masks.test_set[0]["region_masks"]).all()


@pytest.mark.parametrize(
    "shape, reason",
    [
        (("consolidation_blob", [[1, 1], [5, 1], [5, 5]]), "consolidation_blob"),
        (("groud_glass_opacity", [[1, 1]]), "at least 2"),
        (("groud_glass_opacity", [[1, 1], [5, "x"], [5, 5]]), "not a pair of numbers"),
        (("groud_glass_opacity", [[1, 1], [float("nan"), 1], [5, 5]]), "non-finite"),
    ],
)
def test_bad_shapes_name_file_and_shape(tmp_path, shape, reason):
    good = ("groud_glass_opacity", [[5, 10], [14, 10], [14, 19]])
    write_covid(tmp_path, {}, {STEMS[0]: [good, shape]})
    with pytest.raises(DataError, match=rf"{STEMS[0]}.json, row shape 2: .*{reason}"):
        COVIDRuralDataModule(root=str(tmp_path), regions="polygons").load_records()
    dm = COVIDRuralDataModule(root=str(tmp_path), regions="polygons", on_error="skip")
    (record,) = dm.load_records()
    assert len(record.regions["COVID-19 Opacity"]) == 1 and len(dm.problems) == 1


def test_bad_files(tmp_path):
    write_covid(tmp_path, {STEMS[0]: opacity_mask(), STEMS[1]: opacity_mask()[:-1]}, {})
    (tmp_path / "pngs_masks" / f"{STEMS[2]}.png").write_bytes(b"not a png")
    (tmp_path / "jpgs" / "jsons" / f"{STEMS[1]}.json").write_text('{"version": "4.5.6"}')
    with pytest.raises(DataError, match="cannot decode mask"):
        COVIDRuralDataModule(root=str(tmp_path)).load_records()
    dm = ready(COVIDRuralDataModule(root=str(tmp_path), on_error="skip"))
    assert [r.image_id for r in dm.test_set.records] == [STEMS[0], STEMS[1]]
    assert not dm.test_set.records[1].regions["COVID-19 Opacity"]  # its mask is one row short of the JPEG
    assert sorted(p.reason.split(" ")[0] for p in dm.problems) == ["COVID-19", "cannot"]
    polygons = COVIDRuralDataModule(root=str(tmp_path), regions="polygons", on_error="skip")
    assert polygons.load_records() == [] and "no 'shapes' list" in polygons.problems[0].reason
    with pytest.raises(DataError, match=r"--data.root: .*elsewhere: no such folder \(give covid_rural's folder"):
        COVIDRuralDataModule(root=str(tmp_path / "elsewhere")).load_records()
