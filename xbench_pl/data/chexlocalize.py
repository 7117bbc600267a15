"""CheXlocalize (Stanford AIMI): radiologist segmentations of 10 findings on CheXpert val/test.

Layout as downloaded (files are found anywhere under ``root``)::

    root/CheXpert/{val,test}/patient<N>/study<M>/view<K>_<frontal|lateral>.jpg    native size, 8-bit
    root/CheXpert/{val,test}_labels.csv       CheXpert labels (the original ``valid.csv`` also works)
    root/CheXlocalize/gt_segmentations_{val,test}.json   {cxr_id: {task: {"size": [H, W], "counts": COCO RLE}}}
    root/CheXlocalize/gt_annotations_{val,test}.json     {cxr_id: {"img_size": [H, W], task: [[[x, y], ...], ...]}}

The cxr id joins an image path's last three parts with ``_``:
``patient64541/study1/view1_frontal.jpg`` -> ``patient64541_study1_view1_frontal``.

Classes: the 10 localisation tasks of CheXlocalize (``eval_constants.LOCALIZATION_TASKS``):
Enlarged Cardiomediastinum, Cardiomegaly, Lung Lesion, Airspace Opacity (-> Lung Opacity; the
CSV spells it ``Lung Opacity``), Edema, Consolidation, Atelectasis, Pneumothorax, Pleural
Effusion, Support Devices. XBench reports 13 classes for CheXlocalize; only these 10 have
segmentations (the other CheXpert labels have none), so the 13 cannot be reproduced.

Labels (recognition ground truth) come from the CheXpert label CSV (0/1 per task); regions
from ``regions="segmentations"`` (default: the COCO RLE masks the official ``eval.py`` scores
against; column-major, decoded here) or ``regions="annotations"`` (the radiologists' polygons,
``[x, y]`` float points, filled as PIL ``polygon(outline=1, fill=1)``, which is how the masks
were made from them: the two agree pixel for pixel). ``img_size`` / ``size`` are ``[H, W]``.

Default evaluation split: ``test``: every image of ``test_labels.csv``, **668 images (500
patients)**; ``split="val"``: 234 images (200 patients, 187 of them annotated). Lateral views
are included, as in CheXlocalize.

Bad input: a missing file or label column is a ``DataError``; a label that is not 0/1, an
unknown task, a malformed mask (runs that do not tile ``size``) or polygon, a region for a
task the CSV labels 0, an annotated cxr id absent from the CSV, or an image listed twice
with different labels is an error naming the file and row (CSV line, or ``cxr_id / task``
for the JSONs), or a counted skip with ``on_error='skip'``. An exact duplicate CSV row is
dropped and recorded. ``img_size`` is not read: masks are checked against the decoded image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from xbench_pl.data.annotations import ImageIndex, RLEMask, find_one, parse_polygon, read_json
from xbench_pl.data.base import Record, XBenchData
from xbench_pl.data.errors import DataError
from xbench_pl.data.groups import metadata_groups
from xbench_pl.data.io import drop_duplicate_rows, read_table
from xbench_pl.data.regions import Region
from xbench_pl.data.vocabulary import canonical, dataset_classes
from xbench_pl.registry import lightning_datamodules

LABEL_FILES = {"test": ("test_labels.csv",), "val": ("val_labels.csv", "valid.csv")}
#: optional CSV columns of the record's subgroups (``xbench_pl.data.groups``): sex, age, view (empty for laterals)
GROUP_COLUMNS = ("Sex", "Age", "AP/PA")
RegionSource = Literal["segmentations", "annotations"]
REGION_FILES = {"segmentations": "gt_segmentations_{split}.json", "annotations": "gt_annotations_{split}.json"}


def cxr_id(path: str | Path) -> str:
    """CheXlocalize's image id: the last three path parts (patient, study, view) joined by ``_``."""
    return "_".join(Path(path).with_suffix("").parts[-3:])


def cxr_patient(path: str | Path) -> str | None:
    """The patient folder of a CheXpert path (``.../patient64541/study1/view1_frontal.jpg``), or None."""
    parts = Path(path).parts
    return parts[-3] if len(parts) >= 3 and parts[-3].startswith("patient") else None


#: the evaluation sets (``xbench_pl/data/sources.yaml``), as a type so that a wrong name is refused while parsing
Split = Literal["test", "val"]


class CheXlocalizeData(XBenchData):
    """CheXlocalize ground-truth segmentations with CheXpert labels.

    Args:
        split: (``XBenchData``) ``"test"`` (default) or ``"val"``.
        regions: ``"segmentations"`` (COCO RLE masks, default) or ``"annotations"`` (polygons).
        **kwargs: ``XBenchData`` arguments.
    """

    name = "chexlocalize"
    default_classes = dataset_classes("chexlocalize")
    fit_official_split = "val"

    def __init__(self, root: str | None = None, split: Split | None = None, regions: RegionSource = "segmentations",
                 **kwargs):
        super().__init__(root=root, split=split, **kwargs)
        if regions not in REGION_FILES:
            raise ValueError(f"regions must be one of {tuple(REGION_FILES)}, got {regions!r}")
        self.regions = regions

    def load_records(self) -> list[Record]:
        self.checked_root("the label CSVs and gt_segmentations_*.json / gt_annotations_*.json, with the CheXpert images")
        records = self.read_labels(find_one(self.root, LABEL_FILES[self.split]))
        path = find_one(self.root, (REGION_FILES[self.regions].format(split=self.split),))
        read = self.read_segmentation if self.regions == "segmentations" else self.read_annotation
        for image_id, tasks in read_json(path, dict).items():
            if image_id not in records:
                self.report(DataError(path, f"{image_id} is annotated but not in the label CSV", row=image_id))
                continue
            if not isinstance(tasks, dict):
                self.report(DataError(path, f"expected an object of tasks, got {type(tasks).__name__}", row=image_id))
                continue
            record = records[image_id]
            for task, value in tasks.items():
                if task == "img_size":
                    continue
                row = f"{image_id} / {task}"
                try:
                    finding = canonical(task, self.name)
                    if finding not in self.default_classes:
                        raise KeyError(f"{task!r} is not a CheXlocalize localisation task")
                    regions = read(value)
                    if regions and not record.labels.get(finding):
                        raise ValueError(f"a {task} region, but the label CSV says {task} is absent")
                except (KeyError, ValueError, TypeError) as error:
                    self.report(DataError(path, str(error).strip('"'), row=row))
                    continue
                for region in regions:
                    record.add_region(finding, region, path, row)
        return list(records.values())

    def read_labels(self, path: Path) -> dict[str, Record]:
        """One record per CSV row: image located by its cxr id under ``root``, 0/1 per task."""
        table = read_table(path, ["Path"])
        columns = {}
        for column in table.columns:
            try:
                columns[canonical(column, self.name)] = column
            except KeyError:
                continue  # not a finding column (Path, Sex, Age, ..., No Finding)
        missing = [c for c in self.default_classes if c not in columns]
        if missing:
            raise DataError(path, f"missing label column(s) for {missing}; found {list(table.columns)}")
        table = drop_duplicate_rows(table, [c for c in table.columns if c != "row"], path, self.report)
        images = ImageIndex(self.root, "**/*.jpg", key=cxr_id)
        records = {}
        for row in table.to_dict("records"):
            try:
                labels = {finding: self.parse_label(row[columns[finding]], columns[finding]) for finding in self.default_classes}
            except ValueError as error:
                self.report(DataError(path, str(error), row=row["row"]))
                continue
            image_id = cxr_id(row["Path"])
            if image_id in records:
                self.report(DataError(path, f"{image_id} is also at {records[image_id].source} with other labels", row=row["row"]))
                continue
            records[image_id] = Record(image_id, images.get(image_id), labels, {}, f"{path}, row {row['row']}",
                                       patient_id=cxr_patient(row["Path"]),
                                       groups=metadata_groups(*(row.get(column) or None for column in GROUP_COLUMNS)))
        return records

    @staticmethod
    def parse_label(value: str, column: str) -> int:
        try:
            label = float(value)
        except ValueError:
            label = None
        if label not in (0.0, 1.0):
            raise ValueError(f"{column} label {value!r} is not 0 or 1")
        return int(label)

    @staticmethod
    def read_segmentation(value) -> list[Region]:
        """``{"size": [H, W], "counts": str}`` -> one ``RLEMask`` (none if the mask is empty)."""
        if not isinstance(value, dict) or not isinstance(value.get("counts"), str) or len(value.get("size", ())) != 2:
            raise ValueError(f"expected {{'size': [H, W], 'counts': str}}, got {str(value)[:80]}")
        mask = RLEMask.from_coco(value["counts"], tuple(int(v) for v in value["size"]))
        return [mask] if mask.any() else []

    @staticmethod
    def read_annotation(value) -> list[Region]:
        """``[[[x, y], ...], ...]`` -> one ``Polygon`` per contour."""
        if not isinstance(value, list):
            raise ValueError(f"expected a list of contours, got {str(value)[:80]}")
        return [parse_polygon(contour) for contour in value]

#: ``CheXlocalizeDataModule``: its ``LightningDataModule``, built on first use (``xbench_pl.data.lightning``)
__getattr__ = lightning_datamodules(CheXlocalizeData)
