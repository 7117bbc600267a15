"""The report's section on generative models (``commands/report/generative.py``): the stated-box metrics beside the
map metrics and their self-consistency, the runs whose box and map disagree named, the samples that draw the map, the
ground truth and the stated boxes, rendered in a headless browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from test_cli import in_process

from xbench_pl.commands import main as cli_main


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("generative_report")
    for name, extra in (("oracle", []), ("mirrored", ["--model.mirrored_map", "true"])):
        run = in_process("test", "--model", "fixture_models.OracleBoxModel", *extra, "--model.bootstrap", "20", "--data", "demo",
                         "--data.classes", "[Nodule, Mass]", "--config", "callbacks/png.yaml", "--out", str(tmp / name))
        assert run.returncode == 0, run.stderr[-3000:]
    assert cli_main(["report", str(tmp / "oracle"), str(tmp / "mirrored"), "--out", str(tmp / "out")]) == 0
    return tmp


def test_the_section_sets_the_boxes_beside_the_maps_and_names_the_run_that_looks_elsewhere(report):
    text = (report / "out" / "report.md").read_text()
    assert "## Generative models" in text
    generative = json.loads((report / "out" / "report.json").read_text())["generative"]["demo"]
    assert len(generative) == 2
    oracle, mirrored = sorted(generative, key=lambda r: r["self_consistency_mass"])[::-1]
    assert oracle["box_acc@0.5"] == mirrored["box_acc@0.5"] == 1  # both state the truth
    assert oracle["pointing_game"] == 1 and mirrored["pointing_game"] == 0  # one map looks there, one at the mirror
    assert mirrored["self_consistency_mass"] == 0 and oracle["self_consistency_mass"] > 0.85
    named = [line for line in text.splitlines() if "its boxes are right where its maps look elsewhere" in line]
    assert len(named) == 1 and mirrored["run"] in named[0]
    assert text.count("stated box(es)") >= 2  # the samples, captioned


def test_the_section_renders_in_a_headless_browser(report):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium (apt-get install -y chromium) for the browser test")
    page = (report / "out" / "report.html").resolve().as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,2200"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", page], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "Generative models" in dom and "map mass in own box" in dom
    loaded = re.search(r'data-images="(\d+)/(\d+)"', dom)
    assert loaded and loaded.group(1) == loaded.group(2) and int(loaded.group(1)) >= 4  # every image decoded
