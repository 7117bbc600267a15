"""Saliency maps made elsewhere (Grad-CAM, attention rollout, ...), read without running their code.

CheXlocalize distributes one pickle per (image, task), ``{cxr_id}_{task}_map.pkl`` (e.g.
``patient64541_study1_view1_frontal_Cardiomegaly_map.pkl``), holding a dict with ``map`` (a float
tensor ``[1, 1, h, w]`` spanning the whole image), ``prob`` (the model's probability), ``task``,
``gt``, ``cxr_img`` (the model input) and ``cxr_dims`` (the original ``(W, H)``), pickled with
``torch`` tensors inside. ``read_chexlocalize_pickle`` reads them with an unpickler that admits only
what such a file needs (tensor rebuilding, ``torch.load(weights_only=True)`` of the storages,
``OrderedDict``, latin-1 ``bytes`` of protocol-2 pickles): a pickle asking for anything else is refused, naming the global.
"""

from __future__ import annotations

import collections
import io
import pickle
from pathlib import Path

import torch

from xbench_pl.data.io import DataError


#: CheXpert's 14 labels in its CSV order: a pickle whose ``prob`` holds all 14 is indexed by its task.
CHEXPERT_TASKS = ("No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Airspace Opacity", "Edema",
                  "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion", "Pleural Other",
                  "Fracture", "Support Devices")


def _load_storage(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    """What protocol-2 pickles use for ``bytes`` (``_codecs.encode(text, "latin1")``); nothing else."""
    if encoding != "latin1":
        raise pickle.UnpicklingError(f"refused _codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


_ALLOWED = {
    ("_codecs", "encode"): _latin1,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch.storage", "_load_from_bytes"): _load_storage,
    ("collections", "OrderedDict"): collections.OrderedDict,
}


class _MapUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused global {module}.{name} (a CheXlocalize map pickle needs only "
                                         "tensors, storages and OrderedDict)") from None


def parse_chexlocalize_name(path: str | Path) -> tuple[str, str]:
    """``(cxr_id, task)`` of a ``{cxr_id}_{task}_map.pkl`` file name (task names contain no ``_``)."""
    parts = Path(path).name.split("_")
    if len(parts) < 3 or parts[-1] != "map.pkl":
        raise ValueError(f"{Path(path).name}: not a CheXlocalize map name ({{cxr_id}}_{{task}}_map.pkl)")
    return "_".join(parts[:-2]), parts[-2]


def read_chexlocalize_pickle(path: str | Path) -> dict:
    """``{"map": [h, w] float32, "prob": float | None, "task": str, "size": (H, W) | None}`` of one
    CheXlocalize ``*_map.pkl``; ``DataError`` naming the file when it cannot be read or holds no map."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            info = _MapUnpickler(handle).load()
    except (OSError, pickle.UnpicklingError, EOFError, RuntimeError, ValueError) as error:
        raise DataError(path, f"cannot read the map pickle ({error})") from None
    if not isinstance(info, dict) or not torch.is_tensor(info.get("map")):
        raise DataError(path, "expected a dict with a tensor 'map' (CheXlocalize's *_map.pkl layout)")
    saliency = info["map"].detach().float()
    while saliency.dim() > 2 and saliency.shape[0] == 1:
        saliency = saliency[0]
    if saliency.dim() != 2:
        raise DataError(path, f"'map' has shape {tuple(info['map'].shape)}; expected [1, 1, h, w] or [h, w]")
    prob = info.get("prob")
    if torch.is_tensor(prob):
        flat = prob.flatten()
        if flat.numel() == len(CHEXPERT_TASKS) and info.get("task") in CHEXPERT_TASKS:
            prob = float(flat[CHEXPERT_TASKS.index(info["task"])])  # all 14 CheXpert probabilities: the task's
        else:
            prob = float(flat[0]) if flat.numel() == 1 else None
    dims = info.get("cxr_dims")
    size = (int(dims[1]), int(dims[0])) if isinstance(dims, (tuple, list)) and len(dims) == 2 else None
    return {"map": saliency, "prob": None if prob is None else float(prob), "task": info.get("task"), "size": size}
