"""The ``demo`` data: synthetic chest-radiograph phantoms with lesions at known regions.

Nothing here is a real patient. Each image is drawn from a seed (numpy, PIL and pydicom
only): soft-tissue body, two dark lung fields with branching vessel markings, a bright
heart and mediastinum, spine, ribs and clavicles as curved bright bands, low-frequency and
fine noise, vignetting. Lesions are then added; each is a shape (its mask) and changes no pixel outside it, so its
region is known exactly:

==================  ======================================================================
Nodule              small bright disc (radius 9-18 px at 512²)
Mass                larger lobulated bright blob (radius 24-54 px)
Cardiomegaly        the heart drawn 1.25-1.45x larger (region: the enlarged heart)
Pleural Effusion    fluid density filling a lung base under a meniscus rising laterally
Pneumothorax        a dark rim without lung markings around the collapsed lung, with its
                    pleural line (small apical to large)
Atelectasis         plate-like dense band in a lower zone
Infiltration        patchy streaks in one zone
Pneumonia           dense consolidation of overlapping lobes in one zone
==================  ======================================================================

``write_demo(root, seed)`` writes two datasets in the real formats, so the demo goes
through the same readers as the real data::

    root/README.md
    root/nih/BBox_List_2017.csv          NIH header and spellings (Effusion, Infiltrate); one box
                                         per lesion: the tight integer box around its mask (xywh)
    root/nih/Data_Entry_2017_v2020.csv   NIH label table: the boxed images, and No Finding ones
    root/nih/images/phantom_NNN.png      512², 8-bit grey (one RGBA, as some NIH PNGs are)
    root/siim/train-rle.csv              SIIM header (" EncodedPixels"), relative column-major
                                         RLE of each pneumothorax mask, -1 for negatives
    root/siim/dicom-images-train/<study>/<series>/<SOPInstanceUID>.dcm
                                         512² MONOCHROME2 8-bit JPEG Baseline, as SIIM's

``ensure_demo`` generates on first use into the user cache (``XBENCH_DEMO_DIR``, else
``$XDG_CACHE_HOME/xbench_pl`` or ``~/.cache/xbench_pl``, folder ``demo-v<N>-seed<S>``) or a
given folder that does not exist yet: written to a temporary sibling and renamed into place,
so concurrent processes (DDP ranks) never see a half-written demo. The same seed gives
byte-identical files; ``GENERATOR_VERSION`` is bumped whenever the output changes.

Regenerate by hand: ``python -m xbench_pl.data.synthetic OUT [--seed S]``.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from xbench_pl.console import note

GENERATOR_VERSION = 1
SIZE = 512
DEMO_ENV = "XBENCH_DEMO_DIR"

# each NIH-format image: (finding, size in [0, 1]); then NIH_NORMALS lesion-free "No Finding" images
NIH_CASES: tuple[tuple[str, float], ...] = (
    ("Nodule", 0.0), ("Nodule", 0.6), ("Mass", 0.2), ("Mass", 1.0), ("Cardiomegaly", 0.5),
    ("Pleural Effusion", 0.1), ("Pleural Effusion", 0.9), ("Pneumothorax", 0.15), ("Pneumothorax", 0.9),
    ("Atelectasis", 0.5), ("Infiltration", 0.5), ("Pneumonia", 0.6),
)
NIH_NORMALS = 4
RGBA_IMAGE = 5
LUNG_TAPER = 0.25  # saved RGBA, like some real NIH PNGs
# each SIIM-format image: its pneumothorax instances as (size, side): side 0 = image left (patient right)
SIIM_CASES: tuple[tuple[tuple[float, int], ...], ...] = (((0.0, 0),), ((0.9, 1),), ((0.3, 0), (0.6, 1)), (), (), ())

NIH_BOX_SPELLING = {"Pleural Effusion": "Effusion", "Infiltration": "Infiltrate"}  # BBox_List_2017.csv
NIH_ENTRY_SPELLING = {"Pleural Effusion": "Effusion"}  # Data_Entry_2017_v2020.csv
EXTRA_ENTRY_LABELS = {"Pneumonia": ("Consolidation",)}  # what a radiologist would also list for the drawn lesion
BOX_HEADER = "Image Index,Finding Label,Bbox [x,y,w,h],,,"
ENTRY_HEADER = ("Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,"
                "OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y]")
UID_PREFIX = "1.2.826.0.1.3680043.8.498."  # pydicom's UID root; suffixes derived from the seed


@dataclass(frozen=True)
class Lesion:
    """One drawn lesion: its canonical finding and the exact pixels it changed."""

    finding: str
    mask: np.ndarray  # [H, W] bool

    @property
    def box(self) -> tuple[int, int, int, int]:
        """Tight integer box ``(x, y, w, h)`` around the mask, NIH's convention."""
        rows, cols = np.nonzero(self.mask)
        return int(cols.min()), int(rows.min()), int(cols.max() + 1 - cols.min()), int(rows.max() + 1 - rows.min())


@dataclass(frozen=True)
class Case:
    """One generated image: its id, 8-bit pixels and lesions."""

    image_id: str
    pixels: np.ndarray  # [H, W] uint8
    lesions: tuple[Lesion, ...]


# -- drawing ---------------------------------------------------------------------------------------


def _smoothstep(t: np.ndarray) -> np.ndarray:
    t = np.clip(t, 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def _fill(d: np.ndarray, edge: float) -> np.ndarray:
    """Soft fill of the shape ``d < 1``: 1 deep inside, rising over ``edge``, exactly 0 where ``d >= 1``."""
    return _smoothstep((1.0 - d) / edge)


def _ellipse(u, v, cu, cv, au, av, angle=0.0, taper=0.0):
    """Squared normalised radius of the (rotated) ellipse: < 1 inside. ``taper`` widens it
    downwards (an egg: half-width ``au * (1 + taper * dv / av)``), as lungs are."""
    du, dv = u - cu, v - cv
    if angle:
        c, s = np.cos(angle), np.sin(angle)
        du, dv = c * du + s * dv, -s * du + c * dv
    if taper:
        au = au * (1.0 + taper * np.clip(dv / av, -1.0, 1.0))
    return (du / au) ** 2 + (dv / av) ** 2


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Unit-variance noise with features about ``size / cells`` pixels across (bicubic upsampling)."""
    small = rng.standard_normal((cells, cells)).astype(np.float32)
    big = np.asarray(Image.fromarray(small).resize((size, size), Image.Resampling.BICUBIC), dtype=np.float64)
    return (big - big.mean()) / (big.std() + 1e-12)


class Phantom:
    """A lesion-free chest radiograph drawn from ``rng``; ``render(lesions)`` adds lesions.

    Coordinates ``u`` (x) and ``v`` (y) are pixel centres in [0, 1]. Lungs are listed image
    left (the patient's right) first.
    """

    def __init__(self, rng: np.random.Generator, size: int = SIZE):
        self.size = size
        centres = (np.arange(size) + 0.5) / size
        self.u, self.v = np.meshgrid(centres, centres)
        u, v = self.u, self.v
        jitter = lambda s: rng.uniform(-s, s)  # noqa: E731
        self.lungs = [
            (0.315 + jitter(0.01), 0.45 + jitter(0.015), 0.145 + jitter(0.008), 0.29 + jitter(0.012)),
            (0.685 + jitter(0.01), 0.46 + jitter(0.015), 0.135 + jitter(0.008), 0.28 + jitter(0.012)),
        ]
        self.heart = (0.55 + jitter(0.01), 0.615 + jitter(0.01), 0.135 + jitter(0.008), 0.105 + jitter(0.006), -0.35 + jitter(0.05))
        self.lung_d = [_ellipse(u, v, *lung, taper=LUNG_TAPER) for lung in self.lungs]
        self.lung_fill = [_fill(d, 0.12) for d in self.lung_d]
        self.lungs_fill = lungs = self.lung_fill[0] + self.lung_fill[1]

        body = _fill(_ellipse(u, v, 0.5, 0.64, 0.48, 0.68), 0.08)
        mediastinum = _smoothstep((0.075 - np.abs(u - 0.5)) / 0.02) * _smoothstep((0.8 - v) / 0.05)
        spine = _smoothstep((0.034 - np.abs(u - 0.5)) / 0.008) * (1.0 + 0.25 * np.cos(2 * np.pi * v * 17.0))
        ribs = np.zeros_like(u)
        for side in (-1, 1):
            lateral = (side * (u - 0.5) - 0.03) / 0.42  # 0 at the spine, 1 at the chest wall
            reach = _smoothstep(lateral / 0.05) * _smoothstep((1.08 - lateral) / 0.08)
            # the ribs of this side are drawn in its columns only: reach is exactly 0 in the others (the same bytes)
            lit = np.flatnonzero(reach.any(axis=0))
            side_columns = slice(lit[0], lit[-1] + 1)
            lateral, reach, side_v = lateral[:, side_columns], reach[:, side_columns], v[:, side_columns]
            for k in range(10):
                centre = 0.13 + 0.058 * k + jitter(0.004) - 0.06 * lateral + 0.17 * lateral**2
                ribs[:, side_columns] += np.exp(-(((side_v - centre) / (0.0085 + 0.0006 * k)) ** 2)) * reach
            # clavicle: a straight band from the sternal notch out and up
            x0, y0, x1, y1 = 0.5 + side * 0.06, 0.175, 0.5 + side * 0.31, 0.11
            t = np.clip(((u - x0) * (x1 - x0) + (v - y0) * (y1 - y0)) / ((x1 - x0) ** 2 + (y1 - y0) ** 2), 0, 1)
            ribs += 1.4 * np.exp(-(((u - x0 - t * (x1 - x0)) ** 2 + (v - y0 - t * (y1 - y0)) ** 2) / 0.012**2))
        self.base = (0.06 + 0.42 * body + 0.10 * mediastinum + 0.12 * spine - 0.30 * lungs
                     + 0.07 * np.clip(ribs, 0, 1.4) * body)
        # vessel markings: ridges of smooth noise, fading from the hila
        ridges = np.exp(-((_smooth_noise(rng, size, 36) / 0.22) ** 2)) + 0.6 * np.exp(-((_smooth_noise(rng, size, 70) / 0.2) ** 2))
        hila = [(cu + (0.4 if i == 0 else -0.4) * au, cv - 0.03) for i, (cu, cv, au, av) in enumerate(self.lungs)]
        self.hila = hila
        fade = sum(np.exp(-np.hypot(u - hu, v - hv) / 0.2) * f for (hu, hv), f in zip(hila, self.lung_fill))
        self.markings = 0.07 * ridges * fade
        self.noise = 0.014 * _smooth_noise(rng, size, 20) + 0.008 * rng.standard_normal((size, size))
        self.vignette = 1.0 - 0.45 * ((u - 0.5) ** 2 + (v - 0.5) ** 2)

    def heart_shadow(self, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """The heart's shape (``d < 1``) and what it adds: it hides the lung it overlaps."""
        cu, cv, au, av, angle = self.heart
        d = _ellipse(self.u, self.v, cu, cv, au * scale, av * scale, angle)
        return d, _fill(d, 0.25) * (0.26 * self.lungs_fill + 0.06)

    def render(self, lesions: list[tuple[Lesion, np.ndarray, bool]]) -> np.ndarray:
        """8-bit image with ``lesions``: (lesion, additive layer zero outside its mask, whether it hides markings)."""
        image = self.base + self.heart_shadow()[1] + self.noise
        markings = self.markings.copy()
        for lesion, layer, hides_markings in lesions:
            image = image + layer
            if hides_markings:
                markings[lesion.mask] = 0.0
        image = (image + markings) * self.vignette
        return np.rint(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)

    # -- lesions: each returns (Lesion, layer, hides_markings) -------------------------------------

    def _lung_point(self, rng: np.random.Generator, side: int, inner: float, v_range=(-1.0, 1.0)) -> tuple[float, float]:
        cu, cv, au, av = self.lungs[side]
        while True:
            r, theta = inner * np.sqrt(rng.uniform()), rng.uniform(0, 2 * np.pi)
            dv = r * np.sin(theta)
            if v_range[0] <= dv <= v_range[1]:
                return cu + au * r * np.cos(theta), cv + av * dv

    def _in_lung(self, side: int) -> np.ndarray:
        return self.lung_d[side] < 1.0

    def lesion(self, finding: str, size: float, rng: np.random.Generator, side: int | None = None):
        side = int(rng.integers(2)) if side is None else side
        draw: Callable = getattr(self, "_" + finding.lower().replace(" ", "_"))
        mask, layer, hides = draw(size, rng, side)
        layer = np.where(mask, layer, 0.0)
        if not mask.any():
            raise AssertionError(f"{finding} drew nothing")  # a generator bug, not a data problem
        return Lesion(finding, mask), layer, hides

    def _nodule(self, size, rng, side):
        radius = (9 + 9 * size) / self.size
        cu, cv = self._lung_point(rng, side, 0.55)
        r = np.hypot(self.u - cu, self.v - cv) / radius
        mask = r < 1
        return mask, 0.2 * np.sqrt(np.clip(1 - r**2, 0, 1)) * mask, False

    def _mass(self, size, rng, side):
        radius = (24 + 30 * size) / self.size
        cu, cv = self._lung_point(rng, side, 0.35, (-0.5, 0.6))
        du, dv = self.u - cu, self.v - cv
        theta, phase = np.arctan2(dv, du), rng.uniform(0, 2 * np.pi, 2)
        edge = radius * (1 + 0.12 * np.sin(3 * theta + phase[0]) + 0.06 * np.sin(5 * theta + phase[1]))
        r = np.hypot(du, dv) / edge
        mask = (r < 1) & self._in_lung(side)
        return mask, 0.24 * np.clip(1 - r**2, 0, 1) ** 0.3 * mask, False

    def _cardiomegaly(self, size, rng, side):
        d_big, big = self.heart_shadow(1.25 + 0.2 * size)
        return d_big < 1, big - self.heart_shadow()[1], False

    def _pleural_effusion(self, size, rng, side):
        cu, cv, au, av = self.lungs[side]
        height = 0.05 + 0.13 * size
        lateral = np.clip((self.u - cu) / au * (-1 if side == 0 else 1), 0, 1)
        meniscus = cv + av - height - 0.5 * height * lateral**2
        mask = self._in_lung(side) & (self.v > meniscus)
        heart = _fill(self.heart_shadow()[0], 0.25)  # fluid fills what the heart leaves of the lung's darkness
        depth = _smoothstep((self.v - meniscus) / 0.04)
        layer = self.lung_fill[side] * (0.30 - 0.26 * heart) * (0.85 + 0.25 * depth) + 0.01
        return mask, layer * mask, True

    def _pneumothorax(self, size, rng, side):
        cu, cv, au, av = self.lungs[side]
        hu, hv = self.hila[side]
        shrink = 0.9 - 0.2 * size  # the collapsed lung, shrunk towards the hilum
        d_lung = _ellipse(self.u, self.v, hu + shrink * (cu - hu), hv + shrink * (cv - hv), shrink * au, shrink * av,
                          taper=LUNG_TAPER)
        mask = self._in_lung(side) & (d_lung >= 1) & (self.v < cv + av * (-0.15 + 0.9 * size))
        line = 2 * (2.5 / self.size) / (shrink * min(au, av))  # about 2.5 px of the rim next to the lung edge
        layer = -0.08 * self.lung_fill[side] + 0.09 * (d_lung < 1 + line)
        return mask, layer * mask, True

    def _atelectasis(self, size, rng, side):
        cu, cv = self._lung_point(rng, side, 0.5, (0.1, 0.6))
        d = _ellipse(self.u, self.v, cu, cv, 0.05 + 0.05 * size, 0.018, rng.uniform(-0.3, 0.3))
        mask = (d < 1) & self._in_lung(side)
        return mask, 0.22 * _fill(d, 0.6) * mask, False

    def _patches(self, rng, side, centre_range, spread, count, axes, amplitude, edge):
        cu, cv = self._lung_point(rng, side, 0.45, centre_range)
        fill = np.zeros_like(self.u)
        for _ in range(count):
            pu, pv = cu + rng.uniform(-spread, spread), cv + rng.uniform(-spread, spread)
            d = _ellipse(self.u, self.v, pu, pv, rng.uniform(*axes[0]), rng.uniform(*axes[1]), rng.uniform(0, np.pi))
            fill = np.maximum(fill, _fill(d, edge))
        mask = (fill > 0) & self._in_lung(side)
        return mask, amplitude * fill * mask

    def _infiltration(self, size, rng, side):
        mask, layer = self._patches(rng, side, (-0.4, 0.5), 0.05 + 0.04 * size, 14, ((0.012, 0.03), (0.005, 0.011)), 0.14, 0.7)
        return mask, layer, False

    def _pneumonia(self, size, rng, side):
        axes = ((0.03 + 0.03 * size, 0.05 + 0.03 * size), (0.025 + 0.02 * size, 0.045 + 0.02 * size))
        mask, layer = self._patches(rng, side, (0.0, 0.55), 0.035, 5, axes, 0.24, 0.4)
        return mask, layer, True


def draw_case(image_id: str, seed: int, stream: int, index: int, findings: list[tuple[str, float, int | None]]) -> Case:
    """One phantom with ``findings`` (finding, size, side or None): anatomy and noise from
    ``(seed, stream, index)``, lesions from a separate stream, so the lesion-free image is the same phantom."""
    phantom = Phantom(np.random.default_rng([seed, stream, index]))
    rng = np.random.default_rng([seed, stream, index, 1])
    drawn = [phantom.lesion(finding, size, rng, side) for finding, size, side in findings]
    return Case(image_id, phantom.render(drawn), tuple(lesion for lesion, _, _ in drawn))


def nih_cases(seed: int = 0) -> list[Case]:
    """The NIH-format demo images: one lesion each (``NIH_CASES``), then ``NIH_NORMALS`` lesion-free."""
    findings = [[(finding, size, None)] for finding, size in NIH_CASES] + [[]] * NIH_NORMALS
    return [draw_case(f"phantom_{i:03d}.png", seed, 0, i, f) for i, f in enumerate(findings)]


def siim_cases(seed: int = 0) -> list[Case]:
    """The SIIM-format demo images (ids are DICOM UIDs): pneumothorax instances per ``SIIM_CASES``."""
    return [draw_case(demo_uid(seed, "image", i), seed, 1, i, [("Pneumothorax", size, side) for size, side in instances])
            for i, instances in enumerate(SIIM_CASES)]


# -- writing the real formats ----------------------------------------------------------------------


def demo_uid(seed: int, kind: str, index: int) -> str:
    from pydicom.uid import generate_uid

    return generate_uid(UID_PREFIX, entropy_srcs=[f"xbench_pl demo v{GENERATOR_VERSION}", str(seed), kind, str(index)])


def siim_rle(mask: np.ndarray) -> str:
    """SIIM's relative run-length encoding of a ``[H, W]`` mask: column-major (gap, run) pairs."""
    flat = np.concatenate([[0], mask.T.reshape(-1).astype(np.int8), [0]])
    changes = np.flatnonzero(np.diff(flat))
    starts, ends = changes[::2], changes[1::2]
    gaps = starts - np.concatenate([[0], ends[:-1]])
    return " ".join(f"{g} {r}" for g, r in zip(gaps, ends - starts))


def write_nih(root: Path, seed: int = 0) -> list[Case]:
    cases = nih_cases(seed)
    (root / "images").mkdir(parents=True)
    boxes, entries = [BOX_HEADER], [ENTRY_HEADER]
    for i, case in enumerate(cases):
        image = Image.fromarray(case.pixels)
        if i == RGBA_IMAGE:
            image = image.convert("RGBA")
        image.save(root / "images" / case.image_id)
        labels = []
        for lesion in case.lesions:
            x, y, w, h = lesion.box
            boxes.append(f"{case.image_id},{NIH_BOX_SPELLING.get(lesion.finding, lesion.finding)},{x},{y},{w},{h}")
            labels += [NIH_ENTRY_SPELLING.get(lesion.finding, lesion.finding), *EXTRA_ENTRY_LABELS.get(lesion.finding, ())]
        age, sex = 30 + (7 * i) % 50, "MF"[i % 2]
        entries.append(f"{case.image_id},{'|'.join(sorted(set(labels))) or 'No Finding'},0,{i + 1},{age},{sex},PA,"
                       f"{SIZE},{SIZE},0.286,0.286")
    (root / "BBox_List_2017.csv").write_text("\n".join(boxes) + "\n")
    (root / "Data_Entry_2017_v2020.csv").write_text("\n".join(entries) + "\n")
    return cases


def write_siim_dicom(path: Path, case: Case, seed: int, index: int) -> None:
    """A SIIM-like file: Secondary Capture, CR, MONOCHROME2 8-bit, JPEG Baseline (PIL-encoded, encapsulated)."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.encaps import encapsulate
    from pydicom.uid import JPEGBaseline8Bit, SecondaryCaptureImageStorage

    jpeg = io.BytesIO()
    Image.fromarray(case.pixels).save(jpeg, format="JPEG", quality=95)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = case.image_id
    meta.TransferSyntaxUID = JPEGBaseline8Bit
    meta.ImplementationClassUID = UID_PREFIX + "1"
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.SOPClassUID, ds.SOPInstanceUID = SecondaryCaptureImageStorage, case.image_id
    ds.StudyDate, ds.StudyTime, ds.Modality, ds.ConversionType = "19010101", "000000.00", "CR", "WSD"
    ds.SeriesDescription, ds.BodyPartExamined, ds.ViewPosition = "view: PA", "CHEST", "PA"
    ds.PatientName = ds.PatientID = f"synthetic-{seed}-{index}"
    ds.PatientSex, ds.PatientAge = "MF"[index % 2], f"{40 + index:03d}Y"
    ds.StudyInstanceUID, ds.SeriesInstanceUID = path.parent.parent.name, path.parent.name
    ds.SeriesNumber, ds.InstanceNumber = 1, 1
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.Rows, ds.Columns = case.pixels.shape
    ds.PixelSpacing = [0.286, 0.286]
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.LossyImageCompression, ds.LossyImageCompressionMethod = "01", "ISO_10918_1"
    ds.PixelData = encapsulate([jpeg.getvalue()])
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    ds.save_as(path, enforce_file_format=True)


def write_siim(root: Path, seed: int = 0) -> list[Case]:
    cases = siim_cases(seed)
    rows = ["ImageId, EncodedPixels"]
    for i, case in enumerate(cases):
        folder = root / "dicom-images-train" / demo_uid(seed, "study", i) / demo_uid(seed, "series", i)
        folder.mkdir(parents=True)
        write_siim_dicom(folder / f"{case.image_id}.dcm", case, seed, i)
        rows += [f"{case.image_id},{siim_rle(lesion.mask)}" for lesion in case.lesions] or [f"{case.image_id},-1"]
    (root / "train-rle.csv").write_text("\n".join(rows) + "\n")
    return cases


README = """# xbench_pl demo data: SYNTHETIC

Generated by xbench_pl.data.synthetic (generator version {version}, seed {seed}). These are
drawn phantoms, not radiographs of anyone: every lesion's box (nih/) or mask (siim/) is
exactly the pixels it changed. Layouts and spellings follow NIH ChestX-ray14
(BBox_List_2017.csv, Data_Entry_2017_v2020.csv, images/) and SIIM-ACR (train-rle.csv,
dicom-images-train/), so `--data demo` and `--data demo_dicom` use the real readers.
"""


def write_demo(root: str | Path, seed: int = 0) -> Path:
    """Write the demo into ``root`` (created; must not hold files)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty")
    write_nih(root / "nih", seed)
    write_siim(root / "siim", seed)
    (root / "README.md").write_text(README.format(version=GENERATOR_VERSION, seed=seed))
    return root


def demo_cache_dir() -> Path:
    """Where generated demos are kept: ``XBENCH_DEMO_DIR``, else ``$XDG_CACHE_HOME/xbench_pl`` or ``~/.cache/xbench_pl``."""
    base = os.environ.get(DEMO_ENV)
    if not base:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xbench_pl"
    return Path(base)


def default_demo_dir(seed: int = 0) -> Path:
    return demo_cache_dir() / f"demo-v{GENERATOR_VERSION}-seed{seed}"


def ensure_demo(root: str | Path | None = None, seed: int = 0) -> Path:
    """The demo folder, generated first if ``root`` (default ``default_demo_dir(seed)``) is
    missing or empty (``ensure_generated``)."""
    root = Path(root) if root is not None else default_demo_dir(seed)
    return ensure_generated(root, lambda folder: write_demo(folder, seed), "the synthetic demo")


def ensure_generated(root: Path, write: Callable[[Path], object], what: str) -> Path:
    """``root``, first filled by ``write(folder)`` if it is missing or empty. Atomic: written to a
    temporary sibling, then renamed into place; a process that loses the race to another discards its copy."""
    if root.is_dir() and any(root.iterdir()):
        return root
    note(f"drawing {what} into {root} (first run only, a few seconds)")
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        temporary = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=f".{uuid.uuid4().hex[:8]}", dir=root.parent))
    except OSError as error:  # a read-only cache, a path through a file: say where it is set
        from xbench_pl.data.errors import DataError

        raise DataError(root.parent, f"cannot write {what} here ({error.strerror or error}): set {DEMO_ENV} to a writable "
                        "folder (the demos are drawn there once, then read)") from None
    try:
        write(temporary)
        os.chmod(temporary, 0o755)  # mkdtemp made it private
        try:
            os.rename(temporary, root)  # replaces a missing or empty folder, atomically
        except OSError:
            if not (root.is_dir() and any(root.iterdir())):
                raise
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xbench_pl.data.synthetic", description=__doc__.split("\n")[0])
    parser.add_argument("out", help="folder to write (must not exist or be empty)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    root = write_demo(args.out, args.seed)
    print(f"wrote the synthetic demo (seed {args.seed}) to {root}: nih/ (PNG + NIH tables), siim/ (DICOM + RLE)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
