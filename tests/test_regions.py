import numpy as np
import pytest

from xbench_pl.data.annotations import ImageIndex, checked_box, find_one, parse_box, parse_polygon
from xbench_pl.data.base import Record, XBenchData
from xbench_pl.data.errors import DataError
from xbench_pl.data.regions import Box, Mask, Polygon, rasterize_union


def test_box_is_half_open_and_sampled_at_eval_pixel_centres():
    one = Box(1, 1, 2, 2).rasterize(4, 4, 4)
    assert np.argwhere(one).tolist() == [[1, 1]]
    # 8x8 grid over a 4x4 image: eval pixel j has its centre at (j + 0.5) / 2
    assert np.argwhere(Box(1, 1, 2, 2).rasterize(4, 4, 8)).tolist() == [[2, 2], [2, 3], [3, 2], [3, 3]]
    # non-square image: the eval grid stretches each axis on its own (H = 2 rows, W = 4 columns)
    wide = Box(0, 0, 2, 1).rasterize(2, 4, 4)
    assert wide.tolist() == [[True, True, False, False]] * 2 + [[False] * 4] * 2
    # a box narrower than an eval pixel that misses every centre is empty on the grid (at setup,
    # fit_regions reports and drops such a region: see test_regions_empty_on_the_grid_are_reported)
    assert not Box(0.6, 0.6, 0.9, 0.9).rasterize(4, 4, 4).any()


def test_polygon_fill_includes_the_outline_like_pil():
    square = Polygon(((1, 1), (3, 1), (3, 3), (1, 3)))
    expected = np.zeros((5, 5), bool)
    expected[1:4, 1:4] = True  # vertices at pixel indices 1 and 3: pixels 1..3 filled
    assert (square.rasterize(5, 5, 5) == expected).all()


def test_mask_sampling_and_union():
    array = np.zeros((4, 6), bool)
    array[0, 0] = array[3, 5] = True
    assert np.argwhere(Mask(array).rasterize(4, 6, 2)).tolist() == []  # centres at rows 1,3 / cols 1.5->1, 4.5->4
    assert np.argwhere(Mask(array).rasterize(4, 6, 4)).tolist() == [[0, 0], [3, 3]]
    with pytest.raises(ValueError, match="mask shape"):
        Mask(array).rasterize(6, 4, 4)
    union = rasterize_union([Box(0, 0, 1, 1), Box(3, 3, 4, 4)], 4, 4, 4)
    assert np.argwhere(union).tolist() == [[0, 0], [3, 3]]


@pytest.mark.parametrize(
    "values, convention, box",
    [
        (("1", "2", "3", "4"), "xywh", Box(1, 2, 4, 6)),
        ((1, 2, 3, 4), "xyxy", Box(1, 2, 3, 4)),
        ((1, 2, 3, 4), "xyxy_inclusive", Box(1, 2, 4, 5)),
        ((5, 5, 5, 5), "xyxy_inclusive", Box(5, 5, 6, 6)),
    ],
)
def test_box_conventions(values, convention, box):
    assert parse_box(values, convention) == box


@pytest.mark.parametrize(
    "values, convention, reason",
    [
        (("1", "2", "", "4"), "xywh", "not numeric"),
        (("1", "2", "nan", "4"), "xywh", "not finite"),
        ((1, 2, 0, 4), "xywh", "non-positive size"),
        ((3, 2, 1, 4), "xyxy", "non-positive size"),
        ((1, 2, 3), "xyxy", "4 values"),
    ],
)
def test_malformed_boxes(values, convention, reason):
    with pytest.raises(ValueError, match=reason):
        parse_box(values, convention)


def test_clipping_and_polygons():
    assert checked_box(-2, 1, 5, 12, 10, 4) == (Box(0, 1, 4, 10), True)
    assert checked_box(0, 0, 4, 10, 10, 4) == (Box(0, 0, 4, 10), False)
    with pytest.raises(ValueError, match="outside"):
        checked_box(5, 1, 7, 2, 10, 4)
    assert parse_polygon([[1, 2], [3.5, 4]]) == Polygon(((1.0, 2.0), (3.5, 4.0)))
    for bad in ([[1, 2]], [[1, 2], [3]], "x", [[1, 2], [float("inf"), 1]]):
        with pytest.raises(ValueError, match="polygon"):
            parse_polygon(bad)


def test_image_index(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same.png").write_bytes(b"")
    (tmp_path / "a" / "only.png").write_bytes(b"")
    index = ImageIndex(tmp_path, "**/*.png")
    assert index.get("only.png") == tmp_path / "a" / "only.png"
    assert index.get("gone.png", default=tmp_path / "images") == tmp_path / "images" / "gone.png"
    with pytest.raises(DataError, match="ambiguous"):
        index.get("same.png")
    assert ImageIndex(tmp_path, "**/*.png", key=lambda p: p.parent.name + p.stem).get("bsame") == tmp_path / "b" / "same.png"



def test_find_one_prefers_earlier_patterns_and_names_ambiguity(tmp_path):
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "table.csv.gz").write_bytes(b"")
    (tmp_path / "deep" / "er" / "table_v2.csv").write_bytes(b"")
    assert find_one(tmp_path, ("table_v2.csv*", "table.csv*")) == tmp_path / "deep" / "er" / "table_v2.csv"
    assert find_one(tmp_path, ("other.csv", "table.csv*")) == tmp_path / "deep" / "table.csv.gz"
    assert find_one(tmp_path, ("other.csv",), required=False) is None
    with pytest.raises(DataError, match=r"other.csv: not found under .*\['other.csv'\]"):
        find_one(tmp_path, ("other.csv",))
    (tmp_path / "table.csv").write_bytes(b"")
    with pytest.raises(DataError, match="table.csv\\* is ambiguous"):
        find_one(tmp_path, ("table.csv*",))

@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_regions_empty_on_the_grid_are_reported(on_error):
    # 96 x 128 image on an 8 x 8 eval grid: an eval pixel spans 16 x 12 original pixels
    dm = XBenchData(eval_size=8, on_error=on_error)
    one_pixel = np.zeros((96, 128), bool)
    one_pixel[1, 1] = True
    regions = {
        "Mass": [Box(1, 1, 3, 3), Box(0, 0, 20, 20)],  # too small / covers the centre (8, 6)
        "Nodule": [Polygon(((1, 1), (2, 1), (2, 2)))],  # too small
        "Effusion": [Polygon(((-40, 10), (60, 10), (60, 60))), Polygon(((200, 20), (220, 20), (220, 40)))],  # cut / outside
        "Edema": [Mask(one_pixel)],  # too small
    }
    record = Record("a", None, {}, regions={k: list(v) for k, v in regions.items()})
    for finding, found in regions.items():
        record.region_sources[finding] = [("ann.csv", row) for row in range(len(found))]
    dm.fit_regions(record, 96, 128)
    assert record.regions == {"Mass": [Box(0, 0, 20, 20)], "Nodule": [], "Effusion": [regions["Effusion"][0]], "Edema": []}
    problems = {(p.reason.split()[0], p.row, p.action): p.reason for p in dm.problems}
    assert set(problems) == {("Mass", "0", "empty_on_grid"), ("Nodule", "0", "empty_on_grid"), ("Edema", "0", "empty_on_grid"),
                             ("Effusion", "0", "clipped"), ("Effusion", "1", "empty_on_grid")}
    for key in [("Mass", "0", "empty_on_grid"), ("Nodule", "0", "empty_on_grid"), ("Edema", "0", "empty_on_grid")]:
        assert "smaller than one pixel of the 8x8 eval grid" in problems[key] and "--data.eval_size" in problems[key]
    assert "covers no pixel of the 128x96 image" in problems[("Effusion", "1", "empty_on_grid")]
    assert "1 point(s) outside (first: (-40, 10))" in problems[("Effusion", "0", "clipped")]
    # a finer grid keeps the small ones
    fine = XBenchData(eval_size=128)
    record = Record("a", None, {}, regions={"Mass": [Box(1, 1, 3, 3)], "Edema": [Mask(one_pixel)]})
    fine.fit_regions(record, 96, 128)
    assert len(record.regions["Mass"]) == len(record.regions["Edema"]) == 1 and fine.problems == []
