"""Train and validation sets for ``fit``: which images, how they are split, and the split file.

**Which images** (``fit_pool``): the dataset's official non-test part where it has one, so that
``fit`` never sees the images its official test split holds (each datamodule says which, in its class
attributes ``fit_official_split`` and ``fit_test_list``):

- ``chexlocalize``: the official ``val`` split (234 images, 200 patients), whatever ``split`` says;
  the ``test`` split is never read by ``fit``.
- ``chestx_det10``: the official ``train.json`` (3,001 images); ``test.json`` is never read by ``fit``.
- ``nih_bbox``: the evaluated images minus those listed in NIH's ``test_list.txt`` when that file is
  anywhere under ``root`` (an error if none is left).
- every other dataset (``demo``, ``demo_dicom``, ``rsna_pneumonia``, ``siim_pneumothorax``,
  ``covid_rural``, ``vindr_cxr`` whose reader takes the official test set only): the evaluated images,
  so a later ``test`` of the same dataset includes the training images (``fit`` says so).

``split_file`` restricts the pool as it restricts evaluation.

**How they are split** (``patient_split``): by patient, ``Record.patient_id`` where the dataset
records it (NIH with ``Data_Entry``, CheXpert's patient folder, RSNA's patientId), else each image
is its own unit. The sorted units are permuted by ``numpy.random.default_rng(seed)`` and the first
``round(val_fraction x units)`` (at least 1, leaving at least 1 for training) go to validation, so a
patient's images are all in one set and the same seed gives the same split on every rank and run.

**The split file** (``write_split`` / ``read_split``): a CSV ``image_id,patient_id,split`` (``train``
or ``val``), written atomically into the run's folder (``OUT/split.csv``) and re-used with
``--data.fit_split FILE``: an id the dataset lacks is a bad input (its row), a patient in both sets
an error, and images of the pool the file does not list are left out of both sets.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np

from xbench_pl.data.annotations import find_one
from xbench_pl.data.errors import DataError
from xbench_pl.outputs import atomic_write

SPLIT_COLUMNS = ("image_id", "patient_id", "split")
SETS = ("train", "val")


def unit_of(record) -> str:
    """The split unit of a record: its patient where known, else the image itself."""
    return f"patient {record.patient_id}" if record.patient_id else f"image {record.image_id}"


def fit_pool(datamodule) -> tuple[list, str]:
    """The records ``fit`` may train and validate on, and where they come from, in words."""
    name, official = datamodule.name, datamodule.fit_official_split  # the datamodule's class attributes
    if official is not None:
        evaluated = datamodule.split
        datamodule.split = official
        try:
            records = datamodule.prepare_records()
        finally:
            datamodule.split = evaluated
        return records, f"the official {official} split of {name} (its test split is never used by fit)"
    records = datamodule.prepare_records()
    test_list = datamodule.fit_test_list
    if test_list and datamodule.root is not None:
        path = find_one(datamodule.root, (test_list,), required=False)
        if path is not None:
            held_out = read_split_file(path, {r.image_id for r in records})
            kept = [r for r in records if r.image_id not in held_out]
            if not kept:
                raise DataError(path, f"every {name} image to fit on is in the official test list: nothing left to train on")
            return kept, (f"{name} without the {len(records) - len(kept)} image(s) of its official {path.name} "
                          f"({len(kept)} left)")
    return records, (f"every evaluated image of {name} (no official training split here): a later test on {name} "
                     "includes the images fit trained on")


def patient_split(records: list, val_fraction: float, seed: int) -> dict[str, str]:
    """``{image_id: "train" | "val"}``: a seeded split by patient (see the module docstring)."""
    units = sorted({unit_of(r) for r in records})
    if len(units) < 2:
        raise ValueError(f"fit needs at least 2 patients (or images without a patient) to split into train and val; "
                         f"got {len(units)}")
    n_val = min(len(units) - 1, max(1, round(val_fraction * len(units))))
    order = np.random.default_rng(seed).permutation(len(units))
    val = {units[i] for i in order[:n_val]}
    return {r.image_id: "val" if unit_of(r) in val else "train" for r in records}


def write_split(path: str | Path, records: list, assignment: dict[str, str]) -> Path:
    """``assignment`` as the split CSV, rows in record order (``atomic_write``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(SPLIT_COLUMNS)
    for record in records:
        if record.image_id in assignment:
            writer.writerow((record.image_id, record.patient_id or "", assignment[record.image_id]))
    atomic_write(path, text.getvalue())
    return path


def read_split(path: str | Path, records: list, report: Callable[[DataError], None]) -> dict[str, str]:
    """``{image_id: "train" | "val"}`` of a split CSV for the pool ``records``. A row whose id is not in
    the pool goes to ``report`` (a bad input); a bad header or set name, a patient in both sets, or an
    empty set is a ``DataError``."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.reader(handle))
    except FileNotFoundError as error:
        raise DataError(path, "fit split file not found") from error
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(path, f"cannot read the fit split file: {error}") from error
    header = [cell.strip().lower() for cell in rows[0]] if rows else []
    if "image_id" not in header or "split" not in header:
        raise DataError(path, f"a fit split file needs a header with image_id and split columns (as fit writes: "
                              f"{','.join(SPLIT_COLUMNS)}); got {rows[0] if rows else 'an empty file'}", row=1)
    column, which = header.index("image_id"), header.index("split")
    by_id = {r.image_id: r for r in records}
    assignment: dict[str, str] = {}
    first_row: dict[str, tuple[str, int]] = {}  # unit -> (set, row) where it first appeared
    for line, cells in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in cells):
            continue
        image_id = cells[column].strip() if column < len(cells) else ""
        chosen = cells[which].strip().lower() if which < len(cells) else ""
        if chosen not in SETS:
            raise DataError(path, f"split {chosen!r} of {image_id!r} is not one of {list(SETS)}", row=line)
        if image_id not in by_id:
            report(DataError(path, f"image id {image_id!r} is not among the images fit may use", row=line))
            continue
        unit = unit_of(by_id[image_id])
        earlier = first_row.setdefault(unit, (chosen, line))
        if earlier[0] != chosen:
            raise DataError(path, f"{unit} is in {earlier[0]} (row {earlier[1]}) and in {chosen}: a split must keep "
                                  "each patient in one set", row=line)
        assignment[image_id] = chosen
    for name in SETS:
        if name not in assignment.values():
            raise DataError(path, f"the fit split file leaves no image of the dataset in {name}")
    return assignment


def read_split_file(path: str | Path, known_ids=()) -> dict[str, int]:
    """The image ids a split file lists, in order, each with its 1-based line (first occurrence).

    One column: one id a line; the first line is a header when it is no id in ``known_ids``
    (``id``, ``image_id``, ``file``), else the first id. Several columns: the first line is
    the header, and the ids are its ``image_id`` or ``id`` column (any case), else its first.
    Blank lines and surrounding spaces are ignored.
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = [(line, [cell.strip() for cell in cells]) for line, cells in enumerate(csv.reader(handle), 1)]
    except FileNotFoundError as error:
        raise DataError(path, "split file not found") from error
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(path, f"cannot read the split file: {error}") from error
    rows = [(line, cells) for line, cells in rows if any(cells)]
    if not rows:
        return {}
    header = rows[0][1]
    if len(header) == 1 and max(len(cells) for _, cells in rows) == 1:
        column, body = 0, rows[1:] if header[0] not in known_ids else rows
    else:
        names = [cell.lower() for cell in header]
        column = next((names.index(n) for n in ("image_id", "id") if n in names), 0)
        body = rows[1:]
    wanted: dict[str, int] = {}
    for line, cells in body:
        if column < len(cells) and cells[column]:
            wanted.setdefault(cells[column], line)
    return wanted
