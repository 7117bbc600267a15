"""Write small DICOM files with pydicom, in the layouts the real datasets use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, RLELossless, SecondaryCaptureImageStorage, generate_uid


def write_dicom(path: Path, pixels: np.ndarray, photometric: str = "MONOCHROME2", bits_stored: int | None = None,
                rescale: tuple[float, float] | None = None, window: tuple[float, float] | None = None,
                rle: bool = False, header: dict | None = None) -> Path:
    """Single-frame grey DICOM of ``pixels`` (uint8 or uint16); ``rescale = (slope, intercept)``,
    ``window = (center, width)``; ``rle`` compresses with RLE Lossless; ``header``: more elements by keyword
    (``{"PatientSex": "F", "PatientAge": "058Y", "ViewPosition": "AP"}``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality = "CR"
    bits_allocated = 8 if pixels.dtype == np.uint8 else 16
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored = bits_allocated, bits_stored or bits_allocated
    ds.HighBit, ds.PixelRepresentation = ds.BitsStored - 1, 0
    if rescale is not None:
        ds.RescaleSlope, ds.RescaleIntercept = rescale
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = window
    for keyword, value in (header or {}).items():
        setattr(ds, keyword, value)
    ds.PixelData = np.ascontiguousarray(pixels).tobytes()
    if rle:
        ds.compress(RLELossless)
    ds.save_as(path, enforce_file_format=True)
    return path


def column_major_rle(mask: np.ndarray) -> str:
    """SIIM relative run-length encoding of a ``[H, W]`` mask (column-major, (gap, run) pairs)."""
    flat = np.concatenate([[0], mask.T.reshape(-1).astype(np.int8), [0]])
    changes = np.flatnonzero(np.diff(flat))
    starts, ends = changes[::2], changes[1::2]
    gaps = starts - np.concatenate([[0], ends[:-1]])
    return " " + " ".join(f"{g} {r}" for g, r in zip(gaps, ends - starts))


def grey(height: int, width: int, seed: int = 0, dtype=np.uint8) -> np.ndarray:
    high = 256 if dtype == np.uint8 else 4096
    return np.random.default_rng(seed).integers(0, high, size=(height, width)).astype(dtype)


# RSNA: 96 x 128 images; "pos" has two boxes, "neg" none
RSNA_SIZE = (96, 128)
RSNA_LABELS = """patientId,x,y,width,height,Target
pos,10,20,30,40,1
neg,,,,,0
pos,80,50,20,10,1
"""


def make_rsna(root: Path, labels: str = RSNA_LABELS, images: tuple[str, ...] = ("pos", "neg")) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "stage_2_train_labels.csv").write_text(labels)
    for i, name in enumerate(images):
        write_dicom(root / "stage_2_train_images" / f"{name}.dcm", grey(*RSNA_SIZE, seed=i))
    return root


# SIIM: 48 x 64 images in the nested tree; "1.2.4.1" has two instances, "1.2.4.2" is negative
SIIM_SIZE = (48, 64)


def siim_instances() -> list[np.ndarray]:
    first = np.zeros(SIIM_SIZE, bool)
    first[10:20, 5:25] = True  # rows y 10..19, columns x 5..24
    second = np.zeros(SIIM_SIZE, bool)
    second[30:40, 40:60] = True
    return [first, second]


def make_siim(root: Path, extra_rows: str = "", rle_name: str = "train-rle.csv") -> Path:
    first, second = siim_instances()
    rows = f"ImageId, EncodedPixels\n1.2.4.1,{column_major_rle(first)}\n1.2.4.2, -1\n1.2.4.1,{column_major_rle(second)}\n"
    root.mkdir(parents=True, exist_ok=True)
    (root / rle_name).write_text(rows + extra_rows)
    for i, (study, name) in enumerate([("1.2.2.1", "1.2.4.1"), ("1.2.2.2", "1.2.4.2")]):
        write_dicom(root / "dicom-images-train" / study / f"1.2.3.{i}" / f"{name}.dcm", grey(*SIIM_SIZE, seed=i))
    return root


# VinDr: 80 x 120 (H x W) 12-bit MONOCHROME1 with a window; labels file in the test layout
VINDR_SIZE = (80, 120)
VINDR_LOCAL = ("Aortic enlargement,Atelectasis,Calcification,Cardiomegaly,Clavicle fracture,Consolidation,Edema,"
               "Emphysema,Enlarged PA,ILD,Infiltration,Lung Opacity,Lung cavity,Lung cyst,Mediastinal shift,"
               "Nodule/Mass,Pleural effusion,Pleural thickening,Pneumothorax,Pulmonary fibrosis,Rib fracture,Other lesion")
VINDR_LABEL_HEADER = "image_id," + VINDR_LOCAL + ",COPD,Lung tumor,Pneumonia,Tuberculosis,Other disease,No finding"
VINDR_BOXES = """image_id,class_name,x_min,y_min,x_max,y_max
aaa,Cardiomegaly,30.5,40.0,90.5,70.0
aaa,Pleural effusion,100.0,60.0,130.0,85.0
aaa,Other lesion,1,1,5,5
bbb,No finding,,,,
"""


def vindr_label_row(image_id: str, positives: tuple[str, ...]) -> str:
    names = VINDR_LABEL_HEADER.split(",")[1:]
    return image_id + "," + ",".join("1" if n in positives else "0" for n in names)


def make_vindr(root: Path, boxes: str = VINDR_BOXES, label_rows: tuple[str, ...] | None = None,
               images: tuple[str, ...] = ("aaa", "bbb")) -> Path:
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / "annotations_test.csv").write_text(boxes)
    if label_rows is None:
        label_rows = (vindr_label_row("aaa", ("Cardiomegaly", "Pleural effusion", "Other lesion")),
                      vindr_label_row("bbb", ("No finding",)))
    (root / "annotations" / "image_labels_test.csv").write_text("\n".join((VINDR_LABEL_HEADER, *label_rows)) + "\n")
    for i, name in enumerate(images):
        write_dicom(root / "test" / f"{name}.dicom", grey(*VINDR_SIZE, seed=i, dtype=np.uint16), "MONOCHROME1",
                    bits_stored=12, window=(2048, 4096))
    return root
