"""Replaying a prediction store (``xbench_pl.prediction_store``) into the benchmark's metrics: ``score
--predictions DIR``, ``compare``, ``score --maps``/``--boxes`` (maps and boxes made elsewhere, fed the same way)
and a resumed ``test`` run. ``replay`` judges batches rebuilt from the stored affine, sizes and maps and the dataset's
labels and regions with ``judging.Judge``, which ``ZeroShotModel.test_step`` judges a live forward with. No Lightning
is imported here.
"""

from __future__ import annotations

import torch

from xbench_pl.console import QUIET_SECONDS, ProgressLines
from xbench_pl.data.base import Batch, XBenchData, XBenchDataset
from xbench_pl.judging import Judge, ZeroShotOutput
from xbench_pl.prediction_store import Store, StoreError

#: native-map pixels of one replayed metric update at most: the metrics' float64 temporaries of large maps (box
#: maps on the eval grid, full-image maps) stay a few hundred MB, flat in the number of images, whatever ``chunk``
UPDATE_PIXELS = 2**22


class Replayer(Judge):
    """A ``Judge`` of stored predictions on ``device`` (fixed here: the metrics are created there), without a model:
    ``replay`` feeds it batches rebuilt from a store, judged exactly as in the run that made them; ``settings``:
    ``Judge``'s arguments (``judging.judge_settings`` of that run)."""

    def __init__(self, device: torch.device | str = "cpu", states_boxes: bool = False, **settings):
        super().__init__(**settings)
        self.device = torch.device(device)
        self.STATES_BOXES = states_boxes  # a store of a model that states boxes: its datasets get the box keys


def images_per_update(chunk: int, classes: int, height: int, width: int) -> int:
    """Images of ``classes`` maps of ``height x width`` fed to one metric update: ``chunk``, fewer where their
    pixels pass ``UPDATE_PIXELS`` (at least one)."""
    return max(1, min(chunk, UPDATE_PIXELS // (classes * height * width)))


def replay(judge: Judge, dataset, shard: dict, skip: set | None = None, chunk: int = 64) -> list[str]:
    """Feed a shard's images that ``dataset`` evaluates (minus ``skip``) into ``judge.benchmark``
    (``Judge.update_metrics``, as ``ZeroShotModel.test_step``): a ``Batch`` is rebuilt from the stored affine, original
    size and input size and the dataset's labels and regions (``XBenchDataset.targets``: no image
    is read), and the model's answer is the stored scores and native maps. Returns the image ids fed.

    Images go in groups of ``chunk``, fewer for large maps (``images_per_update``). Grounding sums are int64
    fixed point and recognition counts exact, so the order and grouping of images do not change a digit: a
    float32 store replays bit-identically.
    """
    if list(shard["classes"]) != list(dataset.classes):
        raise StoreError(f"{shard.get('path', 'a shard')}: classes {list(shard['classes'])} differ from the dataset's "
                         f"{list(dataset.classes)}")
    position = {record.image_id: i for i, record in enumerate(dataset.records)}
    device = judge.device  # where its metrics live
    judge.region_datasets[dataset.name] = dataset  # full-resolution regions, for cxl mode
    skip = skip or set()
    rows = [row for row, image_id in enumerate(shard["image_ids"]) if image_id in position and image_id not in skip]
    size = int(shard["input_size"])
    step = images_per_update(chunk, *shard["saliency"].shape[1:])
    fed = []
    for start in range(0, len(rows), step):
        part = torch.tensor(rows[start:start + step], dtype=torch.long)
        ids = [shard["image_ids"][r] for r in part.tolist()]
        original_size = shard["original_size"][part]
        labels, masks, region_index = [], [], []
        for b, image_id in enumerate(ids):
            height, width = (int(v) for v in original_size[b])
            label, mask, region_class = dataset.targets(position[image_id], height, width)
            labels.append(label)
            masks.append(mask)
            region_index.append(torch.stack((torch.full_like(region_class, b), region_class), dim=1))
        n = len(ids)
        batch = Batch(
            images=torch.zeros((), device=device).expand(n, 3, size, size),  # only its shape is read: the input size
            image_ids=ids, datasets=[dataset.name] * n, classes=list(dataset.classes),
            patient_ids=[dataset.records[position[i]].patient_id for i in ids],  # the bootstrap's unit, as in the run
            groups=[dict(dataset.records[position[i]].groups) for i in ids],  # subgroups (--model.groups), as in the run
            original_size=original_size.to(device), affine=shard["affine"][part].to(device),
            labels=torch.stack(labels).to(device), region_masks=torch.cat(masks).to(device),
            region_index=torch.cat(region_index).to(device),
            index=torch.tensor([position[i] for i in ids], device=device), counted=torch.ones(n, dtype=torch.bool, device=device),
        )
        answer = ZeroShotOutput(scores=shard["scores"][part].to(device), saliency=shard["saliency"][part].to(device),
                                stated=shard["stated"].rows(part) if "stated" in shard else None)
        with torch.inference_mode():
            judge.update_metrics(batch, answer)
        fed += ids
    return fed


def metrics_replayer(datamodule: XBenchData, device: torch.device | str = "cpu", states_boxes: bool = False,
                     **settings) -> Replayer:
    """A ``Replayer`` (``Judge``'s ``settings``; ``states_boxes``: with the stated-box metrics) on ``device`` holding the
    metrics of every dataset of ``datamodule``, created in the order a test run creates them."""
    replayer = Replayer(device=device, states_boxes=states_boxes, **settings)
    for spec in datamodule.dataset_specs:
        replayer.add_dataset(spec.name, spec.classes)
    return replayer


def compute_tables(replayer: Replayer) -> dict[str, dict]:
    """Every dataset's table: ``{dataset: BenchmarkMetrics.compute()}``."""
    with torch.inference_mode():
        return {name: table.compute() for name, table in replayer.benchmark.items()}


def replay_store(store: Store, datamodule: XBenchData, metrics: dict, chunk: int = 64,
                 device: torch.device | str = "cpu") -> Replayer:
    """A ``Replayer`` whose ``benchmark`` holds every dataset's metrics fed from the store, on ``device``; ``metrics``:
    ``Judge``'s arguments (``judging.judge_settings``) to evaluate with."""
    good = store.load_intact()
    replayer = metrics_replayer(datamodule, device, states_boxes=any("stated" in shard for shard in good), **metrics)
    for child in datamodule.datamodules:
        dataset = XBenchDataset(child.name, child.prepare_records(), child.classes, None, child.eval_size)
        seen: set[str] = set()
        progress = ProgressLines(f"{child.name} from {store.root}", len(dataset), "images", after=QUIET_SECONDS)
        for shard in good:
            if shard["dataset"] == child.name:
                fed = replay(replayer, dataset, shard, skip=seen, chunk=chunk)
                seen.update(fed)
                progress.step(len(fed))
        missing = [r.image_id for r in dataset.records if r.image_id not in seen]
        if missing:
            raise StoreError(f"{store} lacks {len(missing)} of the {len(dataset)} image(s) of {child.name} (first: "
                             f"{missing[0]!r}): its run did not finish; continue it with test ... --predictions {store} --resume")
    return replayer


def rescore(store: Store, datamodule: XBenchData, metrics: dict, chunk: int = 64,
            device: torch.device | str = "cpu") -> dict[str, dict]:
    """Every dataset's table from the store: ``{dataset: BenchmarkMetrics.compute()}`` (``replay_store`` on ``device``)."""
    return compute_tables(replay_store(store, datamodule, metrics, chunk, device))
