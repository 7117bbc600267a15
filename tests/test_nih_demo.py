from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from xbench_pl import create_datamodule
from xbench_pl.data.errors import DataError
from xbench_pl.data.nih_bbox import NIH_BOX_CLASSES, NIHBoxDataModule, read_box_table
from xbench_pl.data.regions import Box
from xbench_pl.geometry import Preprocess

HEADER = "Image Index,Finding Label,Bbox [x,y,w,h],,,\n"
EVAL = 128


def ready(dm):
    dm.preprocess = Preprocess(resize="squash", size=32)
    dm.setup("test")
    return dm


def write_png(path: Path, size=(64, 48), mode="L"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, 128 if mode == "L" else (128, 128, 128, 255)).save(path)


def mask_box(mask: np.ndarray):
    rows, cols = np.nonzero(mask)
    return rows.min(), rows.max() + 1, cols.min(), cols.max() + 1


# -- the real NIH images and boxes ----------------------------------------------------------------


def test_real_nih_boxes_land_where_the_csv_says(real_cxr):
    folder = real_cxr / "nih_bbox"
    dm = ready(NIHBoxDataModule(root=str(folder), eval_size=EVAL))
    table = read_box_table(folder / "BBox_List_2017.csv")
    assert len(dm.test_set) == 12 and dm.problems == []
    modes = {Image.open(p).mode for p in (folder / "images").glob("*.png")}
    assert "RGBA" in modes  # the reader must cope with NIH's RGBA PNGs
    for i in range(len(dm.test_set)):
        sample = dm.test_set[i]
        row = table[table.image_id == sample["image_id"]].iloc[0]
        x, y, w, h = (float(row[k]) for k in "xywh")
        assert sample["original_size"].tolist() == [1024, 1024]
        assert sample["image"].shape == (3, 32, 32) and sample["image"].std() > 0.1
        cls = NIH_BOX_CLASSES.index({"Infiltrate": "Infiltration"}.get(row.finding, row.finding))
        assert sample["labels"][cls] == 1 and sample["region_class"].tolist() == [cls]
        mask = sample["region_masks"][0].numpy()
        r0, r1, c0, c1 = mask_box(mask)
        assert mask.sum() == (r1 - r0) * (c1 - c0)  # a filled rectangle
        step = 1024 / EVAL  # eval-pixel centres inside the box: within one eval pixel of its edges
        assert abs(c0 * step - x) <= step and abs(c1 * step - (x + w)) <= step
        assert abs(r0 * step - y) <= step and abs(r1 * step - (y + h)) <= step


def test_demo_is_registered_and_batches():
    dm = create_datamodule("demo", preprocess=Preprocess(resize="squash", size=32), eval_size=64)
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    assert batch.images.shape == (4, 3, 32, 32) and batch.classes == list(NIH_BOX_CLASSES)
    assert batch.dataset == "demo" and batch.region_masks.shape[1:] == (64, 64)
    assert len(batch.region_index) == 4  # one boxed finding per demo image
    assert batch.original_size.tolist() == [[512, 512]] * 4  # the synthetic phantoms (xbench_pl.data.synthetic)
    assert batch.patient_ids == ["1", "2", "3", "4"]  # from the demo's Data_Entry Patient ID column


def test_full_real_box_table(real_cxr, tmp_path):
    gz = real_cxr / "tables" / "BBox_List_2017.csv.gz"
    table = read_box_table(gz)
    assert len(table) == 984 and table.image_id.nunique() == 880
    assert table.finding.value_counts().to_dict() == {
        "Atelectasis": 180, "Effusion": 153, "Cardiomegaly": 146, "Infiltrate": 123,
        "Pneumonia": 120, "Pneumothorax": 98, "Mass": 85, "Nodule": 79,
    }
    # the whole table through the datamodule (images: one 1024² stand-in PNG linked under every name)
    (tmp_path / "images").mkdir()
    blank = tmp_path / "blank.png"
    Image.new("L", (1024, 1024)).save(blank)
    for image_id in table.image_id.unique():
        (tmp_path / "images" / image_id).symlink_to(blank)
    (tmp_path / "BBox_List_2017.csv.gz").symlink_to(gz)
    dm = ready(NIHBoxDataModule(root=str(tmp_path)))  # setup also checks every image
    records = dm.test_set.records
    assert dm.problems == []
    assert len(records) == 880 and sum(len(v) for r in records for v in r.regions.values()) == 984
    per_class = {c: sum(len(r.regions.get(c, [])) for r in records) for c in NIH_BOX_CLASSES}
    assert per_class == {"Atelectasis": 180, "Cardiomegaly": 146, "Pleural Effusion": 153, "Infiltration": 123,
                         "Mass": 85, "Nodule": 79, "Pneumonia": 120, "Pneumothorax": 98}
    # with the real Data_Entry, boxed images also carry their other findings
    (tmp_path / "Data_Entry_2017_v2020.csv.gz").symlink_to(real_cxr / "tables" / "Data_Entry_2017_v2020.csv.gz")
    dm = NIHBoxDataModule(root=str(tmp_path), negatives=25, seed=3)
    records = dm.load_records()
    assert dm.problems == [] and len(records) == 905
    boxed, negatives = records[:880], records[880:]
    extra = sum(sum(r.labels.values()) - len(r.regions) for r in boxed)
    assert extra > 100  # many boxed images list more findings than they have boxes for
    assert all(r.labels == {} and r.regions == {} for r in negatives)
    # Data_Entry's Patient ID groups images: the 905 images come from fewer patients, each id its image's prefix
    assert all(r.patient_id == str(int(r.image_id[:8])) for r in records)
    assert len({r.patient_id for r in records}) < len(records)
    assert not {r.image_id for r in negatives} & {r.image_id for r in boxed}
    again = [r.image_id for r in NIHBoxDataModule(root=str(tmp_path), negatives=25, seed=3).load_records()[880:]]
    other = [r.image_id for r in NIHBoxDataModule(root=str(tmp_path), negatives=25, seed=4).load_records()[880:]]
    assert again == [r.image_id for r in negatives] and other != again


# -- layouts, options and bad input (synthetic NIH-format files) ----------------------------------


def write_nih(root: Path, rows: list[str], images: dict[str, str]):
    root.mkdir(parents=True, exist_ok=True)
    (root / "BBox_List_2017.csv").write_text(HEADER + "".join(r + "\n" for r in rows))
    for name, folder in images.items():
        write_png(root / folder / name)


def test_official_images_folders_and_split(tmp_path):
    write_nih(tmp_path, ["a.png,Mass,1,2,10,10", "b.png,Effusion,5,5,20,30"],
              {"a.png": "images_001/images", "b.png": "images_012/images"})
    dm = NIHBoxDataModule(root=str(tmp_path))
    records = {r.image_id: r for r in dm.load_records()}
    assert records["a.png"].path == tmp_path / "images_001/images/a.png"
    assert records["b.png"].labels == {"Pleural Effusion": 1}
    (tmp_path / "split.csv").write_text("image_id\nb.png\n")
    dm = ready(NIHBoxDataModule(root=str(tmp_path), split_file=str(tmp_path / "split.csv")))
    assert [r.image_id for r in dm.test_set.records] == ["b.png"]


@pytest.mark.parametrize(
    "row, reason",
    [
        ("a.png,Mass,1,2,,10", "not numeric"),
        ("a.png,Mass,1,2,nan,10", "not finite"),
        ("a.png,Mass,1,2,-4,10", "non-positive size"),
        ("a.png,Mass,1,2,abc,10", "not numeric"),
        ("a.png,Pneumonitis,1,2,5,10", "Pneumonitis"),
        (",Mass,1,2,5,10", "empty Image Index"),
        ("a.png,Mass,100,2,5,10", "lies outside"),  # found by the setup image check (a.png is 64x48)
        ("zz.png,Mass,1,2,5,10", "image file not found"),
    ],
)
def test_bad_rows_name_file_and_row(tmp_path, row, reason):
    write_nih(tmp_path, ["a.png,Nodule,1,1,4,4", row], {"a.png": "images"})
    with pytest.raises(DataError, match=reason) as error:
        ready(NIHBoxDataModule(root=str(tmp_path)))
    assert "BBox_List_2017.csv, row 3" in str(error.value)
    dm = ready(NIHBoxDataModule(root=str(tmp_path), on_error="skip"))
    (record,) = [r for r in dm.test_set.records if r.image_id == "a.png"]
    assert record.regions["Nodule"] and not record.regions.get("Mass") and len(dm.test_set) == 1
    assert len(dm.problems) == 1 and reason in dm.problems[0].reason and dm.problems[0].action == "skipped"
    assert "row 3" in str(dm.problems[0])


def test_malformed_box_drops_the_box_but_keeps_its_finding_positive(tmp_path):
    write_nih(tmp_path, ["a.png,Nodule,1,1,4,4", "b.png,Mass,1,2,nan,10"], {"a.png": "images", "b.png": "images"})
    dm = ready(NIHBoxDataModule(root=str(tmp_path), on_error="skip"))
    (record,) = [r for r in dm.test_set.records if r.image_id == "b.png"]
    assert record.labels == {"Mass": 1} and not record.regions.get("Mass")
    assert [(p.row, p.action) for p in dm.problems] == [("3", "skipped")] and "keeps the label" in dm.problems[0].reason


def test_boxes_clipped_and_duplicates_dropped_are_counted(tmp_path):
    write_nih(tmp_path, ["a.png,Mass,-5,40,20,20", "a.png,Nodule,1,1,4,4", "a.png,Nodule,1,1,4,4"], {"a.png": "images"})
    dm = ready(NIHBoxDataModule(root=str(tmp_path)))  # corrections, not errors: recorded even when raising
    (record,) = dm.test_set.records
    assert record.regions["Mass"] == [Box(0.0, 40.0, 15.0, 48.0)]
    assert record.regions["Nodule"] == [Box(1.0, 1.0, 5.0, 5.0)]
    assert sorted((p.row, p.action) for p in dm.problems) == [("2", "clipped"), ("4", "deduplicated")]


def test_missing_table_and_columns(tmp_path):
    with pytest.raises(DataError, match="BBox_List_2017.csv: not found under --data.root"):
        NIHBoxDataModule(root=str(tmp_path)).load_records()
    (tmp_path / "BBox_List_2017.csv").write_text("Image Index,Finding Label\na.png,Mass\n")
    with pytest.raises(DataError, match="BBox_List_2017.csv: not an NIH box list"):
        NIHBoxDataModule(root=str(tmp_path)).load_records()


def test_data_entry_unknown_label_and_negatives_without_table(tmp_path):
    write_nih(tmp_path, ["a.png,Mass,1,1,4,4"], {"a.png": "images"})
    with pytest.raises(DataError, match="Data_Entry_2017"):
        NIHBoxDataModule(root=str(tmp_path), negatives=2).load_records()
    (tmp_path / "Data_Entry_2017.csv").write_text("Image Index,Finding Labels\na.png,Mass|Pleural_Thickening|Wheeze\n")
    with pytest.raises(DataError, match=r"Data_Entry_2017.csv, row 2: .*Wheeze"):
        NIHBoxDataModule(root=str(tmp_path)).load_records()
    dm = NIHBoxDataModule(root=str(tmp_path), on_error="skip")
    (record,) = dm.load_records()
    assert record.labels == {"Mass": 1, "Pleural Thickening": 1} and len(dm.problems) == 1
    with pytest.raises(ValueError, match="only 0"):
        NIHBoxDataModule(root=str(tmp_path), negatives=1, on_error="skip").load_records()
