"""The data contract every dataset follows: records in, model-ready batches out.

A dataset only has to turn its native files into ``Record``s (``load_records``); the base class
``XBenchData`` does splits, bad-input policy, the image check, decoding (optionally cached),
preprocessing, region rasterisation, batching and exact distributed sampling. It is a plain class, so
that reading a dataset needs no Lightning (``describe``, ``score``, ``compare``); each dataset's
``LightningDataModule``, which ``test`` and ``fit`` run, is its class name + ``Module`` in its own
module (``NIHBoxData`` -> ``NIHBoxDataModule``), built on first use (``registry.lightning_datamodules``,
``xbench_pl.data.lightning``).

Over 500 lines on purpose: the one data contract (``Record``, ``Batch``) and the base class that does
everything but reading native files for every dataset; a dataset module only adds ``load_records``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import torch
from jsonargparse.typing import NonNegativeInt, OpenUnitInterval, PositiveInt
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

from xbench_pl.console import note
from xbench_pl.data import sources, splits
from xbench_pl.data.annotations import checked_box
from xbench_pl.data.cache import CACHE_ENV, ImageStore
from xbench_pl.data.errors import DataError, Problem
from xbench_pl.data.io import read_image_header
from xbench_pl.data.regions import Box, Polygon, Region, rasterize_union
from xbench_pl.geometry import Preprocess

#: what a bad input does: stop the run naming it, or leave it out and report it (``XBenchData.report``)
OnError = Literal["raise", "skip"]


@dataclass
class Record:
    """One image of a dataset, as read from its native annotation files.

    ``labels`` maps canonical finding names to 0/1 (a finding not listed is 0);
    ``regions`` maps findings to their instances in original pixel coordinates;
    ``source`` names where the annotation came from (``file, row``) for error messages;
    ``region_sources`` (optional, parallel to ``regions``) gives each region's ``(file, row)``
    so that a region that does not fit its image is reported at its own row;
    ``patient_id`` (where the dataset records it) groups a patient's images: patient-level
    resampling and splits use it, else each image is its own unit;
    ``groups`` (where the dataset's metadata gives them) maps a subgroup name (``sex``, ``age``, ``view``) to the
    image's value (``xbench_pl.data.groups``): a name it lacks is ``unknown``;
    ``queries`` (phrase grounding) maps a finding to the text the model grounds for it in this sample (MS-CXR:
    the radiologist's phrase, whose boxes are the finding's region); a finding it lacks is queried by its name.
    """

    image_id: str
    path: Path
    labels: dict[str, int]
    regions: dict[str, list[Region]] = field(default_factory=dict)
    source: str = ""
    region_sources: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    patient_id: str | None = None
    groups: dict[str, str] = field(default_factory=dict)
    queries: dict[str, str] = field(default_factory=dict)

    def add_region(self, finding: str, region: Region, file: str | Path, row: int) -> None:
        self.regions.setdefault(finding, []).append(region)
        self.region_sources.setdefault(finding, []).append((str(file), row))


class Phrase(str):
    """A text a sample grounds in place of a finding's name (``Record.queries``): a model that prompts finding names
    by a table or template of its own leaves a ``Phrase`` as written where it must (RadZero); equal to and hashed as
    the plain string, so caches and prompt templates see the text itself."""


@dataclass
class Batch:
    """What every datamodule yields and every model's ``test_step`` consumes.

    images ``[B, 3, S, S]``: model-ready (the model's own ``Preprocess``).
    original_size ``[B, 2]``: (H, W) of each original image.
    affine ``[B, 4]`` float64: ``(sx, sy, tx, ty)``, original -> model input (``geometry``).
    labels ``[B, C]``: 0/1 per finding of ``classes``.
    region_masks ``[K, E, E]`` bool: one per (sample, finding) pair with a non-empty region,
    on the eval grid that uniformly covers the original image; region_index ``[K, 2]``
    gives each pair's (sample, class) index.
    index ``[B]``: position of each sample in its dataset.
    patient_ids: each sample's ``Record.patient_id`` (None where the dataset has none).
    groups: each sample's ``Record.groups`` (subgroup values; ``{}``: all unknown).
    queries: each sample's ``Record.queries`` (``{}``: every finding queried by its name; ``query_texts``).
    counted ``[B]`` bool: False only for the stand-in sample a DDP rank without data of its own
    processes so that it takes part in the metric sync (``EvalDistributedSampler``), or a loader
    whose images were all skipped (``skip_ids``) processes so that the test epoch still ends;
    models compute it, metrics never count it.
    """

    images: torch.Tensor
    image_ids: list[str]
    datasets: list[str]
    classes: list[str]
    original_size: torch.Tensor
    affine: torch.Tensor
    labels: torch.Tensor
    region_masks: torch.Tensor
    region_index: torch.Tensor
    index: torch.Tensor
    counted: torch.Tensor
    patient_ids: list[str | None] = field(default_factory=list)
    groups: list[dict[str, str]] = field(default_factory=list)
    queries: list[dict[str, str]] = field(default_factory=list)

    @property
    def dataset(self) -> str:
        return self.datasets[0]

    def query_texts(self) -> list[tuple[tuple[str, ...], torch.Tensor]]:
        """The texts the model grounds, as ``(texts [C], sample indices)`` groups in order of first appearance:
        each sample's ``queries`` in place of the class names it replaces. A class-name dataset is one group,
        ``(classes, all samples)``; a phrase dataset has a group per distinct phrase set."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for b in range(len(self.image_ids)):
            own = self.queries[b] if b < len(self.queries) else {}
            groups.setdefault(tuple(Phrase(own[name]) if name in own else name for name in self.classes), []).append(b)
        return [(texts, torch.tensor(samples, dtype=torch.long)) for texts, samples in groups.items()]


class XBenchDataset(Dataset):
    """Records -> samples: decode, preprocess for the model, rasterise regions on the eval grid."""

    def __init__(self, name: str, records: list[Record], classes: list[str], preprocess: Preprocess, eval_size: int,
                 images: ImageStore | None = None):
        self.name, self.records, self.classes = name, records, list(classes)
        self.preprocess, self.eval_size = preprocess, eval_size
        self.images = images or ImageStore()

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict:
        if index < 0:  # ~i: a stand-in copy of sample i, never counted (see EvalDistributedSampler)
            return {**self[~index], "counted": False}
        record = self.records[index]
        image, (height, width) = self.images(record.path)
        pixels, affine = self.preprocess(image)
        if image.shape != (height, width):
            # the decoded copy is the original rescaled per axis (w / W, h / H): fold it in so affine maps original -> input
            affine = affine * torch.tensor([image.shape[1] / width, image.shape[0] / height, 1.0, 1.0], dtype=affine.dtype)
        labels, region_masks, region_class = self.targets(index, height, width)
        return {
            "image": pixels,
            "image_id": record.image_id,
            "patient_id": record.patient_id,
            "groups": dict(record.groups),
            "queries": dict(record.queries),
            "dataset": self.name,
            "original_size": torch.tensor([height, width]),
            "affine": affine,
            "labels": labels,
            "region_masks": region_masks,
            "region_class": region_class,
            "index": index,
            "classes": self.classes,
            "counted": True,
        }

    def targets(self, index: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Record ``index``'s labels ``[C]`` (0./1.) and its regions on the eval grid of its ``height x width``
        original: masks ``[k, E, E]`` bool of the findings with a non-empty region and their class
        index ``[k]``. Reads no image (re-scoring a prediction store uses this alone)."""
        record = self.records[index]
        masks, region_class = [], []
        for c, name in enumerate(self.classes):
            regions = record.regions.get(name)
            if regions:
                mask = rasterize_union(regions, height, width, self.eval_size)
                if mask.any():
                    masks.append(torch.from_numpy(mask))
                    region_class.append(c)
        empty = torch.zeros((0, self.eval_size, self.eval_size), dtype=torch.bool)
        return (torch.tensor([float(record.labels.get(name, 0)) for name in self.classes]),
                torch.stack(masks) if masks else empty, torch.tensor(region_class, dtype=torch.long))


def collate(samples: list[dict]) -> Batch:
    region_index = [
        torch.stack((torch.full_like(s["region_class"], b), s["region_class"]), dim=1) for b, s in enumerate(samples)
    ]
    return Batch(
        images=torch.stack([s["image"] for s in samples]),
        image_ids=[s["image_id"] for s in samples],
        datasets=[s["dataset"] for s in samples],
        classes=samples[0]["classes"],
        original_size=torch.stack([s["original_size"] for s in samples]),
        affine=torch.stack([s["affine"] for s in samples]),
        labels=torch.stack([s["labels"] for s in samples]),
        region_masks=torch.cat([s["region_masks"] for s in samples]),
        region_index=torch.cat(region_index),
        index=torch.tensor([s["index"] for s in samples]),
        counted=torch.tensor([s["counted"] for s in samples]),
        patient_ids=[s["patient_id"] for s in samples],
        groups=[s.get("groups", {}) for s in samples],
        queries=[s.get("queries", {}) for s in samples],
    )


@dataclass(frozen=True)
class DatasetSpec:
    """What a model needs to know before testing: each dataset's name and finding list."""

    name: str
    classes: list[str]


class XBenchData:
    """Base of every dataset: its records, their checks and its data loaders (Lightning's hooks ``setup``,
    ``test_dataloader``, ``train_dataloader``, ``val_dataloader``, as plain methods).

    Subclasses set ``name`` and ``default_classes`` (optionally ``available_classes``, a superset
    ``classes`` may choose from) and implement ``load_records``.

    Args:
        root: folder of the dataset exactly as it unpacks from its official source; not given, the folder
            ``data pull NAME`` fills (``sources.default_root``) where it is there.
        split: the evaluation set (``sources.yaml``; ``data list`` shows each dataset's): which of the reader's own
            splits it reads and, for a set other than the default that pins its image ids, only those (a pinned id
            missing from the folder is a bad input). The default set (also when not given) is read whole and compared
            with its pinned ids (``evaluated_ids``).
        split_file: the image ids to evaluate (``read_split_file``): one id a line (a first line
            that is no image id of the dataset, such as ``image_id``, is a header), or a CSV with
            a header row and an ``image_id`` or ``id`` column (else its first column).
        classes: restrict/reorder the findings evaluated (canonical names).
        batch_size: images per batch.
        num_workers: DataLoader worker processes (0: load in the main process).
        eval_size: side of the evaluation grid that uniformly covers each original image;
            saliency and regions are compared there (default 512: see docs/architecture.md).
        on_error: ``"raise"`` (stop at the first bad input, naming file and row) or ``"skip"``
            (drop it, count it, report it in ``problems`` and in ``metrics.json``).
        preprocess: the model's input spec; not given, a Lightning run takes the model under test's
            (``XBenchDataModule``), and anything else that loads images must give one.
        cache_dir: folder of the decode cache (``xbench_pl.data.cache``); default: the
            ``XBENCH_CACHE_DIR`` environment variable, else no cache. Results do not depend on it.
        max_side: decode images to at most this long side before preprocessing (geometry stays
            exact, see ``ImageStore``); ``None`` (default) keeps full resolution.
        val_fraction: ``fit`` only: the share of patients (images where the dataset records none) held
            out for validation (``xbench_pl.data.splits``; official splits are used where the dataset has one).
        split_seed: ``fit`` only: the seed of that split and of the training shuffle.
        fit_split: ``fit`` only: a split file an earlier ``fit`` wrote (``OUT/split.csv``) to use instead.

    ``problems`` lists every bad input found (skipped, or corrected such as clipped boxes): the
    single source of what a run reports. Setup checks every image once, in parallel over
    ``num_workers``: its size (header only), or with ``on_error="skip"`` or a cache a full
    decode, so that an undecodable image is dropped and counted before testing (with a cache,
    that pass fills it). Regions are then fitted to their image and to the eval grid
    (``fit_regions``): clipped regions are reported, regions empty on the grid dropped and reported.
    """

    name: str = ""
    default_classes: tuple[str, ...] = ()
    available_classes: tuple[str, ...] = ()  # classes ``classes`` may ask for beyond the defaults (default: none)
    #: ``fit`` only (``splits.fit_pool``): the official split (a value of ``split``) that fit trains and
    #: validates on, for a dataset whose reader takes one; and the file name of an official test list whose
    #: images, when it is found under ``root``, fit leaves out
    fit_official_split: str | None = None
    fit_test_list: str | None = None
    #: whether setup's image check fills ``Record.groups`` from each DICOM's header (PatientSex, PatientAge,
    #: ViewPosition), in the header read that finds its size (``xbench_pl.data.groups``)
    dicom_groups: bool = False

    def __init__(
        self,
        root: str | None = None,
        split: str | None = None,
        split_file: str | None = None,
        classes: list[str] | None = None,
        batch_size: PositiveInt = 16,
        num_workers: NonNegativeInt = 0,
        eval_size: PositiveInt = 512,
        on_error: OnError = "raise",
        preprocess: Preprocess | None = None,
        cache_dir: str | None = None,
        max_side: PositiveInt | None = None,
        val_fraction: OpenUnitInterval = 0.2,
        split_seed: int = 0,
        fit_split: str | None = None,
    ):
        super().__init__()
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}")
        self.val_fraction, self.split_seed, self.fit_split = float(val_fraction), int(split_seed), fit_split
        # fit's sets (setup("fit")), where their images come from (splits.fit_pool), and where to save the split
        self.train_set: XBenchDataset | None = None
        self.val_set: XBenchDataset | None = None
        self.fit_source = ""
        self.split_out: Path | None = None
        if on_error not in get_args(OnError):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if eval_size < 1:
            raise ValueError(f"eval_size must be positive, got {eval_size}")
        self.root = Path(root) if root is not None else sources.default_root(self.name)
        self.eval_set = sources.eval_set(self.name, split)
        self.split = self.eval_set.reads if self.eval_set is not None else None  # the reader's own split
        self.split_file = split_file
        self.classes = list(classes) if classes else list(self.default_classes)
        allowed = self.available_classes or self.default_classes
        unknown = sorted(set(self.classes) - set(allowed))
        if unknown:
            raise ValueError(f"{self.name}: unknown classes {unknown}; this dataset has {list(allowed)}")
        self.batch_size, self.num_workers, self.eval_size = batch_size, num_workers, eval_size
        self.on_error, self.preprocess = on_error, preprocess
        self.images = ImageStore(cache_dir or os.environ.get(CACHE_ENV) or None, max_side)
        self.problems: list[Problem] = []
        self.image_sizes: dict[str, tuple[int, int]] = {}  # per checked record's id, its image's (H, W) (check_images)
        self.test_set: XBenchDataset | None = None
        # image ids already evaluated elsewhere (a resumed prediction store): the test loader leaves them out
        self.skip_ids: set[str] = set()
        # where a pooled parent's --data.root expected this dataset's folder, when it is missing
        self.expected_root: Path | None = None

    # -- what a dataset implements ---------------------------------------------------------
    def load_records(self) -> list[Record]:
        raise NotImplementedError

    def checked_root(self, layout: str) -> Path:
        """``root``, or a ``DataError`` naming ``--data.root`` when it is not set or is no folder; ``layout``
        says what the folder holds (the dataset as it unpacks)."""
        problem = sources.root_problem(self.name, self.root, layout)
        if problem:
            raise DataError("--data.root", problem)
        return self.root

    # -- bad input ---------------------------------------------------------------------------
    def report(self, error: DataError) -> None:
        """Raise, or (``on_error='skip'``) count the problem and go on.

        A problem that was corrected, not dropped (``action != "skipped"``), is recorded in
        both modes.
        """
        if self.on_error == "raise" and error.problem.action == "skipped":
            raise error
        self.problems.append(error.problem)

    # -- Lightning's hooks, as plain methods ---------------------------------------------------
    @property
    def datamodules(self) -> list[XBenchData]:
        """The datasets this module evaluates, each reported on its own: itself (pooled: its children)."""
        return [self]

    @property
    def dataset_specs(self) -> list[DatasetSpec]:
        return [DatasetSpec(dm.name, dm.classes) for dm in self.datamodules]

    def resolve_preprocess(self) -> Preprocess:
        """The preprocessing to apply: as given, else that of the model under test (looked up anew
        at every setup, so one datamodule can serve several models in turn)."""
        preprocess = self.preprocess if self.preprocess is not None else self.model_preprocess()
        if preprocess is None:
            raise ValueError(f"{self.name}: no preprocess given and no model to take it from")
        return preprocess

    def model_preprocess(self) -> Preprocess | None:
        """The preprocessing of the model under test: none outside a Lightning run (``XBenchDataModule``'s is its
        trainer's model's)."""
        return None

    def is_rank_zero(self) -> bool:
        """Whether this process writes the dataset's files (``split_out``): always, outside a Lightning run
        (``XBenchDataModule``: on the global rank zero only)."""
        return True

    def setup(self, stage: str | None = None) -> None:
        if stage in ("fit", "validate"):
            self.build_fit_sets(self.resolve_preprocess())
        else:
            self.build_test_set(self.resolve_preprocess())

    def build_fit_sets(self, preprocess: Preprocess) -> None:
        """``fit``'s training and validation sets (``xbench_pl.data.splits``): the dataset's official
        non-test images where it has them, split by patient (or read from ``fit_split``); the split is
        written to ``split_out`` when set (rank zero only: every rank computes the same split)."""
        if self.train_set is None:
            pool, self.fit_source = splits.fit_pool(self)
            if self.fit_split:
                assignment = splits.read_split(self.fit_split, pool, self.report)
                self.fit_source += f"; split as in {self.fit_split}"
            else:
                assignment = splits.patient_split(pool, self.val_fraction, self.split_seed)
            chosen = {name: [r for r in pool if assignment.get(r.image_id) == name] for name in splits.SETS}
            self.train_set = XBenchDataset(self.name, chosen["train"], self.classes, preprocess, self.eval_size, self.images)
            self.val_set = XBenchDataset(self.name, chosen["val"], self.classes, preprocess, self.eval_size, self.images)
            if self.split_out is not None and self.is_rank_zero():
                splits.write_split(self.split_out, pool, assignment)
        for part in (self.train_set, self.val_set):
            part.preprocess = preprocess

    def build_test_set(self, preprocess: Preprocess) -> None:
        """The evaluated set for ``preprocess``; records are read and checked once, on first use."""
        if self.test_set is not None and self.test_set.preprocess == preprocess:
            return
        first = self.test_set is None
        records = self.test_set.records if not first else self.prepare_records()
        self.test_set = XBenchDataset(self.name, records, self.classes, preprocess, self.eval_size, self.images)
        if first and self.eval_set is not None and self.is_rank_zero():  # which images, said before they are scored
            note(sources.identity_line(self.name, self.evaluated_ids()))

    def prepare_records(self) -> list[Record]:
        """Load, split and check the records to evaluate; ``problems`` lists what was wrong."""
        self.problems = []
        try:
            loaded = self.load_records()
        except DataError as error:
            if self.root is None and self.expected_root is not None:
                raise DataError(self.expected_root, f"dataset folder not found (the pooled --data.root "
                                f"{self.expected_root.parent} needs one folder per dataset, named as the dataset; or give "
                                f"{self.name} its own root in --data.datasets)") from error
            raise
        records = self.check_images(self.apply_split(loaded))
        if not records:
            raise DataError(self.root or self.name, f"{self.name}: no images left to evaluate"
                            + (f" ({len(self.problems)} problem(s), first: {self.problems[0]})" if self.problems else ""))
        return records

    def check_images(self, records: list[Record]) -> list[Record]:
        """Find each image's size (decoding it fully in skip mode or when caching; kept in ``image_sizes``); drop the
        unreadable ones, and fit every region to its image."""
        decode = self.on_error == "skip" or self.images.cache_dir is not None
        probe = DataLoader(_ImageProbe(records, self.images, decode, self.dicom_groups), batch_size=None,
                           num_workers=self.num_workers, collate_fn=_identity)
        kept = []
        for index, size, groups in probe:
            record = records[index]
            if isinstance(size, Problem):
                # the image's own file, at the row of the annotation table that lists it
                self.report(DataError(size.file, f"{size.reason} (image of {record.source})", row=source_file_row(record.source)[1]))
                continue
            if groups is not None:
                record.groups = groups
            if self.fit_regions(record, *size):
                self.image_sizes[record.image_id] = size
                kept.append(record)
        return kept

    def fit_regions(self, record: Record, height: int, width: int) -> bool:
        """Fit each region to its image and to the eval grid; every change is reported. Returns whether the record
        stays (here always; a dataset whose files declare each image's size refuses an image of another, ``ms_cxr``).

        A box reaching outside the image is clipped to it, and a polygon with a point outside
        the image extent ``[0, W] x [0, H]`` keeps its points (its fill is cut at the image
        edge, exactly the polygon's intersection with the image): both are kept and reported
        (action ``clipped``). A region that covers no eval-pixel centre (smaller than one eval
        pixel, or a polygon outside the image) would silently count as no region: it is
        dropped and reported (action ``empty_on_grid``). Both actions are recorded in either
        ``on_error`` mode. A region that cannot fit (a box wholly outside, a mask of another
        size) is a bad input (action ``skipped``).
        """
        for finding, regions in record.regions.items():
            sources = record.region_sources.get(finding) or [source_file_row(record.source)] * len(regions)
            kept = []
            for region, (file, row) in zip(regions, sources):
                try:
                    fitted, clipped = fit_region(region, height, width)
                    if not fitted.rasterize(height, width, self.eval_size).any():
                        self.report(DataError(file, f"{finding} {_describe(region)} {self.why_empty(fitted, height, width)}; "
                                                    "dropped", row=row, action="empty_on_grid"))
                        continue
                except ValueError as error:
                    self.report(DataError(file, f"{finding} region does not fit the {width}x{height} image of "
                                                f"{record.image_id}: {error}", row=row))
                    continue
                if clipped:
                    self.report(DataError(file, f"{finding} {_describe(region)} extends outside the {width}x{height} "
                                                f"image: {clipped}", row=row, action="clipped"))
                kept.append(fitted)
            record.regions[finding] = kept
        return True

    def why_empty(self, region: Region, height: int, width: int) -> str:
        """Why ``region`` covers no eval-pixel centre: outside the image, or too small for the grid."""
        if not isinstance(region, Box) and not region.rasterize(height, width, max(height, width)).any():
            return f"covers no pixel of the {width}x{height} image (it lies outside it)"
        size = self.eval_size
        return (f"is smaller than one pixel of the {size}x{size} eval grid ({width / size:.3g} x {height / size:.3g} "
                f"original pixels) and covers no eval-pixel centre; a larger --data.eval_size keeps it")

    def apply_split(self, records: list[Record]) -> list[Record]:
        """The records of an evaluation set that keeps its pinned ids (``EvalSet.restricts``; each pinned id the
        annotations lack is a bad input), then of ``split_file``."""
        pinned = self.eval_set.ids() if self.eval_set is not None and self.eval_set.restricts else None
        if pinned is not None:
            by_id = {r.image_id: r for r in records}
            for line, image_id in enumerate(pinned, start=1):
                if image_id not in by_id:
                    self.report(DataError(sources.EVAL_SETS / self.eval_set.ids_file, f"image id {image_id!r} of split "
                                          f"{self.eval_set.name} is not in the {self.name} annotations under {self.root}",
                                          row=line))
            records = [by_id[i] for i in pinned if i in by_id]
        if self.split_file is None:
            return records
        by_id = {r.image_id: r for r in records}
        wanted = splits.read_split_file(self.split_file, by_id)
        if not wanted:
            raise DataError(self.split_file, "split file lists no image ids")
        for image_id, line in wanted.items():
            if image_id not in by_id:
                self.report(DataError(self.split_file, f"image id {image_id!r} is not in the {self.name} annotations", row=line))
        return [by_id[i] for i in wanted if i in by_id]

    def evaluated_ids(self) -> dict | None:
        """Which images this run evaluates, against its evaluation set (``sources.compare_ids``: what ``metrics.json``
        records); None for a generated dataset or before setup."""
        if self.eval_set is None or self.test_set is None:
            return None
        return sources.compare_ids(self.eval_set, [r.image_id for r in self.test_set.records])

    def test_dataloader(self) -> DataLoader:
        if self.test_set is None:  # set up for fit: the evaluated set is built on first use
            self.build_test_set(self.resolve_preprocess())
        return self.make_loader(self.test_set, skip=self.skip_ids)

    def fit_set(self, which: str) -> XBenchDataset:
        part = self.train_set if which == "train" else self.val_set
        if part is None:
            if self.datamodules != [self]:
                raise ValueError(f"{self.name}: fit trains on one dataset; this module pools "
                                 f"{[dm.name for dm in self.datamodules]}: fit on each with --data NAME")
            raise ValueError(f"{self.name}: no {which} set: set up with stage 'fit' first")
        return part

    def train_dataloader(self) -> DataLoader:
        """The training images, shuffled anew every epoch from ``split_seed`` (under DDP a plain
        ``DistributedSampler``, which pads each rank to equal length; Lightning calls its ``set_epoch``)."""
        dataset = self.fit_set("train")
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            sampler = DistributedSampler(dataset, shuffle=True, seed=self.split_seed)
        else:
            sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(self.split_seed))
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          collate_fn=collate, persistent_workers=False)

    def val_dataloader(self) -> DataLoader:
        """The validation images, each exactly once over the ranks (``make_loader``, as testing)."""
        return self.make_loader(self.fit_set("val"))

    def make_loader(self, dataset: XBenchDataset, skip: set[str] | frozenset = frozenset()) -> DataLoader:
        """Every sample of ``dataset`` but those whose image id is in ``skip``, each exactly once over the ranks."""
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        indices = [i for i, record in enumerate(dataset.records) if record.image_id not in skip] if skip else None
        if distributed:
            sampler = EvalDistributedSampler(dataset, indices)
        else:  # nothing left: one stand-in (never counted), so that the test loop, and its epoch end, still run
            sampler = None if indices is None else (indices or [~0])
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            shuffle=False,
            num_workers=self.num_workers,
            collate_fn=collate,
            persistent_workers=False,
        )


class EvalDistributedSampler(DistributedSampler):
    """Rank r of W takes samples r, r + W, r + 2W, ...: every sample exactly once, none padded in.

    Lightning's (and torch's) distributed samplers pad uneven data with duplicates, which
    would count some images twice. A rank left with no sample (fewer images than ranks) gets
    one stand-in, ``~0``: the dataset returns sample 0 marked ``counted=False``, which models
    compute and metrics skip; without it Lightning would skip that rank's test loop and the
    other ranks would wait forever in the metric sync. A ``DistributedSampler`` subclass, so
    Lightning keeps it instead of injecting its own.
    """

    def __init__(self, dataset: Dataset, indices: list[int] | None = None):
        super().__init__(dataset, shuffle=False, drop_last=False)
        kept = list(range(len(dataset))) if indices is None else list(indices)  # ``indices``: a subset to sample
        self.indices = kept[self.rank::self.num_replicas] or [~0]
        self.num_samples = self.total_size = len(self.indices)

    def __iter__(self):
        return iter(self.indices)


class _ImageProbe(Dataset):
    """Setup's image check: ``(index, (H, W), groups)``, or ``(index, Problem, None)`` for an unreadable image;
    ``groups`` (``dicom_groups``: a DICOM's header subgroups, else None) come from the header read that gives
    the size, or from one header read after a full decode."""

    def __init__(self, records: list[Record], images: ImageStore, decode: bool, dicom_groups: bool = False):
        self.paths, self.images, self.decode = [r.path for r in records], images, decode
        self.dicom_groups = dicom_groups

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, tuple[int, int] | Problem, dict[str, str] | None]:
        path = self.paths[index]
        try:
            if self.decode:
                size = self.images.load(path)[1]
                groups = read_image_header(path, True)[1] if self.dicom_groups else None
            else:
                size, groups = read_image_header(path, self.dicom_groups)
        except DataError as error:
            return index, error.problem, None
        return index, tuple(size), groups


def source_file_row(source: str) -> tuple[str, str | None]:
    """``Record.source`` (``"FILE, row N"`` or ``"FILE"``) as ``(FILE, "N" or None)``."""
    file, sep, row = source.rpartition(", row ")
    return (file, row) if sep and row else (source, None)


def _identity(sample):
    return sample


def fit_region(region: Region, height: int, width: int) -> tuple[Region, str]:
    """``region`` fitted to the ``width x height`` image, and what clipping did to it (``""``: nothing).

    ``ValueError`` for a box wholly outside (a mask of another size fails when rasterised).
    """
    if isinstance(region, Box):
        box, changed = checked_box(region.x0, region.y0, region.x1, region.y1, height, width)
        return box, f"clipped to {_xyxy(box)}" if changed else ""
    if isinstance(region, Polygon):
        outside = [(x, y) for x, y in region.points if not (0 <= x <= width and 0 <= y <= height)]
        return region, (f"{len(outside)} point(s) outside (first: ({outside[0][0]:g}, {outside[0][1]:g})); "
                        "its fill is cut at the image edge") if outside else ""
    return region, ""


def _describe(region: Region) -> str:
    if isinstance(region, Box):
        return f"box {_xyxy(region)}"
    if isinstance(region, Polygon):
        return f"polygon of {len(region.points)} points"
    return "mask"


def _xyxy(box: Box) -> str:
    return "(" + ", ".join(f"{v:g}" for v in (box.x0, box.y0, box.x1, box.y1)) + ")"
