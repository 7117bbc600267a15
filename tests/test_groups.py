"""Issue 20's subgroups (``--model.groups``): metadata on the records, age bands, unknowns counted, by_group
tables equal to the metrics of each group's images alone, and the paired-bootstrap gap against a direct loop."""

import gzip
import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch

from xbench_pl.data.groups import GROUPS, age_group, metadata_groups, parse_groups, sex_group, view_group
from xbench_pl.data.nih_bbox import NIHBoxDataModule, read_box_table
from xbench_pl.metrics import BenchmarkMetrics
from xbench_pl.metrics.functional import bootstrap_weights, pointing_game
from xbench_pl.metrics.resampling import image_key


@pytest.mark.parametrize("age, band", [(0, "<40"), (39, "<40"), ("39.9", "<40"), (40, "40-59"), ("059Y", "40-59"), (59, "40-59"),
                                       (60, "60-79"), ("79", "60-79"), (79.99, "60-79"), (80, "80+"), ("080Y", "80+"), (414, "80+"),
                                       ("006M", "<40"), ("012W", "<40"), (None, "unknown"), ("", "unknown"), ("abc", "unknown"),
                                       (-1, "unknown"), ("nan", "unknown")])
def test_age_bands_at_their_edges(age, band):
    assert age_group(age) == band


def test_sex_view_and_option_parsing():
    assert [sex_group(v) for v in ("F", " m", "Female", "MALE", "O", "", None)] == ["F", "M", "F", "M", "unknown", "unknown", "unknown"]
    assert [view_group(v) for v in ("PA", "ap", "LL", "AP Supine", "", None)] == ["PA", "AP", "unknown", "unknown", "unknown", "unknown"]
    assert metadata_groups() == {"sex": "unknown", "age": "unknown", "view": "unknown"}
    assert parse_groups("view, sex") == ("view", "sex") and parse_groups("age") == ("age",)
    for bad in ("race", "sex,sex", "sex,", ""):
        with pytest.raises(ValueError):
            parse_groups(bad)


def test_cli_refuses_an_unknown_group_at_parse_time(tmp_path):
    from test_cli import in_process

    result = in_process("test", "--model", "location_prior", "--data", "demo", "--model.groups", "sex,race", "--out", str(tmp_path))
    assert result.returncode == 2 and "race" in result.stderr


def test_real_nih_sample_groups_equal_a_direct_join_of_data_entry(real_cxr, tmp_path):
    """The 12 real boxed NIH images with the real Data_Entry table: each record's sex, age band and view, and the
    counts per value, are those of a pandas join of the two tables (bands cut directly here)."""
    sample = real_cxr / "nih_bbox"
    (tmp_path / "images").symlink_to(sample / "images")
    (tmp_path / "BBox_List_2017.csv").symlink_to(sample / "BBox_List_2017.csv")
    entry = real_cxr / "tables" / "Data_Entry_2017_v2020.csv.gz"
    records = {r.image_id: r for r in NIHBoxDataModule(root=str(tmp_path)).load_records()}
    assert all(r.groups == {} for r in records.values())  # no Data_Entry: nothing known
    (tmp_path / "Data_Entry_2017_v2020.csv.gz").symlink_to(entry)
    records = {r.image_id: r for r in NIHBoxDataModule(root=str(tmp_path)).load_records()}
    boxed = read_box_table(sample / "BBox_List_2017.csv")[["image_id"]].drop_duplicates()
    with gzip.open(entry, "rt") as handle:
        table = pd.read_csv(handle)
    joined = boxed.merge(table, left_on="image_id", right_on="Image Index", how="left")
    assert len(joined) == len(records) == 12 and joined["Patient Age"].notna().all()
    bands = pd.cut(joined["Patient Age"], [-1, 39, 59, 79, 1000], labels=list(GROUPS["age"]))
    direct = {"sex": Counter(joined["Patient Gender"]), "age": Counter(bands.astype(str)), "view": Counter(joined["View Position"])}
    for name in GROUPS:
        assert Counter(r.groups[name] for r in records.values()) == direct[name], name
    for row, band in zip(joined.itertuples(index=False), bands):
        assert records[row.image_id].groups == {"sex": row[joined.columns.get_loc("Patient Gender")], "age": band,
                                                "view": row[joined.columns.get_loc("View Position")]}


def test_demo_batches_carry_the_groups():
    from xbench_pl import create_datamodule
    from xbench_pl.geometry import Preprocess

    dm = create_datamodule("demo", preprocess=Preprocess(resize="squash", size=32), eval_size=64)
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    assert [g["sex"] for g in batch.groups] == ["M", "F", "M", "F"]  # the demo's Data_Entry: sex alternates, all PA
    assert [g["view"] for g in batch.groups] == ["PA"] * 4 and all(g["age"] in GROUPS["age"] for g in batch.groups)


def grouped_inputs(seed=9):
    from test_metrics_beyond import bench_inputs

    x = bench_inputs(n_images=12, seed=seed)
    x["groups"] = {"sex": ["F", "M", "F", "F", "M", "M", "F", "?", "M", "F", "M", "F"],
                   "age": ["<40", "40-59", "<40", "unknown", "40-59", "<40", "60-79", "<40", "40-59", "40-59", "60-79", "<40"]}
    x["sample_keys"] = torch.tensor([image_key(f"img{i}") for i in range(12)])
    return x


def feed(bench, x, images, groups=True):
    rows = torch.isin(x["image"], torch.tensor(images))
    position = torch.full((12,), -1, dtype=torch.long)
    position[torch.tensor(images)] = torch.arange(len(images))
    bench.update(x["scores"][images], x["labels"][images], x["maps"][rows], x["masks"][rows], x["cls"][rows],
                 image_keys=x["keys"][rows], saliency=x["saliency"][images], sample_keys=x["sample_keys"][images],
                 groups={k: [v[i] for i in images] for k, v in x["groups"].items()} if groups else None,
                 pair_rows=position[x["image"][rows]])


def test_by_group_tables_are_the_metrics_of_each_groups_images_and_unknowns_are_counted():
    x = grouped_inputs()
    bench = BenchmarkMetrics(["A", "B", "C"], bootstrap=0, groups=("sex", "age", "view"))
    feed(bench, x, list(range(12)))
    table = bench.compute()["by_group"]
    assert table["sex"]["n_images"] == {"F": 6, "M": 5, "unknown": 1}
    assert table["age"]["n_images"] == {"<40": 5, "40-59": 4, "60-79": 2, "80+": 0, "unknown": 1}
    assert table["view"]["n_images"] == {"PA": 0, "AP": 0, "unknown": 12}  # not given: unknown, never guessed
    for name, values in x["groups"].items():
        for value in GROUPS[name]:
            subset = [i for i, v in enumerate(values) if v == value]
            direct = BenchmarkMetrics(["A", "B", "C"], bootstrap=0)
            if subset:
                feed(direct, x, subset, groups=False)
                expected = direct.compute()
                cell = table[name][value]
                assert json.dumps([cell["classes"], cell["mean"]]) == json.dumps([expected["classes"], expected["mean"]])
                assert cell["n_images"] == len(subset) and cell["ci"] is None
    assert table["age"]["80+"]["mean"]["pointing_game"] is None and table["age"]["80+"]["mean"]["n_regions"] == 0
    gap = table["sex"]["gap"]["auroc"]
    means = {v: table["sex"][v]["mean"]["auroc"] for v in ("F", "M")}
    assert gap["gap"] == max(means.values()) - min(means.values()) and gap["ci"] is None and gap["p"] is None
    assert means[gap["high"]] >= means[gap["low"]]
    assert table["view"]["gap"]["pointing_game"] is None  # fewer than two values with images
    # split invariance: fed in three parts (as ranks would be), merged, the same digits
    parts = [BenchmarkMetrics(["A", "B", "C"], bootstrap=0, groups=("sex", "age", "view")) for _ in range(3)]
    feed(parts[0], x, [3, 0, 7]), feed(parts[1], x, [11]), feed(parts[2], x, [1, 2, 4, 5, 6, 8, 9, 10])
    for name, metric in parts[0].named_modules():
        if hasattr(metric, "merge_state") and name:
            for other in parts[1:]:
                metric.merge_state(other.get_submodule(name))
    assert json.dumps(parts[0].compute()["by_group"]) == json.dumps(table)


def test_group_gap_interval_and_p_value_match_a_direct_paired_loop():
    """The Pointing Game gap between sexes: per replicate the same unit draws for both groups (weights of the
    dataset's sorted image keys), the per-class weighted means, their macro mean, high minus low."""
    x = grouped_inputs(seed=5)
    bench = BenchmarkMetrics(["A", "B", "C"], bootstrap=200, bootstrap_seed=3, groups=("sex",))
    feed(bench, x, list(range(12)))
    out = bench.compute()
    gap = out["by_group"]["sex"]["gap"]["pointing_game"]
    hits = pointing_game(x["maps"], x["masks"]).double().numpy()
    universe = np.unique(np.concatenate([x["keys"].numpy(), x["sample_keys"].numpy()]))
    weights = bootstrap_weights(len(universe), 200, 3).numpy()
    unit = np.searchsorted(universe, x["keys"].numpy())
    sex = np.array(x["groups"]["sex"])[x["image"].numpy()]
    cls = x["cls"].numpy()

    def macro(value, w):
        means = []
        for c in range(3):
            chosen = (sex == value) & (cls == c)
            total = (w[unit[chosen]] * hits[chosen]).sum()
            count = w[unit[chosen]].sum()
            means.append(total / count if count else np.nan)
        return np.nanmean(means) if not np.all(np.isnan(means)) else np.nan

    point = {v: macro(v, np.ones(len(universe))) for v in ("F", "M")}
    assert point[gap["high"]] - point[gap["low"]] == pytest.approx(gap["gap"], abs=1e-9)
    diff = np.array([macro(gap["high"], w) - macro(gap["low"], w) for w in weights])
    diff = diff[~np.isnan(diff)]
    np.testing.assert_allclose(gap["ci"], np.quantile(diff, [0.025, 0.975]), atol=1e-9)
    assert gap["p"] == pytest.approx(min(1.0, 2 * min((diff <= 0).mean(), (diff >= 0).mean())), abs=1e-12)
    ci = out["by_group"]["sex"]["F"]["ci"]
    assert ci["resamples"] == 200 and set(ci["mean"]) == set(out["ci"]["mean"])  # the rows' intervals, per group


# -- subgroups from the datasets' own metadata: DICOM headers, the CheXpert csv ----------------------------------


@pytest.mark.filterwarnings("ignore:Invalid value for VR AS")  # bare "62", as the real SIIM/RSNA files write it
def test_dicom_header_fields_give_the_groups_and_missing_tags_are_unknown(tmp_path):
    from synthetic_dicom import grey, write_dicom

    from xbench_pl.data.dicom import read_dicom_header, read_dicom_size
    from xbench_pl.data.errors import DataError

    cases = {"full": ({"PatientSex": "F", "PatientAge": "058Y", "ViewPosition": "AP"}, {"sex": "F", "age": "40-59", "view": "AP"}),
             "plain": ({"PatientSex": "M", "PatientAge": "62", "ViewPosition": "PA"}, {"sex": "M", "age": "60-79", "view": "PA"}),
             "none": ({}, {"sex": "unknown", "age": "unknown", "view": "unknown"}),
             "empty": ({"PatientSex": "", "PatientAge": "", "ViewPosition": ""}, {"sex": "unknown", "age": "unknown", "view": "unknown"}),
             "other": ({"PatientSex": "O", "PatientAge": "080Y", "ViewPosition": "LL"}, {"sex": "unknown", "age": "80+", "view": "unknown"})}
    for name, (header, expected) in cases.items():
        path = write_dicom(tmp_path / f"{name}.dcm", grey(12, 16), header=header)
        assert read_dicom_header(path) == ((12, 16), expected), name
        assert read_dicom_header(path, groups=False) == ((12, 16), None) and read_dicom_size(path) == (12, 16)
    (tmp_path / "bad.dcm").write_bytes(b"not a dicom")
    with pytest.raises(DataError, match="bad.dcm"):
        read_dicom_header(tmp_path / "bad.dcm")


@pytest.mark.filterwarnings("ignore:Invalid value for VR AS")  # bare "62", as the real SIIM/RSNA files write it
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_rsna_siim_vindr_records_carry_their_dicom_groups(tmp_path, on_error):
    """The synthetic RSNA/SIIM/VinDr folders with headers written in: the records' groups after setup (header read in
    the image check; with ``skip`` after the full decode); a file without the tags is all unknown."""
    from synthetic_dicom import grey, make_rsna, make_siim, make_vindr, write_dicom

    from xbench_pl import create_datamodule
    from xbench_pl.geometry import Preprocess

    make_rsna(tmp_path / "rsna")
    write_dicom(tmp_path / "rsna" / "stage_2_train_images" / "pos.dcm", grey(96, 128), header={"PatientSex": "F", "PatientAge": "039Y", "ViewPosition": "AP"})
    make_siim(tmp_path / "siim")
    siim_file = next((tmp_path / "siim").rglob("1.2.4.2.dcm"))
    write_dicom(siim_file, grey(48, 64), header={"PatientSex": "M", "PatientAge": "81", "ViewPosition": "PA"})
    make_vindr(tmp_path / "vindr")
    write_dicom(tmp_path / "vindr" / "test" / "bbb.dicom", grey(80, 120, dtype=np.uint16), "MONOCHROME1", bits_stored=12,
                window=(2048, 4096), header={"PatientSex": "F", "PatientAge": "", "ViewPosition": "PA"})
    unknown = {"sex": "unknown", "age": "unknown", "view": "unknown"}
    expected = {"rsna_pneumonia": {"pos": {"sex": "F", "age": "<40", "view": "AP"}, "neg": unknown},
                "siim_pneumothorax": {"1.2.4.2": {"sex": "M", "age": "80+", "view": "PA"}, "1.2.4.1": unknown},
                "vindr_cxr": {"bbb": {"sex": "F", "age": "unknown", "view": "PA"}, "aaa": unknown}}
    for name, folder in (("rsna_pneumonia", "rsna"), ("siim_pneumothorax", "siim"), ("vindr_cxr", "vindr")):
        dm = create_datamodule(name, root=str(tmp_path / folder), preprocess=Preprocess(size=32), eval_size=64, on_error=on_error)
        dm.setup("test")
        assert {r.image_id: r.groups for r in dm.test_set.records} == expected[name], name
        batch = next(iter(dm.test_dataloader()))
        assert batch.groups == [expected[name][i] for i in batch.image_ids]


def test_dicom_groups_cost_one_header_read_per_image_on_the_demo(monkeypatch):
    """demo_dicom (headers: sex alternating M/F, ages 40.., PA; the folder ``--data demo_dicom`` reads, drawn once a
    machine): the groups, read once per image in setup."""
    import xbench_pl.data.io as io

    from xbench_pl import create_datamodule
    from xbench_pl.geometry import Preprocess

    calls = Counter()
    original = io.read_dicom_header
    monkeypatch.setattr(io, "read_dicom_header", lambda path, *a, **k: (calls.update([str(path)]), original(path, *a, **k))[1])
    dm = create_datamodule("demo_dicom", preprocess=Preprocess(size=32), eval_size=64)
    dm.setup("test")
    records = dm.test_set.records
    assert len(records) == 6 and sorted(calls.values()) == [1] * 6
    assert [r.groups["sex"] for r in records] == ["M", "F"] * 3 and all(r.groups["view"] == "PA" for r in records)
    assert [r.groups["age"] for r in records] == ["40-59"] * 6  # ages 40..45


def test_real_siim_dicoms_groups_equal_a_direct_pydicom_read(real_cxr, tmp_path):
    from pydicom import dcmread

    from xbench_pl import create_datamodule
    from xbench_pl.geometry import Preprocess

    files = sorted((real_cxr / "siim").glob("*.dcm"))
    rows = ["ImageId, EncodedPixels"]
    for i, path in enumerate(files):
        folder = tmp_path / "dicom-images-train" / f"study{i}" / f"series{i}"
        folder.mkdir(parents=True)
        (folder / path.name).symlink_to(path)
        rows.append(f"{path.stem},-1")
    (tmp_path / "train-rle.csv").write_text("\n".join(rows) + "\n")
    dm = create_datamodule("siim_pneumothorax", root=str(tmp_path), preprocess=Preprocess(size=32), eval_size=64)
    dm.setup("test")
    records = {r.image_id: r for r in dm.test_set.records}
    assert len(records) == len(files) >= 1
    for path in files:
        header = dcmread(path, stop_before_pixels=True)
        direct = metadata_groups(header.get("PatientSex") or None, header.get("PatientAge") or None, header.get("ViewPosition") or None)
        assert records[path.stem].groups == direct
    assert records[files[-1].stem].groups == {"sex": "M", "age": "60-79", "view": "PA"}  # 'M', '62', 'PA'


def test_real_chexlocalize_groups_equal_a_direct_join_of_the_csv(real_cxr):
    from xbench_pl.data.chexlocalize import CheXlocalizeDataModule, cxr_id

    root = real_cxr / "chexlocalize"
    records = {r.image_id: r for r in CheXlocalizeDataModule(root=str(root), split="val").load_records()}
    table = pd.read_csv(root / "valid.csv")
    table["image_id"] = table["Path"].map(cxr_id)
    assert set(table["image_id"]) == set(records)
    bands = pd.cut(table["Age"], [-1, 39, 59, 79, 1000], labels=list(GROUPS["age"])).astype(str)
    for row, band in zip(table.itertuples(index=False), bands):
        expected = {"sex": {"Male": "M", "Female": "F"}.get(row.Sex, "unknown"), "age": band,
                    "view": row[table.columns.get_loc("AP/PA")] if row[table.columns.get_loc("AP/PA")] in ("AP", "PA") else "unknown"}
        assert records[row.image_id].groups == expected
    assert [records[i].groups["view"] for i in sorted(records)] == ["AP", "PA"]  # Male 73 AP, Male 70 PA


def test_chexlocalize_csv_without_or_with_empty_group_cells_is_unknown(tmp_path):
    """A lateral image (empty AP/PA), an Unknown sex and a csv without the columns."""
    from xbench_pl.data.chexlocalize import CheXlocalizeDataModule

    tasks = ("Enlarged Cardiomediastinum,Cardiomegaly,Lung Opacity,Lung Lesion,Edema,Consolidation,Atelectasis,Pneumothorax,"
             "Pleural Effusion,Support Devices")
    zeros = ",".join("0" for _ in tasks.split(","))
    for header, cells, expected in (("Path,Sex,Age,AP/PA,", "Unknown,45,,", {"sex": "unknown", "age": "40-59", "view": "unknown"}),
                                    ("Path,Sex,Age,AP/PA,", "Female,,PA,", {"sex": "F", "age": "unknown", "view": "PA"}),
                                    ("Path,", "", {"sex": "unknown", "age": "unknown", "view": "unknown"})):
        folder = tmp_path / str(len(cells))
        folder.mkdir()
        (folder / "valid.csv").write_text(f"{header}{tasks}\nCheXpert-v1.0/valid/patient1/study1/view1_frontal.jpg,{cells}{zeros}\n")
        (folder / "gt_segmentations_val.json").write_text("{}")
        (record,) = CheXlocalizeDataModule(root=str(folder), split="val").load_records()
        assert record.groups == expected
