"""``data list|pull|verify`` and the pinned evaluation sets, against loopback stand-ins of each protocol the sources use
(tests/loopback_hosts.py: Kaggle's API as the ``kaggle`` client calls it, PhysioNet's basic auth, GitHub's raw files
and trees API, plain files with ``Range``), serving tiny synthetic files in each dataset's real layout."""

from __future__ import annotations

import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from io import BytesIO
from pathlib import Path

import pytest
from loopback_hosts import Hosts
from synthetic_dicom import make_rsna, make_vindr
from test_cli import REPO, in_process
from test_covid_rural import STEMS, opacity_mask, write_covid

from xbench_pl.commands.data import verify
from xbench_pl.data import sources
from xbench_pl.data.errors import DataError

KAGGLE = {"KAGGLE_USERNAME": "tester", "KAGGLE_KEY": "kaggle-key"}
PHYSIONET = {"PHYSIONET_USERNAME": "reader", "PHYSIONET_PASSWORD": "physionet-secret"}
COVID_REPO = "haimingt/opacity_segmentation_covid_chest_X_ray/066d40b943af4ed01153f2f43d682cead070fba2/covid_rural_annot"


@pytest.fixture
def hosts(monkeypatch, tmp_path):
    served = Hosts()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kaggle or ~/.netrc of the machine's
    for name in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_API_TOKEN", "KAGGLE_CONFIG_DIR", "PHYSIONET_USERNAME",
                 "PHYSIONET_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in served.environ().items():
        monkeypatch.setenv(name, value)
    yield served
    served.close()


def data(*args, folder: Path, **environ) -> subprocess.CompletedProcess:
    return in_process("data", *args, "--dir", str(folder), "--quiet", **environ)


def flat(result: subprocess.CompletedProcess) -> str:
    """stderr unwrapped: lines are wrapped to the terminal."""
    return " ".join(result.stderr.split())


def serve_folder(store: dict, prefix: str, root: Path) -> dict[str, bytes]:
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    store.update({f"{prefix}{name}": content for name, content in files.items()})
    return files


# -- the sources and the pinned sets ---------------------------------------------------------------------------------
def test_list_shows_every_dataset_with_host_terms_and_size(tmp_path):
    result = data("list", folder=tmp_path)
    assert result.returncode == 0, result.stderr
    blocks = {block.split(":", 1)[0]: " ".join(block.split()) for block in result.stdout.split("\n\n")[1:]}
    assert set(blocks) == {"nih_bbox", "rsna_pneumonia", "siim_pneumothorax", "covid_rural", "chestx_det10",
                           "chexlocalize", "vindr_cxr", "ms_cxr"}
    for block in blocks.values():
        assert all(f" {label}: " in block for label in ("host", "terms", "first", "size", "layout")), block
        assert "--data.split" in block and "not pulled" in block
    assert "physionet" in blocks["vindr_cxr"].lower() and "Kaggle" in blocks["rsna_pneumonia"]
    assert "880 images, ids pinned in nih_bbox.boxed.txt; the paper: 880" in blocks["nih_bbox"]


def test_each_readers_split_names_its_sets():
    """``--data.split`` is refused while parsing (a ``Literal`` of each reader's signature): the same names as the
    sources' sets."""
    from typing import get_args, get_type_hints

    from xbench_pl.registry import read_data_config

    for name, source in sources.read_sources().items():
        data_class, _ = read_data_config(name)
        annotation = get_type_hints(data_class.__init__)["split"]
        assert get_args(get_args(annotation)[0]) == tuple(source.sets), name


def test_pinned_lists_are_sorted_and_match_their_counts():
    for source in sources.read_sources().values():
        for chosen in source.sets.values():
            ids = chosen.ids()
            if ids is None:
                continue
            text = (sources.EVAL_SETS / chosen.ids_file).read_text()
            assert ids == sorted(set(ids)) and len(ids) == chosen.count, chosen
            assert sources.ids_sha256(reversed(ids)) == sources.sha256(sources.EVAL_SETS / chosen.ids_file)
            assert text.endswith("\n")
            if chosen.paper is not None:
                assert chosen.count == chosen.paper  # where the paper states the count of a set pinned here


def test_pinned_lists_are_the_public_tables_own(real_cxr):
    """Each shipped list is what its source says, recomputed from the full public tables."""
    import pandas as pd

    tables = real_cxr / "tables"
    boxes = pd.read_csv(tables / "BBox_List_2017.csv.gz")
    assert sources.eval_set("nih_bbox", "boxed").ids() == sorted(set(boxes["Image Index"]))
    rsna = pd.read_csv(zipfile.ZipFile(tables / "kaggle_stage_2_train_labels.csv.zip").open("stage_2_train_labels.csv"))
    assert sources.eval_set("rsna_pneumonia", "positives").ids() == sorted(set(rsna[rsna.Target == 1].patientId))
    assert rsna.patientId.nunique() == sources.eval_set("rsna_pneumonia", "all").count
    siim = pd.read_csv(tables / "siim-pneumothorax-train-rle.csv.gz")
    positive = siim[siim[" EncodedPixels"].str.strip() != "-1"]
    assert sources.eval_set("siim_pneumothorax", "positives").ids() == sorted(set(positive.ImageId))
    assert len(positive) == sources.eval_set("siim_pneumothorax", "positives").regions


def test_verify_counts_the_real_nih_table(real_cxr, tmp_path):
    """The whole real box list against the pinned set: 880 images, 984 boxes; each missing image one line."""
    root = tmp_path / "nih_bbox"
    (root / "images").mkdir(parents=True)
    (root / "BBox_List_2017.csv").write_bytes(gzip.open(real_cxr / "tables" / "BBox_List_2017.csv.gz").read())
    said, problems = verify("nih_bbox", root)
    assert said == ["nih_bbox: split boxed, 880 images, ids SHA-256 5f2df8c25ce9 (= the pinned nih_bbox.boxed.txt)"]
    assert len(problems) == 880 and all(": missing (image of " in p for p in problems)
    for image_id in sources.eval_set("nih_bbox", "boxed").ids():
        (root / "images" / image_id).write_bytes(b"")
    said, problems = verify("nih_bbox", root)
    assert problems == [] and said[-1] == "nih_bbox: 880 images of split boxed, every image file present, 984 regions"


def test_nih_archive_folders_follow_the_published_counts(tmp_path):
    ids = [f"{i:08d}_000.png" for i in range(15000)]
    (tmp_path / "Data_Entry_2017.csv").write_text("Image Index,Finding Labels\n" + "".join(f"{i},No Finding\n" for i in ids[::-1]))
    folders = sources.nih_folders(tmp_path)
    assert [folders[ids[i]] for i in (0, 4998, 4999, 14998, 14999)] == [
        "images_001", "images_001", "images_002", "images_002", "images_003"]


def test_a_named_split_keeps_its_pinned_ids_and_names_each_missing_one(tmp_path):
    from xbench_pl import create_datamodule

    root = make_rsna(tmp_path / "rsna")  # ids pos and neg: none of the real positives
    with pytest.raises(DataError, match=r"rsna_pneumonia.positives.txt, row 1: image id '[0-9a-f-]+' of split positives "
                                        r"is not in the rsna_pneumonia annotations"):
        create_datamodule("rsna_pneumonia", root=str(root), split="positives").prepare_records()
    with pytest.raises(ValueError, match="unknown split 'paper'; its evaluation sets: all, positives"):
        create_datamodule("rsna_pneumonia", root=str(root), split="paper")


# -- pulling ----------------------------------------------------------------------------------------------------------
def test_rsna_pull_through_kaggle_then_test_reads_it_by_name(hosts, tmp_path):
    """Kaggle's competition API: labels and each listed DICOM placed and locked; `test --data rsna_pneumonia` then
    reads the folder without --data.root and records the evaluated ids' SHA-256."""
    served = serve_folder(hosts.kaggle.setdefault("competitions/rsna-pneumonia-detection-challenge", {}), "",
                          make_rsna(tmp_path / "native"))
    hosts.kaggle["competitions/rsna-pneumonia-detection-challenge"]["stage_2_detailed_class_info.csv"] = b"patientId,class\n"
    folder = tmp_path / "data"
    missing = data("pull", "rsna_pneumonia", folder=folder)
    assert missing.returncode == 2 and "Kaggle needs your API token" in flat(missing) and "kaggle.json" in flat(missing)
    hosts.kaggle_refused.add("competitions/rsna-pneumonia-detection-challenge")
    refused = data("pull", "rsna_pneumonia", folder=folder, **KAGGLE)
    assert refused.returncode == 2 and refused.stderr.count("error:") == 1
    assert "accept the terms first at https://www.kaggle.com/competitions/rsna-pneumonia-detection-challenge/rules" in (
        " ".join(refused.stderr.split()))
    hosts.kaggle_refused.clear()
    pulled = data("pull", "rsna_pneumonia", folder=folder, **KAGGLE)
    assert pulled.returncode == 0, pulled.stderr
    root = folder / "rsna_pneumonia"
    for name, content in served.items():
        assert (root / name).read_bytes() == content
    lock = json.loads((root / sources.LOCK_FILE).read_text())["files"]
    assert set(lock) == {*served, "stage_2_detailed_class_info.csv"}
    assert not (folder / sources.PARTIAL / "rsna_pneumonia").exists()
    verified = data("verify", "rsna_pneumonia", folder=folder)
    assert verified.returncode == 2 and f"rsna_pneumonia: 2 images under {root}, split all has 26,684" in flat(verified)

    described = in_process("describe", "--data", "rsna_pneumonia", XBENCH_DATA_DIR=str(folder))
    assert described.returncode == 0, described.stderr
    assert f"rsna_pneumonia: split all, 2 images, ids SHA-256 {sources.ids_sha256(['pos', 'neg'])[:12]}" in described.stdout
    out = tmp_path / "run"
    run = in_process("test", "--model", "center", "--data", "rsna_pneumonia", "--out", str(out), "--data.eval_size", "16",
                     XBENCH_DATA_DIR=str(folder))
    assert run.returncode == 0, run.stderr
    evaluated = json.loads((out / "metrics.json").read_text())["datasets"]["rsna_pneumonia"]["evaluated"]
    assert evaluated["split"] == "all" and evaluated["images"] == 2
    assert evaluated["ids_sha256"] == sources.ids_sha256(["pos", "neg"])
    assert evaluated["pinned"] == {"ids": None, "count": 26684}
    assert "rsna_pneumonia: split all, 2 images, ids SHA-256" in flat(run)


def test_nih_pull_takes_single_files_of_the_kaggle_dataset(hosts, real_cxr, tmp_path):
    """The real NIH sample served as Kaggle's nih-chest-xrays/data lays it out (images_NNN/images/): the tables, then
    each boxed image from its archive folder (Data_Entry's order); the reader reads the folder by name."""
    import pandas as pd

    boxes = (real_cxr / "nih_bbox" / "BBox_List_2017.csv").read_bytes()
    ids = sorted(set(pd.read_csv(BytesIO(boxes))["Image Index"]))
    entries = sorted({*ids, *(f"{i:08d}_000.png" for i in range(1, 5001))})  # the first ids of the real table's order
    dataset = hosts.kaggle.setdefault("datasets/nih-chest-xrays/data", {})
    dataset["BBox_List_2017.csv"] = boxes
    dataset["Data_Entry_2017.csv"] = ("Image Index,Finding Labels\n" + "".join(f"{i},No Finding\n" for i in entries)).encode()
    for image_id in ids:
        folder = "images_001" if entries.index(image_id) < 4999 else "images_002"
        dataset[f"{folder}/images/{image_id}"] = (real_cxr / "nih_bbox" / "images" / image_id).read_bytes()
    assert {k.split("/")[0] for k in dataset if k.endswith(".png")} == {"images_001", "images_002"}
    folder = tmp_path / "data"
    result = data("pull", "nih_bbox", folder=folder, **KAGGLE)
    assert result.returncode == 0, result.stderr
    root = folder / "nih_bbox"
    assert sorted(p.name for p in (root / "images").iterdir()) == ids
    described = in_process("describe", "--data", "nih_bbox", XBENCH_DATA_DIR=str(folder))
    assert described.returncode == 0, described.stderr
    assert f"nih_bbox: {len(ids)} images" in described.stdout
    assert f"(differs from the pinned nih_bbox.boxed.txt: {len(ids)} of its 880 here;" in " ".join(described.stdout.split())


def test_vindr_pull_through_physionet_credentials(hosts, tmp_path, monkeypatch):
    """PhysioNet's basic auth: no credentials, wrong ones, an unsigned data use agreement each one line; then a
    dropped connection resumes (Range) and the folder verifies."""
    native = make_vindr(tmp_path / "native")
    served = serve_folder(hosts.physionet, "vindr-cxr/1.0.0/", native)
    folder = tmp_path / "data"
    result = data("pull", "vindr_cxr", folder=folder)
    assert result.returncode == 2 and "PhysioNet needs your credentials" in " ".join(result.stderr.split())
    result = data("pull", "vindr_cxr", folder=folder, PHYSIONET_USERNAME="reader", PHYSIONET_PASSWORD="wrong")
    assert result.returncode == 2 and "refused the credentials (HTTP 401)" in flat(result)
    hosts.physionet_refused.add("vindr-cxr/1.0.0")
    result = data("pull", "vindr_cxr", folder=folder, **PHYSIONET)
    assert result.returncode == 2 and "(HTTP 403): the data's terms must be accepted first" in " ".join(result.stderr.split())
    hosts.physionet_refused.clear()
    dicom = next(name for name in served if name.endswith(".dicom"))
    hosts.physionet[f"vindr-cxr/1.0.0/{dicom}"] = served[dicom] = served[dicom] + os.urandom(1 << 20)  # (trailing bytes)
    hosts.drop.add(f"/physionet/vindr-cxr/1.0.0/{dicom}")
    result = data("pull", "vindr_cxr", folder=folder, **PHYSIONET)
    assert result.returncode == 0, result.stderr
    ranges = [r for method, path, r in hosts.requests if path.endswith(dicom) and method == "GET"]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    root = folder / "vindr_cxr"
    assert {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} == {*served, sources.LOCK_FILE}
    assert all((root / name).read_bytes() == content for name, content in served.items())

    # verify names a changed and a missing file, each in one line
    changed = root / "annotations" / "image_labels_test.csv"
    changed.write_bytes(changed.read_bytes() + b"\n")
    (root / dicom).unlink()
    result = data("verify", "vindr_cxr", folder=folder)
    lines = flat(result).split("error: ")
    assert result.returncode == 2
    assert any(line.startswith(f"{changed}: changed since it was pulled") for line in lines)
    assert any(line.startswith(f"{root / dicom}: missing (pulled with SHA-256") for line in lines)


def test_ms_cxr_pulls_the_mimic_images_its_csv_names(hosts, tmp_path):
    """Two credentialed PhysioNet projects: MS-CXR's csv, then each MIMIC-CXR-JPG image its ``path`` column names."""
    from xbench_pl.data.ms_cxr import DEMO_CSV, write_ms_cxr_demo

    native = write_ms_cxr_demo(tmp_path / "native")
    table = (native / DEMO_CSV).read_bytes()
    hosts.physionet["ms-cxr/1.1.0/MS_CXR_Local_Alignment_v1.1.0.csv"] = table
    images = {p.relative_to(native).as_posix(): p.read_bytes() for p in native.rglob("*.jpg")}
    hosts.physionet.update({f"mimic-cxr-jpg/2.1.0/{name}": content for name, content in images.items()})
    hosts.physionet["mimic-cxr-jpg/2.1.0/files/p99/p99999999/s1/unrelated.jpg"] = b"not pulled"
    folder = tmp_path / "data"
    result = data("pull", "ms_cxr", folder=folder, **PHYSIONET)
    assert result.returncode == 0, result.stderr
    root = folder / "ms_cxr"
    assert {p.relative_to(root).as_posix() for p in root.rglob("*.jpg")} == set(images)
    said, problems = verify("ms_cxr", root)
    assert problems == [f"ms_cxr: 13 pairs under {root}, split all has 1,162"]


def test_covid_pull_lists_the_github_folder(hosts, tmp_path):
    """GitHub's trees API lists the masks; only the masked images' files are pulled (the others are not evaluated)."""
    stem = STEMS[0]
    native = write_covid(tmp_path / "native", {stem: opacity_mask()}, {})
    (native / "covid_rural_patient_info.csv").write_text("PATIENT_ID,AGE,SEX\nCOVID-19-AR-1,50,F\n")
    served = serve_folder(hosts.raw, f"{COVID_REPO}/", native)
    folder = tmp_path / "data"
    result = data("pull", "covid_rural", folder=folder)
    assert result.returncode == 0, result.stderr
    root = folder / "covid_rural"
    wanted = {"covid_rural_patient_info.csv", f"pngs_masks/{stem}.png", f"jpgs/{stem}.jpg", f"jpgs/jsons/{stem}.json"}
    assert {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} == {*wanted, sources.LOCK_FILE}
    assert all((root / name).read_bytes() == served[name] for name in wanted) and len(served) > len(wanted)
    said, problems = verify("covid_rural", root)
    assert problems == [f"covid_rural: 1 images under {root}, split masked has 193"]


def test_chestx_det10_unpacks_its_archive(hosts, tmp_path, monkeypatch):
    """A plain host's zip is downloaded whole, unpacked into the folder (its inner folder kept) and locked; the test
    json comes from GitHub; verify names the pinned ids the folder lacks."""
    pinned = sources.eval_set("chestx_det10", "test").ids()
    archive = BytesIO()
    with zipfile.ZipFile(archive, "w") as bundle:
        from test_nih_demo import write_png

        for name in pinned[:2]:
            write_png(tmp_path / name, size=(32, 32))
            bundle.write(tmp_path / name, f"test_data/{name}")
    hosts.plain["xraychallenge/test_data.zip"] = archive.getvalue()
    entries = [{"file_name": name, "syms": [], "boxes": []} for name in pinned[:2]]
    hosts.raw["Deepwise-AILab/ChestX-Det10-Dataset/master/test.json"] = json.dumps(entries).encode()
    hosts.raw["Deepwise-AILab/ChestX-Det10-Dataset/master/train.json"] = b"[]"
    monkeypatch.setenv("XBENCH_URL_CHESTX_DET10", f"{hosts.url}/plain/xraychallenge")
    folder = tmp_path / "data"
    result = data("pull", "chestx_det10", folder=folder)
    assert result.returncode == 0, result.stderr
    root = folder / "chestx_det10"
    assert sorted(p.name for p in (root / "test_data").iterdir()) == pinned[:2]
    assert json.loads((root / sources.LOCK_FILE).read_text())["files"]["test_data.zip"]["extracted"] is True
    said, problems = verify("chestx_det10", root)
    assert len(problems) == 540 and problems[0].startswith(f"chestx_det10: {pinned[2]}: pinned in split test")


def test_a_changed_release_and_a_full_disk_place_nothing(hosts, tmp_path, monkeypatch):
    native = make_vindr(tmp_path / "native")
    serve_folder(hosts.physionet, "vindr-cxr/1.0.0/", native)
    folder = tmp_path / "data"
    for name, value in PHYSIONET.items():
        monkeypatch.setenv(name, value)
    sources.pull("vindr_cxr", folder, quiet=True)
    table = folder / "vindr_cxr" / "annotations" / "annotations_test.csv"
    table.unlink()
    hosts.physionet["vindr-cxr/1.0.0/annotations/annotations_test.csv"] += b"\n"
    with pytest.raises(sources.DataSourceError, match="differs from the lock's .*: the file changed on the host since it "
                                                      "was first pulled \\(nothing was placed"):
        sources.pull("vindr_cxr", folder, quiet=True)
    assert not table.exists()

    def full(path, mode="r", *args, **kwargs):
        if "incomplete" in str(path) and "b" in mode and mode[0] in "wa":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(sources, "open", full, raising=False)
    with pytest.raises(sources.DataSourceError, match="no space left on the device; make room .* pull again: it resumes"):
        sources.pull("vindr_cxr", folder, quiet=True)
    assert not table.exists()


def test_a_pull_killed_mid_file_resumes_where_it_stopped(hosts, tmp_path):
    """SIGKILL while a file streams: the next pull continues the partial file (Range) and places the whole file."""
    native = make_vindr(tmp_path / "native")
    served = serve_folder(hosts.physionet, "vindr-cxr/1.0.0/", native)
    dicom = next(name for name in served if name.endswith(".dicom"))
    hosts.physionet[f"vindr-cxr/1.0.0/{dicom}"] = served[dicom] = served[dicom] + os.urandom(1 << 20)
    hosts.stall.add(f"/physionet/vindr-cxr/1.0.0/{dicom}")
    folder = tmp_path / "data"
    environ = {**os.environ, **hosts.environ(), **PHYSIONET}
    process = subprocess.Popen([sys.executable, "-m", "xbench_pl", "data", "pull", "vindr_cxr", "--dir", str(folder),
                                "--quiet"], cwd=REPO, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = folder / sources.PARTIAL / "vindr_cxr" / f"{dicom}.incomplete"
    deadline = time.monotonic() + 60
    while not (partial.is_file() and partial.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    process.send_signal(signal.SIGKILL)
    process.wait()
    kept = partial.stat().st_size
    assert 0 < kept < len(served[dicom]) and not (folder / "vindr_cxr" / dicom).exists()
    hosts.stall.clear()
    result = data("pull", "vindr_cxr", folder=folder, **PHYSIONET)
    assert result.returncode == 0, result.stderr
    assert (folder / "vindr_cxr" / dicom).read_bytes() == served[dicom]
    assert ("GET", f"/physionet/vindr-cxr/1.0.0/{dicom}", f"bytes={kept}-") in hosts.requests


def test_a_hand_placed_file_is_kept_and_said_unverified(hosts, tmp_path):
    native = make_vindr(tmp_path / "native")
    serve_folder(hosts.physionet, "vindr-cxr/1.0.0/", native)
    root = tmp_path / "data" / "vindr_cxr"
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "annotations_test.csv").write_bytes((native / "annotations" / "annotations_test.csv").read_bytes())
    result = data("pull", "vindr_cxr", folder=tmp_path / "data", **PHYSIONET)
    assert result.returncode == 0 and "1 already there, placed by hand (unverified)" in " ".join(result.stdout.split())
    said, problems = verify("vindr_cxr", root)
    assert "1 file(s) placed by hand, unverified (not downloaded by data pull)" in said


def test_manual_source_says_what_to_do(tmp_path):
    result = data("pull", "chexlocalize", folder=tmp_path)
    text = " ".join(result.stderr.split())
    assert result.returncode == 2 and text.count("error:") == 1
    assert "no programmatic download" in text and "azcopy" in text and str(tmp_path / "chexlocalize") in text


def test_a_sweep_reads_datasets_by_name_once_pulled(tmp_path, monkeypatch):
    """The paper sweep names no data root: its dry run asks for each dataset the runs read and `data pull` has not
    placed, and nothing once it is there."""
    from xbench_pl.commands.sweep import data_problems

    monkeypatch.setenv(sources.DATA_ENV, str(tmp_path))
    argv = ["--data", "pooled", "--data.datasets", "[nih_bbox, demo]"]
    assert data_problems(argv) == [f"--data nih_bbox: no --data.root, and not pulled into {tmp_path / 'nih_bbox'} "
                                   "(python -m xbench_pl data pull nih_bbox)"]
    (tmp_path / "nih_bbox").mkdir()
    assert data_problems(argv) == [] and data_problems(["--data", "nih_bbox"]) == []
