"""Multi-node through Lightning: 2 "nodes" x 1 process on localhost (Lightning's cluster environment
variables, as a job script sets them) give the metrics.json of one process (this one: the nodes are
subprocesses). 11 images over 2 ranks: an odd split, whose padding copy must not count."""

import json
from pathlib import Path

import pytest
from test_cli import finish, free_port, in_process, start

from xbench_pl.data.nih_bbox import DemoData


def two_nodes(args: list[str], out: Path) -> None:
    """``test ARGS`` as 2 nodes x 1 process on localhost (``out/node0``, ``out/node1``); both must exit 0."""
    port = str(free_port())
    nodes = [start([*args, "--trainer.num_nodes", "2", "--trainer.devices", "1", "--out", str(out / f"node{rank}")],
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(rank), WORLD_SIZE="2")
             for rank in (0, 1)]
    for rank, node in enumerate(finish(nodes)):
        assert node.returncode == 0, f"node {rank}: {node.stderr[-3000:]}"


def eleven_images(tmp_path: Path, accelerator: str) -> list[str]:
    """``test`` options on the first 11 demo images (an odd split over 2 ranks) with the pixel-dependent model."""
    split = tmp_path / "split.csv"
    split.write_text("image_id\n" + "\n".join(sorted(r.image_id for r in DemoData().load_records())[:11]) + "\n")
    return ["test", "--model", "fixture_models.IntensityModel", "--data", "demo", "--data.split_file", str(split),
            "--data.batch_size", "3", "--trainer.accelerator", accelerator, "--model.bootstrap", "50"]


def eleven_images_on_two_nodes(folder: Path) -> list[str]:
    """The background job of the test below: the run on 2 nodes (``folder/node0``, ``folder/node1``); its options."""
    common = eleven_images(folder, "cpu")
    two_nodes([*common, "--trainer.strategy", "ddp"], folder)
    return common


@pytest.mark.background(job=eleven_images_on_two_nodes)
def test_two_nodes_one_process_each_equal_one_process(background):
    folder, common = background
    one = in_process(*common, "--out", str(folder / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    assert not (folder / "node1" / "metrics.json").exists()  # global rank 0 (node 0) writes the report
    a, b = (json.loads((folder / run / "metrics.json").read_text()) for run in ("one", "node0"))
    assert (a.pop("provenance")["world_size"], b.pop("provenance")["world_size"]) == (1, 2)
    assert json.dumps(a) == json.dumps(b)  # every number, byte for byte
    mean = a["datasets"]["demo"]["mean"]
    assert mean["n_pos"] + mean["n_neg"] == 11 * 8  # every image exactly once, no padding duplicates
    assert 0.0 < mean["auroc"] < 1.0 and mean["auroc"] != 0.5  # scores depend on the pixels
