"""Local files only: architecture JSONs, checkpoint files and tokenizer / text-encoder folders of the
query-decoder families (KAD/DeViDe, MedKLIP/MAVL, CARZero). Nothing is downloaded here (xbench_pl.weights
fetches released files into a local cache): a URL or hub name is refused with a message naming the files to
give instead; a missing file or folder is named with what it should hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ..geometry import Preprocess

SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"
DOWNLOADS = ("http://", "https://", "hf-hub:")


def refuse_download(value: object, what: str, hint: str) -> None:
    if value is not None and str(value).startswith(DOWNLOADS):
        hub = (" (an hf-hub: name is fetched by the command line, or in Python by xbench_pl.weights.hub_folder, "
               "into a local folder to give here)" if str(value).startswith("hf-hub:") else "")
        raise ValueError(f"{what}={value!r} would download; nothing is downloaded here{hub}. Give {hint}")


def local_files(value: str | Path | Sequence[str | Path] | None, what: str, hint: str) -> list[Path]:
    """One or more existing local files (at least one); ``hint`` says what is expected."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        raise FileNotFoundError(f"{what} is required: {hint}")
    values = [value] if isinstance(value, (str, Path)) else list(value)
    paths = []
    for v in values:
        refuse_download(v, what, hint)
        path = Path(v).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{what} file not found: {path} ({'not a file' if path.exists() else 'no such file'}); "
                                    f"expected {hint}")
        paths.append(path)
    return paths


def local_file(value: str | Path, what: str, hint: str) -> Path:
    return local_files(value, what, hint)[0]


#: a Hugging Face model folder's weights, in transformers' order of preference
HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def weights_in(folder: Path, what: str, hint: str) -> Path:
    """The first of ``HF_WEIGHT_FILES`` in ``folder`` (the ``what`` folder); ``FileNotFoundError`` naming what it holds."""
    found = next((folder / name for name in HF_WEIGHT_FILES if (folder / name).is_file()), None)
    if found is None:
        present = sorted(p.name for p in folder.iterdir())[:12]
        raise FileNotFoundError(f"{what} folder {folder} holds no weights: it holds none of {list(HF_WEIGHT_FILES)} "
                                f"(it holds {present}); expected {hint}")
    return found


#: how to run a model without its files, added where a checkpoint is missing
RANDOM_INIT_HINT = "; or --model.random_init true (random_init=True) for a smoke run with random weights"


def checkpoint_file(checkpoint: str | Path | None, random_init: bool, owner: str, hint: str) -> Path | None:
    """The local checkpoint file, or ``None`` for a ``random_init`` model; ``owner`` (e.g. ``KAD('kad-512')``)
    names the model in the error when neither is given."""
    if checkpoint is None:
        if not random_init:
            raise ValueError(f"{owner} needs checkpoint=: {hint}{RANDOM_INIT_HINT}")
        return None
    return local_file(checkpoint, "checkpoint", hint)


def local_folder(value: str | Path | None, what: str, hint: str, needed_by: str,
                 needs: Sequence[tuple[str, ...]]) -> Path:
    """An existing local folder holding, for each entry of ``needs``, one of its file names."""
    refuse_download(value, what, hint)
    path = None if value is None else Path(value).expanduser()
    if path is None or not path.is_dir():
        raise FileNotFoundError(f"{needed_by} needs {hint}; got {what}={value!r}" + ("" if path is None else " (no such folder)"))
    missing = [" or ".join(names) for names in needs if not any((path / name).is_file() for name in names)]
    if missing:
        present = sorted(p.name for p in path.iterdir())[:12]
        raise FileNotFoundError(f"{what} folder {path} lacks {missing} (holds {present}); it needs {hint}")
    return path


def sized_architecture(architecture: str, image_size: int | None, sizes: dict[int, str], model: str) -> str:
    """The architecture for ``--model.image_size``: a model that exists at several input sizes (one
    architecture and checkpoint each, e.g. KAD 224/512/1024) switches to that size's; any other size
    is refused, naming the sizes it has (its checkpoints are trained at those only: grids, position
    embeddings and pools do not transfer). ``None`` keeps ``architecture``."""
    if image_size is None:
        return architecture
    if image_size not in sizes:
        raise ValueError(f"{model} cannot run at image_size={image_size}: it exists at {sorted(sizes)} px only "
                         f"({', '.join(f'{size} px: architecture {name!r}' for size, name in sorted(sizes.items()))}, "
                         "each with its own checkpoint); the eval grid is the same at any input size")
    return sizes[image_size]


def read_architecture(architecture: str, needed: Sequence[str], family: str) -> tuple[dict, Path]:
    """The architecture dict of a shipped name or a JSON file, and its folder. A shipped config of the
    family is one holding every ``needed`` key."""
    path = Path(architecture).expanduser()
    if path.suffix != ".json":
        path = SHIPPED_CONFIGS / f"{architecture}.json"
        if not path.is_file():
            shipped = sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.json")
                             if all(k in json.loads(p.read_text()) for k in needed))
            raise ValueError(f"unknown architecture {architecture!r}: not a shipped {family} config {shipped} or a JSON file")
    if not path.is_file():
        raise FileNotFoundError(f"architecture config not found: {path}")
    config = json.loads(path.read_text())
    missing = [k for k in needed if k not in config]
    if missing:
        raise ValueError(f"architecture config {path} lacks {missing} (a {family} config needs {list(needed)})")
    return config, path.parent


def resolve_file(name: str, base: Path) -> Path:
    """A file or folder named in an architecture config: absolute, next to the config, or shipped."""
    for candidate in (Path(name).expanduser(), base / name, SHIPPED_CONFIGS / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{name!r} not found as a path, next to the architecture config ({base}) or in {SHIPPED_CONFIGS}")


def bert_config(spec: str | dict, base: Path) -> dict:
    """A BERT config given inline or as a folder/``config.json`` (absolute, next to the architecture, or shipped)."""
    if isinstance(spec, dict):
        return dict(spec)
    path = resolve_file(spec, base)
    return json.loads((path / "config.json" if path.is_dir() else path).read_text())


def preprocess_from(config: dict) -> Preprocess:
    """The ``Preprocess`` of an architecture's ``preprocess`` entry (JSON lists become tuples)."""
    return Preprocess(**{k: tuple(v) if isinstance(v, list) else v for k, v in config["preprocess"].items()})
