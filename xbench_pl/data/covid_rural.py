"""COVID-19 Rural (TCIA COVID-19-AR radiographs, opacity annotations of haimingt/opacity_segmentation_covid_chest_X_ray).

Layout as downloaded (``covid_rural_annot/`` of that repository)::

    root/jpgs/<stem>.jpg          221 radiographs, 3-channel JPEG (read as grey), full resolution
    root/jpgs/jsons/<stem>.json   LabelMe 4.5.6: {"shapes": [{"label", "points": [[x, y], ...], "shape_type": "polygon"}, ...]}
    root/pngs_masks/<stem>.png    193 opacity masks at JPEG size, {0, 1} (non-zero = opacity)

``<stem>`` is ``COVID-19-AR-<patientId>_<MM-DD-YYYY>-XR`` and is the image id. The
``manual_segmentations_model_predictions/`` folder holds model outputs and is never read.

One finding, ``COVID-19 Opacity`` (LabelMe ``groud_glass_opacity``, sic), positive in every
image (all patients are COVID-19 positive, so AUROC is undefined on this dataset alone).
Regions: ``regions="masks"`` (default: the PNG masks, as MAVL's grounding code) or
``regions="polygons"`` (the LabelMe opacity polygons, ``[x, y]`` float JPEG pixels, filled as PIL
``polygon(outline=1, fill=1)``; ``left_lung`` / ``right_lung`` outlines are anatomy, not
findings, and are ignored). An image without a mask (28 of 221) or with an empty one, or
(polygons) without an opacity polygon, has no ground truth and is not evaluated: the
evaluation set is driven by the annotations, not by ``jpgs/``.

Default evaluation set: every non-empty mask: **at most 193 images** (193 masks less any that
are empty; not counted here on the real download). There is no official split; ``split_file``
restricts it (LoVT uses 60/20/20 by patient).

Subgroups (``--model.groups``): sex and age from ``root/covid_rural_patient_info.csv`` (columns ``PATIENT_ID``,
e.g. ``COVID-19-AR-16434409``, the image stem before its first ``_``; ``AGE`` in years; ``SEX`` ``M``/``F``), as
listed in ``docs/reference/datasets.md`` and in the annotation repository's file; a patient absent from it, or a
download without it, is ``unknown`` (counted, never guessed). ``view`` is always ``unknown``: neither the JPEGs nor
the CSV record AP/PA. The patient (``COVID-19-AR-<patientId>``, from the stem) is the bootstrap and ``fit`` unit.

Bad input: an undecodable mask, a LabelMe JSON that is not an object with a ``shapes`` list,
a shape with an unknown label, a non-polygon opacity shape or malformed points is an error
naming the file and row (``shape <n>``), or a counted skip with ``on_error='skip'``; a missing
JPEG and a mask whose size differs from its JPEG are caught by the setup image check.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Literal, get_args

from xbench_pl.data.annotations import MaskFile, parse_polygon, read_json
from xbench_pl.data.base import Record, XBenchData
from xbench_pl.data.errors import DataError
from xbench_pl.data.groups import metadata_groups
from xbench_pl.data.regions import Region
from xbench_pl.data.vocabulary import canonical, dataset_classes
from xbench_pl.registry import lightning_datamodules

(OPACITY,) = dataset_classes("covid_rural")
ANATOMY_LABELS = ("left_lung", "right_lung", "lung")
RegionSource = Literal["masks", "polygons"]
REGION_SOURCES = get_args(RegionSource)
#: the patients' metadata beside the annotations (subgroups: sex, age)
PATIENT_INFO = "covid_rural_patient_info.csv"


#: the evaluation sets (``xbench_pl/data/sources.yaml``), as a type so that a wrong name is refused while parsing
Split = Literal["masked"]


class COVIDRuralData(XBenchData):
    """COVID-19 Rural opacity masks or polygons.

    Args:
        regions: ``"masks"`` (``pngs_masks/*.png``, default) or ``"polygons"`` (``jpgs/jsons/*.json``).
        **kwargs: ``XBenchData`` arguments.
    """

    name = "covid_rural"
    default_classes = (OPACITY,)

    def __init__(self, root: str | None = None, split: Split | None = None, regions: RegionSource = "masks", **kwargs):
        super().__init__(root=root, split=split, **kwargs)
        if regions not in REGION_SOURCES:
            raise ValueError(f"regions must be one of {REGION_SOURCES}, got {regions!r}")
        self.regions = regions

    def load_records(self) -> list[Record]:
        self.checked_root("pngs_masks/ and jpgs/ (the covid_rural_annot folder)")
        folder = self.root / ("pngs_masks" if self.regions == "masks" else "jpgs/jsons")
        files = sorted(folder.glob("*.png" if self.regions == "masks" else "*.json"))
        if not files:
            raise DataError(folder, f"no COVID-19 Rural {self.regions} found")
        read = self.read_mask if self.regions == "masks" else self.read_labelme
        patients = self.read_patient_info()
        records = []
        for file in files:
            regions = read(file)
            if regions:
                patient = file.stem.split("_")[0]
                record = Record(file.stem, self.root / "jpgs" / f"{file.stem}.jpg", {OPACITY: 1}, {}, str(file),
                                patient_id=patient, groups=patients.get(patient, {}))
                for index, region in regions:
                    record.add_region(OPACITY, region, file, index)
                records.append(record)
        return records

    def read_patient_info(self) -> dict[str, dict[str, str]]:
        """Per ``PATIENT_ID`` of ``covid_rural_patient_info.csv`` its subgroups (sex, age; view unknown); none without the file."""
        path = self.root / PATIENT_INFO
        if not path.is_file():
            return {}
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            missing = {"PATIENT_ID", "AGE", "SEX"} - set(reader.fieldnames or ())
            if missing:
                raise DataError(path, f"missing column(s) {', '.join(sorted(missing))}")
            return {(row["PATIENT_ID"] or "").strip(): metadata_groups(sex=row["SEX"] or None, age=row["AGE"] or None)
                    for row in reader}  # a short row's missing cells are None: unknown

    def read_mask(self, file: Path) -> list[tuple[str | None, Region]]:
        mask = MaskFile(file)
        try:
            inside = mask.decode().any()
        except DataError as error:
            self.report(error)
            return []
        return [(None, mask)] if inside else []

    def read_labelme(self, file: Path) -> list[tuple[str, Region]]:
        try:
            shapes = read_json(file, dict).get("shapes")
            if not isinstance(shapes, list):
                raise DataError(file, "LabelMe file has no 'shapes' list")
        except DataError as error:
            self.report(error)
            return []
        regions = []
        for number, shape in enumerate(shapes, start=1):
            row = f"shape {number}"
            try:
                if not isinstance(shape, dict) or not isinstance(shape.get("label"), str):
                    raise ValueError(f"shape {str(shape)[:80]} has no label")
                label = shape["label"]
                if label.strip().lower().replace(" ", "_") in ANATOMY_LABELS:
                    continue
                if canonical(label, self.name) != OPACITY:
                    raise KeyError(f"label {label!r} is not a COVID-19 Rural finding")
                if shape.get("shape_type", "polygon") != "polygon":
                    raise ValueError(f"{label} shape_type {shape['shape_type']!r} is not a polygon")
                regions.append((row, parse_polygon(shape.get("points"))))
            except (KeyError, ValueError, TypeError) as error:
                self.report(DataError(file, str(error).strip('"'), row=row))
        return regions

#: ``COVIDRuralDataModule``: its ``LightningDataModule``, built on first use (``xbench_pl.data.lightning``)
__getattr__ = lightning_datamodules(COVIDRuralData)
