"""One canonical finding vocabulary, with each dataset's spellings mapped onto it.

Tables line up across datasets only if "Effusion" (NIH, ChestX-Det10), "Pleural Effusion"
(CheXlocalize) and "Pleural effusion" (VinDr) are one row. ``canonical(name)`` maps a
dataset's spelling to the canonical name; an unknown spelling is a ``KeyError`` naming it,
never silently passed through. Matching ignores case, surrounding blanks and ``_`` vs space
(NIH ``Data_Entry`` writes ``Pleural_Thickening``, COVID-R LabelMe ``groud_glass_opacity``).

Merges (one canonical row per concept; ``docs/reference/datasets.md`` §9):

* ``Pleural Effusion`` <- ``Effusion`` (NIH, ChestX-Det10), ``Pleural Effusion`` (CheXpert),
  ``Pleural effusion`` (VinDr).
* ``Infiltration`` <- ``Infiltrate`` (NIH box list), ``Infiltration`` (NIH Data_Entry, VinDr).
* ``Lung Opacity`` <- ``Airspace Opacity`` (CheXlocalize JSON), ``Lung Opacity`` (CheXpert CSV,
  VinDr): one concept, named as the label files name it.
* ``Fibrosis`` <- ``Fibrosis`` (ChestX-Det10, NIH Data_Entry), ``Pulmonary fibrosis`` (VinDr).
* ``Pleural Thickening`` <- ``Pleural_Thickening`` (NIH Data_Entry), ``Pleural thickening`` (VinDr).
* ``COVID-19 Opacity`` <- ``groud_glass_opacity`` (sic) and its corrected spellings (COVID-R
  LabelMe): the one finding of COVID-19 Rural, its lung opacities (lung outlines are no finding).
* ``Other Disease`` <- ``Other disease`` (VinDr test) and ``Other diseases`` (VinDr train).

Kept apart on purpose: ``Nodule`` and ``Mass`` (NIH, ChestX-Det10) vs VinDr's merged
``Nodule/Mass`` (a box of the union is neither); ``Fracture`` (ChestX-Det10, CheXpert) vs
``Rib Fracture`` / ``Clavicle Fracture`` (VinDr); ``Infiltration`` vs ``ILD``.

Dataset-specific meaning: RSNA's positive class is spelled ``Lung Opacity`` but its target is
pneumonia, so ``canonical("Lung Opacity", dataset="rsna_pneumonia") == "Pneumonia"``.

Finding count. ``NATIVE_CLASSES`` lists each dataset's annotated classes in its native
spelling (RSNA 1, SIIM 1, COVID-R 1, ChestX-Det10 10, CheXlocalize 10 localisation tasks,
NIH 8, VinDr 22 local labels: 53 dataset-findings); after the merges above they are **30
canonical findings** (``finding_count()``). The datamodules' default class lists evaluate
52 of them (VinDr drops ``Other lesion``, see ``vindr_cxr``): **29 canonical findings**
(``finding_count`` of those lists; checked in ``tests/test_vocabulary.py``). XBench reports
36 over its 55 = 1+1+1+10+13+8+21 dataset-findings; its list is not public. The difference
is not in the merges alone: with none of them the 53 native spellings are 35 distinct strings.
"""

from __future__ import annotations

from collections.abc import Iterable

# canonical name -> spellings found in the datasets' native files (matched case-insensitively,
# "_" == " "); the canonical name itself always matches.
SYNONYMS: dict[str, tuple[str, ...]] = {
    # NIH ChestX-ray14 (box list + Data_Entry), ChestX-Det10, CheXpert/CheXlocalize, VinDr, RSNA, SIIM
    "Atelectasis": (),
    "Cardiomegaly": (),
    "Pleural Effusion": ("Effusion", "Pleural effusion"),
    "Infiltration": ("Infiltrate",),
    "Mass": (),
    "Nodule": (),
    "Pneumonia": (),
    "Pneumothorax": (),
    "Consolidation": (),
    "Edema": (),
    "Emphysema": (),
    "Fibrosis": ("Pulmonary fibrosis",),
    "Hernia": (),
    "Pleural Thickening": ("Pleural_Thickening", "Pleural thickening"),
    "Calcification": (),
    "Fracture": (),
    # CheXpert / CheXlocalize
    "Enlarged Cardiomediastinum": (),
    "Lung Lesion": (),
    "Lung Opacity": ("Airspace Opacity",),
    "Support Devices": (),
    "Pleural Other": (),
    # VinDr-CXR local labels
    "Aortic Enlargement": ("Aortic enlargement",),
    "Clavicle Fracture": ("Clavicle fracture",),
    "Enlarged PA": (),
    "ILD": (),
    "Lung Cavity": ("Lung cavity",),
    "Lung Cyst": ("Lung cyst",),
    "Mediastinal Shift": ("Mediastinal shift",),
    "Nodule/Mass": (),
    "Other Lesion": ("Other lesion",),
    "Rib Fracture": ("Rib fracture",),
    # VinDr-CXR global labels
    "Lung Tumor": ("Lung tumor",),
    "Tuberculosis": (),
    "COPD": (),
    "Other Disease": ("Other disease", "Other diseases"),
    # COVID-19 Rural (LabelMe)
    "COVID-19 Opacity": ("groud_glass_opacity", "ground_glass_opacity", "ground-glass opacity", "opacity"),
}

# dataset -> {spelling: canonical} where a spelling means something else in that dataset
DATASET_OVERRIDES: dict[str, dict[str, str]] = {
    "rsna_pneumonia": {"Lung Opacity": "Pneumonia"},
}

# each dataset's annotated classes, spelled as in its native files, in its own order
NATIVE_CLASSES: dict[str, tuple[str, ...]] = {
    "rsna_pneumonia": ("Lung Opacity",),
    "siim_pneumothorax": ("Pneumothorax",),
    "covid_rural": ("groud_glass_opacity",),
    "chestx_det10": ("Atelectasis", "Calcification", "Consolidation", "Effusion", "Emphysema",
                     "Fibrosis", "Fracture", "Mass", "Nodule", "Pneumothorax"),
    "chexlocalize": ("Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Airspace Opacity", "Edema",
                     "Consolidation", "Atelectasis", "Pneumothorax", "Pleural Effusion", "Support Devices"),
    "nih_bbox": ("Atelectasis", "Cardiomegaly", "Effusion", "Infiltrate", "Mass", "Nodule", "Pneumonia", "Pneumothorax"),
    "vindr_cxr": ("Aortic enlargement", "Atelectasis", "Calcification", "Cardiomegaly", "Clavicle fracture",
                  "Consolidation", "Edema", "Emphysema", "Enlarged PA", "ILD", "Infiltration", "Lung Opacity",
                  "Lung cavity", "Lung cyst", "Mediastinal shift", "Nodule/Mass", "Other lesion", "Pleural effusion",
                  "Pleural thickening", "Pneumothorax", "Pulmonary fibrosis", "Rib fracture"),
}


def _key(spelling: str) -> str:
    return " ".join(spelling.replace("_", " ").split()).lower()


_LOOKUP = {_key(s): name for name, spellings in SYNONYMS.items() for s in (name, *spellings)}
_OVERRIDES = {dataset: {_key(s): name for s, name in table.items()} for dataset, table in DATASET_OVERRIDES.items()}


def canonical(spelling: str, dataset: str | None = None) -> str:
    """Canonical finding name for a dataset's spelling; ``KeyError`` naming the spelling if unknown.

    ``dataset`` (a registered dataset name) applies that dataset's own meanings first.
    """
    key = _key(str(spelling))
    override = _OVERRIDES.get(dataset or "", {})
    if key in override:
        return override[key]
    try:
        return _LOOKUP[key]
    except KeyError:
        raise KeyError(f"unknown finding name {spelling!r}; known: {sorted(SYNONYMS)}") from None


def dataset_classes(dataset: str) -> tuple[str, ...]:
    """A dataset's annotated classes as canonical names, in its native order."""
    return tuple(canonical(s, dataset) for s in NATIVE_CLASSES[dataset])


def native_name(finding: str, dataset: str) -> str:
    """A dataset's own spelling of the canonical ``finding`` (its files', ``NATIVE_CLASSES``), e.g. CheXlocalize's
    ``Airspace Opacity`` for ``Lung Opacity``; the finding itself where the dataset has no other."""
    return next((s for s in NATIVE_CLASSES.get(dataset, ()) if canonical(s, dataset) == finding), finding)


def canonical_findings(class_lists: Iterable[Iterable[str]] | None = None) -> list[str]:
    """Distinct canonical findings over ``class_lists`` (canonical names; default: every
    dataset's annotated classes)."""
    lists = [dataset_classes(d) for d in NATIVE_CLASSES] if class_lists is None else class_lists
    return sorted({canonical(c) for classes in lists for c in classes})


def finding_count(class_lists: Iterable[Iterable[str]] | None = None) -> int:
    """How many canonical findings ``class_lists`` cover together (30 for all annotated classes of
    the seven datasets, 29 for the datamodules' defaults; XBench reports 36)."""
    return len(canonical_findings(class_lists))
