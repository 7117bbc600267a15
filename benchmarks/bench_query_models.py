"""How fast are the query-decoder models (KAD, DeViDe, MedKLIP, MAVL, CARZero) on this machine? Random weights.

Per model, on a batch of B already-normalised inputs at the model's size:

1. ``zero_shot`` images/s, with the query embeddings already cached (the steady state of a run);
2. the bare forward it wraps, image encoder + projection + decoder + head on the cached queries
   (no softmax / map selection; CARZero: its i2t and t2i decoder passes), images/s: ``zero_shot``
   should cost no more;
3. the one-off query-embedding cost: tokenising and encoding the query texts through the BERT text
   encoder (KAD/DeViDe: the authors' 14 ChestX-ray14 texts, 256 tokens each), paid once per
   (checkpoint, texts, device); cold, then again as a new process pays it (MedKLIP/MAVL read their
   on-disk cache; KAD/DeViDe keep theirs in memory only and recompute).

MedKLIP and MAVL decode their whole query set (75 descriptions; 675 concepts) whatever is requested,
and their text encoder (Bio_ClinicalBERT) is not available here: they get the test suite's synthetic
knowledge files and a 2-layer stand-in BERT, so their query-embedding column (75 / 675 texts of 64
tokens) is not Bio_ClinicalBERT's cost; it is cached on disk after the first run anyway.

Run: ``python benchmarks/bench_query_models.py [--models kad_224 kad_512 devide medklip mavl carzero] [--batch 4] [--repeats 3]``.
Needs a tokenizer folder; by default a small WordPiece vocabulary is written to a temp folder
(the cost of encoding does not depend on the vocabulary, only on the padded length).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

import xbench_pl

CXR14 = ["Atelectasis", "Cardiomegaly", "Pleural Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia", "Pneumothorax",
         "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural Thickening", "Hernia"]


def best_of_interleaved(repeats: int, *fns) -> list[float]:
    """Best time of each function, run alternately (a shared machine's load hits both alike)."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [min(t) for t in times]


def write_tokenizer(folder: Path) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import kad_reference  # the test suite's deterministic WordPiece vocabulary

    return str(kad_reference.write_tokenizer(folder))


def medklip_family_files(folder: Path) -> dict[str, dict]:
    """create_model kwargs of medklip / mavl: the test suite's synthetic knowledge and tiny BERT."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import medklip_mavl_reference as ref  # deterministic stand-ins in the authors' file layouts

    knowledge = ref.write_knowledge(folder / "knowledge")
    common = {"text": str(ref.write_bert_folder(folder / "bert")), "query_cache": str(folder / "cache")}
    return {"medklip": {**common, "knowledge": str(knowledge["medklip_descriptions"])},
            "mavl": {**common, "knowledge": [str(knowledge["mavl_descriptions"]), str(knowledge["mavl_aspects"])]}}


def carzero_tokenizer(folder: Path) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import carzero_reference  # BioClinicalMPBERT's folder layout, generated vocabulary

    return str(carzero_reference.write_text_encoder_folder(folder))


def parts(model, classes: list[str]):
    """``(texts, clear, embed, bare)`` of a model: its query texts, a function forgetting the in-memory
    text cache, one encoding them, and one running the bare image + decoder forward on encoded texts."""
    if hasattr(model, "similarities"):  # CARZero: each finding scored alone, two decoder passes (i2t, t2i)
        texts = tuple(model.prompt_for(c) for c in classes)
        return texts, model._text_cache.clear, lambda: model.text_embeddings(texts), lambda images: model.similarities(images, texts)
    texts, _ = model.query_texts(classes)
    return texts, model._query_cache.clear, lambda: model.query_embeddings(texts), lambda images: model.decode(images, model.query_embeddings(texts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["kad_224", "kad_512", "devide", "medklip", "mavl", "carzero"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--text", default=None, help="Med-KEBERT tokenizer folder (default: a generated one)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*RANDOM weights.*")
    scratch = Path(tempfile.mkdtemp())
    tokenizer = args.text or write_tokenizer(scratch / "tokenizer")
    kwargs = {name: {"text": tokenizer} for name in args.models}
    if {"medklip", "mavl"} & set(args.models):
        kwargs.update({k: v for k, v in medklip_family_files(scratch).items() if k in args.models})
    if "carzero" in args.models:
        kwargs["carzero"] = {"text": carzero_tokenizer(scratch / "bioclinicalmpbert")}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU, batch {args.batch}, best of {args.repeats}")
    print("| model | input | queries | zero_shot img/s | bare image+decoder img/s | zero_shot / bare time | query embeddings: cold | new process (disk cache) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        model = xbench_pl.create_model(name, random_init=True, **kwargs[name])
        size = model.preprocess.size
        images = torch.randn(args.batch, 3, size, size, generator=torch.Generator().manual_seed(0))
        texts, clear, embed_texts, bare_forward = parts(model, CXR14)
        clear()
        start = time.perf_counter()
        embed_texts()  # tokenise + BERT (+ MLP), cached from here on
        embed = time.perf_counter() - start
        clear()  # a new process: MedKLIP/MAVL read their disk cache, the others recompute
        start = time.perf_counter()
        embed_texts()
        restart = time.perf_counter() - start
        with torch.no_grad():
            model.zero_shot(images[:1], CXR14)  # warm-up
            bare_forward(images[:1])
            shot, bare = best_of_interleaved(args.repeats, lambda: model.zero_shot(images, CXR14),
                                             lambda: bare_forward(images))
        print(f"| {name} | {size} px | {len(texts)} | {args.batch / shot:.2f} | {args.batch / bare:.2f} | {shot / bare:.3f} | {embed:.2f} s | {restart:.3f} s |")


if __name__ == "__main__":
    main()
