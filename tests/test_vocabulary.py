import pytest

from xbench_pl import available, create_datamodule
from xbench_pl.data.vocabulary import NATIVE_CLASSES, SYNONYMS, canonical, canonical_findings, dataset_classes, finding_count


@pytest.mark.parametrize(
    "spelling, expected",
    [
        ("Effusion", "Pleural Effusion"),
        ("Pleural effusion", "Pleural Effusion"),
        ("pleural effusion ", "Pleural Effusion"),
        ("Infiltrate", "Infiltration"),
        ("Airspace Opacity", "Lung Opacity"),
        ("Lung Opacity", "Lung Opacity"),
        ("Pulmonary fibrosis", "Fibrosis"),
        ("Pleural_Thickening", "Pleural Thickening"),
        ("groud_glass_opacity", "COVID-19 Opacity"),
        ("Nodule/Mass", "Nodule/Mass"),
        ("Other diseases", "Other Disease"),
        ("Other disease", "Other Disease"),
    ],
)
def test_spellings_merge(spelling, expected):
    assert canonical(spelling) == expected


def test_dataset_specific_meaning():
    assert canonical("Lung Opacity", dataset="rsna_pneumonia") == "Pneumonia"
    assert canonical("Lung Opacity", dataset="vindr_cxr") == "Lung Opacity"


def test_unknown_spelling_names_it():
    with pytest.raises(KeyError, match="Pneumonitis"):
        canonical("Pneumonitis")


def test_every_listed_spelling_maps_to_its_own_row():
    # a spelling listed under two names would map to only one of them
    for name, spellings in SYNONYMS.items():
        for spelling in (name, *spellings):
            assert canonical(spelling) == name, spelling


def test_every_native_class_is_known_and_counts():
    per_dataset = {d: dataset_classes(d) for d in NATIVE_CLASSES}
    assert {d: len(c) for d, c in per_dataset.items()} == {
        "rsna_pneumonia": 1, "siim_pneumothorax": 1, "covid_rural": 1, "chestx_det10": 10,
        "chexlocalize": 10, "nih_bbox": 8, "vindr_cxr": 22,
    }
    # within one dataset, no two native classes merge
    assert all(len(set(c)) == len(c) for c in per_dataset.values())
    union = canonical_findings()
    assert union == sorted({c for classes in per_dataset.values() for c in classes})
    # 53 dataset-findings; the cross-dataset merges (effusion x3, opacity, fibrosis, ...) leave 30
    assert sum(map(len, per_dataset.values())) == 53
    assert finding_count() == len(union) == 30
    assert finding_count([per_dataset["nih_bbox"], per_dataset["chestx_det10"]]) == 13  # 8 + 10 minus 5 shared


def test_default_class_lists_of_the_seven_datamodules():
    datamodules = [create_datamodule(name) for name in NATIVE_CLASSES]
    assert set(NATIVE_CLASSES) <= set(available("data"))
    defaults = {dm.name: list(dm.default_classes) for dm in datamodules}
    for name, classes in defaults.items():
        assert set(classes) <= set(dataset_classes(name)), name  # every default is an annotated class
    assert sum(map(len, defaults.values())) == 52  # 53 annotated, VinDr's "Other lesion" left out
    assert finding_count(defaults.values()) == 29
