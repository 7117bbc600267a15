"""MedKLIP: architecture vs the released checkpoint's layout, numerical equivalence with the
authors' code, the Bio_ClinicalBERT query book (tokenizer without [SEP], [CLS] state, disk cache),
knowledge files, unseen findings and checkpoint errors.

The authors' outputs (``tests/data/medklip_reference.pt``, ``medklip_text_reference.pt``) were
computed by their own code on the deterministic data of ``tests/medklip_mavl_reference.py``
(``tests/data/make_medklip_mavl_reference.md``). Bio_ClinicalBERT's weights are not available here, so
the equivalence test injects the stand-in query book as a precomputed ``query_embeddings`` file
(the on-disk cache's format); the BERT path is checked on its own with a tiny BERT folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import medklip_mavl_reference as ref_data
import xbench_pl
from xbench_pl.geometry import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from xbench_pl.models import medklip as family
from xbench_pl.models.checkpoints import CheckpointError
from xbench_pl.models.medklip import MedKLIP, TextEncoder, save_query_embeddings, text_folder
from xbench_pl.registry import read_config

DATA = Path(__file__).resolve().parent / "data"
CXR14 = ["Atelectasis", "Cardiomegaly", "Pleural Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia", "Pneumothorax",
         "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural Thickening", "Hernia"]
# the authors' ChestX-ray14 mapping (Sample_zero-shot_Classification_CXR14/test.py:21-22)
CXR14_ENTITIES = ["atelectasis", "cardiomegaly", "effusion", "infiltrate", "mass", "nodule", "pneumonia", "pneumothorax",
                  "consolidation", "edema", "emphysema", "tail_abnorm_obs", "thicken", "hernia"]


def authors_texts(knowledge: Path) -> list[str]:
    """MedKLIP's book texts as their test code builds them: the file's values in file order."""
    book = json.loads(knowledge.read_text())
    return [book[key] for key in book]


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("medklip")
    out = {name: path for name, path in ref_data.write_knowledge(root / "knowledge").items()}
    out["bert"] = ref_data.write_bert_folder(root / "bert", seed=0)
    out["checkpoint"] = root / "checkpoint_final.pth"
    torch.save(ref_data.official_checkpoint("medklip", seed=0), out["checkpoint"])
    out["book"] = save_query_embeddings(root / "medklip_book.pt", authors_texts(out["medklip_descriptions"]),
                                        ref_data.query_book("medklip", seed=0))
    out["cache"] = root / "cache"
    return out


@pytest.fixture(scope="module")
def official(files) -> MedKLIP:
    return xbench_pl.create_model("medklip", checkpoint=str(files["checkpoint"]), knowledge=str(files["medklip_descriptions"]),
                                  query_embeddings=str(files["book"]), query_cache=str(files["cache"]))


@pytest.fixture(scope="module")
def smoke(files) -> MedKLIP:
    with pytest.warns(UserWarning, match="RANDOM weights"):
        return xbench_pl.create_model("medklip", random_init=True, knowledge=str(files["medklip_descriptions"]),
                                      text=str(files["bert"]), query_cache=str(files["cache"]))


def released_keys(model_class, spec: dict) -> tuple[dict[str, list[int]], list[str]]:
    """The manifest's keys (``module.`` stripped) renamed by ``model_class`` with their shapes, and
    the keys it declares unused (``IGNORE_UNEXPECTED``), in file order."""
    mapped, ignored = {}, []
    for key, (shape, _dtype) in spec["keys"].items():
        key = key.removeprefix("module.")
        if any(re.search(p, key) for p in model_class.IGNORE_UNEXPECTED):
            ignored.append(key)
        else:
            mapped[model_class.rename(key)] = shape
    return mapped, ignored


# -- architecture vs the released checkpoint -------------------------------------------------------
def test_architecture_matches_released_checkpoint_layout(files):
    """Every key of checkpoint_final.pth maps to one of ours with its shape, or is the declared
    training-only cl_fc; nothing of ours is left unloaded. 14,464,322 parameters in the file."""
    spec = json.loads((DATA / "medklip_checkpoint_manifest.json").read_text())
    with torch.device("meta"), pytest.warns(UserWarning, match="RANDOM"):
        model = xbench_pl.create_model("medklip", random_init=True, knowledge=str(files["medklip_descriptions"]),
                                       text=str(files["bert"]))
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert all(k.startswith("module.") for k in spec["keys"])
    mapped, ignored = released_keys(MedKLIP, spec)
    assert mapped == ours
    assert ignored == ["cl_fc.weight", "cl_fc.bias"]
    counts = spec["parameters"]
    n_ours = sum(p.numel() for p in model.parameters())
    assert n_ours == 14_266_946 == counts["total"] - 197_376
    assert counts["total"] == 14_464_322  # models.md: 14.46 M
    assert not any(k.startswith(("text", "bert")) for k in ours)  # BERT is not part of the model (nor of the file)
    tokens, grid = model.image(torch.empty(1, 3, 224, 224, device="meta"))
    assert grid == (14, 14) and tokens.shape == (1, 196, 1024)


def test_registered_medklip_preprocesses_as_the_authors_datasets():
    cls, init_args = read_config("models", "medklip")
    assert cls is MedKLIP and init_args["architecture"] == "medklip"
    config = family.read_architecture("medklip")
    assert Preprocess(**{k: tuple(v) if isinstance(v, list) else v for k, v in config["preprocess"].items()}) == Preprocess(
        resize="squash", size=224, interpolation="bilinear", antialias=True, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    assert "8e60b035" in config["_source"] and tuple(config["entities"]) == ref_data.ENTITIES
    assert config["text"]["max_length"] == ref_data.MAX_LENGTH and config["attn_layers"] == [0, 1, 2, 3]


# -- equivalence with the authors' code -------------------------------------------------------------
def test_scores_and_maps_equal_the_authors_code(official, files):
    reference = torch.load(DATA / "medklip_reference.pt", weights_only=True)
    assert reference["seed"] == 0 and reference["entities"] == list(ref_data.ENTITIES)
    texts, index = official.query_texts(list(ref_data.ENTITIES))
    assert list(texts) == authors_texts(files["medklip_descriptions"]) and index == list(range(75))
    images = ref_data.reference_images(0)
    out = official.zero_shot(images, list(ref_data.ENTITIES))  # every entity, by its own name
    assert (out.scores - reference["scores"]).abs().max() <= 1e-5
    assert out.saliency.shape == (2, 75, 14, 14)
    assert (out.saliency - reference["maps"]).abs().max() <= 1e-6
    decoded = official.decode(images, official.query_embeddings(texts))
    assert (decoded["attn"] - reference["attn_layers"]).abs().max() <= 1e-6
    assert (decoded["logits"] - reference["logits"]).abs().max() <= 1e-4
    # the benchmark's names, through the authors' ChestX-ray14 mapping (Fibrosis -> tail_abnorm_obs)
    cxr14 = official.zero_shot(images, CXR14)
    columns = [ref_data.ENTITIES.index(e) for e in CXR14_ENTITIES]
    assert official.query_texts(CXR14)[1] == columns and columns[CXR14.index("Fibrosis")] == 73
    assert (cxr14.scores - reference["scores"][:, columns]).abs().max() <= 1e-5
    assert (cxr14.saliency - reference["maps"][:, columns]).abs().max() <= 1e-6
    assert torch.allclose(out.saliency.sum(dim=(-2, -1)), torch.ones(2, 75), atol=1e-5)  # rows of softmaxes, not normalised


def test_released_file_is_read_weights_only_with_cl_fc_accounted_for(files):
    checkpoint = torch.load(files["checkpoint"], weights_only=True)
    assert {"model", "optimizer", "lr_scheduler", "config", "epoch"} <= checkpoint.keys()
    assert "module.cl_fc.weight" in checkpoint["model"]
    state = family.checkpoint_filter_fn(checkpoint, MedKLIP, "f")
    assert "cl_fc.weight" in state and "image.layer3.5.bn3.running_var" in state and "project.0.weight" in state
    assert not any(k.startswith("module.") for k in state)


# -- the query book: tokenizer, BERT, cache ------------------------------------------------------
def test_text_encoder_equals_the_authors_tokenizer_and_book_code(files):
    reference = torch.load(DATA / "medklip_text_reference.pt", weights_only=True)
    encoder = TextEncoder(text_folder(str(files["bert"])), 64)
    tokens = encoder.tokenize(reference["medklip_texts"])
    assert torch.equal(tokens["input_ids"], reference["medklip_input_ids"])  # [CLS] + pieces, no [SEP], lower-cased
    assert torch.equal(tokens["attention_mask"], reference["medklip_attention_mask"])
    assert encoder.tokenizer.convert_ids_to_tokens(tokens["input_ids"][1].tolist()) == reference["medklip_tokens"][1]
    assert tokens["attention_mask"][-1].all()  # the long text: truncated to [CLS] + 63 pieces
    cls = encoder.embed(reference["medklip_texts"], torch.device("cpu"))
    assert torch.allclose(cls, reference["medklip_cls"], rtol=0, atol=1e-5)


def test_bio_clinicalbert_weight_layout_loads(files, tmp_path):
    """The released Bio_ClinicalBERT pytorch_model.bin: ``bert.`` prefix, pretraining heads, pooler, no
    tokenizer_config.json (lower-casing is BertTokenizer's default, as for the authors)."""
    from safetensors.torch import load_file

    state = load_file(str(files["bert"] / "model.safetensors"))
    bin_state = {f"bert.{k}": v for k, v in state.items()}
    bin_state["bert.embeddings.LayerNorm.gamma"] = bin_state.pop("bert.embeddings.LayerNorm.weight")
    bin_state["bert.embeddings.LayerNorm.beta"] = bin_state.pop("bert.embeddings.LayerNorm.bias")
    bin_state["cls.predictions.bias"] = torch.zeros(3)
    bin_state["bert.embeddings.position_ids"] = torch.arange(128)[None]
    folder = tmp_path / "Bio_ClinicalBERT"
    folder.mkdir()
    for name in ("config.json", "vocab.txt"):
        (folder / name).write_bytes((files["bert"] / name).read_bytes())
    torch.save(bin_state, folder / "pytorch_model.bin")
    texts = ref_data.text_samples()["medklip"]
    ours = TextEncoder(text_folder(str(folder)), 64)
    expected = TextEncoder(text_folder(str(files["bert"])), 64)
    assert torch.equal(ours.tokenize(texts)["input_ids"], expected.tokenize(texts)["input_ids"])
    assert torch.equal(ours.embed(texts, torch.device("cpu")), expected.embed(texts, torch.device("cpu")))


def test_query_embeddings_are_cached_on_disk_per_text_encoder_and_texts(smoke, files, monkeypatch, tmp_path):
    texts, _ = smoke.query_texts(CXR14)
    cached = smoke.cache_file(texts)
    smoke._query_cache.clear()
    first = smoke.query_embeddings(texts).clone()
    assert cached.is_file() and torch.load(cached, weights_only=True)["texts"] == list(texts)
    direct = TextEncoder(text_folder(str(files["bert"])), 64).embed(list(texts), torch.device("cpu"))
    assert torch.equal(first, direct)
    # a new model with the same text encoder reads the cache: BERT is never loaded
    monkeypatch.setattr(TextEncoder, "bert", lambda self: pytest.fail("BERT loaded despite a cached book"))
    with pytest.warns(UserWarning, match="RANDOM"):
        again = xbench_pl.create_model("medklip", random_init=True, knowledge=str(files["medklip_descriptions"]),
                                       text=str(files["bert"]), query_cache=str(files["cache"]))
    assert torch.equal(again.query_embeddings(texts), first)
    # other texts (one more query) are another cache entry
    assert smoke.cache_file(texts + ("x",)) != cached
    # another text encoder (here: another vocabulary) is another key
    other = tmp_path / "other_bert"
    other.mkdir()
    for path in files["bert"].iterdir():
        (other / path.name).write_bytes(path.read_bytes())
    (other / "vocab.txt").write_text((files["bert"] / "vocab.txt").read_text() + "extra\n")
    assert TextEncoder(text_folder(str(other)), 64).fingerprint != smoke.text_encoder.fingerprint


def test_precomputed_rows_are_used_and_missing_texts_need_the_text_encoder(official, files):
    texts, _ = official.query_texts(CXR14)
    assert torch.equal(official.query_embeddings(texts), ref_data.query_book("medklip", 0))
    with pytest.raises(ValueError, match="not in query_embeddings file and no text=DIR"):
        official.embed_texts(texts + ("an unseen description",))


# -- unseen findings, knowledge files ----------------------------------------------------------
def test_unseen_finding_adds_a_description_query(official, files, tmp_path):
    with pytest.raises(ValueError, match=r"'Aortic Enlargement' \(key 'aortic enlargement'\).*knowledge file"):
        official.query_texts(["Pneumonia", "Aortic Enlargement"])
    extra = tmp_path / "observation explanation_extra.json"
    extra.write_text(json.dumps({"aortic enlargement": "aortic enlargement is a wide aorta."}))
    model = MedKLIP(checkpoint=str(files["checkpoint"]), knowledge=[str(files["medklip_descriptions"]), str(extra)],
                    text=str(files["bert"]), query_embeddings=str(files["book"]), query_cache=str(tmp_path / "c"))
    texts, index = model.query_texts(["Pneumonia", "Aortic Enlargement", "Pneumonia"])
    assert len(texts) == 76 and texts[-1] == "aortic enlargement is a wide aorta." and index == [20, 75, 20]
    out = model.zero_shot(ref_data.reference_images(0), ["Pneumonia", "Aortic Enlargement"])
    assert out.scores.shape == (2, 2) and out.saliency.shape == (2, 2, 14, 14)
    # the 75 are always decoded; the appended query changes the others' scores (self-attention)
    alone = official.zero_shot(ref_data.reference_images(0), ["Pneumonia"])
    assert not torch.allclose(out.scores[:, 0], alone.scores[:, 0], atol=1e-7)
    mapped = MedKLIP(checkpoint=str(files["checkpoint"]), knowledge=str(files["medklip_descriptions"]),
                     query_embeddings=str(files["book"]), entities={"Rib Fracture": "fracture"})
    assert mapped.query_texts(["Rib Fracture"])[1] == [ref_data.ENTITIES.index("fracture")]


def test_knowledge_file_is_read_in_file_order_with_the_authors_key_typo(files, tmp_path):
    keys = list(json.loads(files["medklip_descriptions"].read_text()))
    assert keys[20] == "eumonia"  # their file's spelling: accepted, the values are read in order
    book = json.loads(files["medklip_descriptions"].read_text())
    swapped = dict(reversed(list(book.items())))
    bad = tmp_path / "reordered.json"
    bad.write_text(json.dumps(swapped))
    with pytest.raises(ValueError, match=r"reordered.json: key 0 is 'excluded_obs', expected entity 'normal'"):
        MedKLIP(random_init=True, knowledge=str(bad), query_embeddings=str(files["book"]))
    short = tmp_path / "short.json"
    short.write_text(json.dumps(dict(list(book.items())[:10])))
    with pytest.raises(ValueError, match="has 10 descriptions"):
        MedKLIP(random_init=True, knowledge=str(short), query_embeddings=str(files["book"]))
    # MAVL's copy (pneumonia spelled right, covid19 appended) reads the same 75 texts, plus covid19 by key
    with pytest.warns(UserWarning, match="RANDOM"):
        model = MedKLIP(random_init=True, knowledge=str(files["mavl_descriptions"]), query_embeddings=str(files["book"]))
    assert model.query_texts(["COVID-19 Opacity"])[1] == [75]


# -- errors ------------------------------------------------------------------------------------
def test_wrong_files_name_the_file_and_the_fix(files, tmp_path):
    knowledge = str(files["medklip_descriptions"])
    common = {"knowledge": knowledge, "query_embeddings": str(files["book"])}
    kad_like = tmp_path / "best_valid.pt"
    torch.save({"model": {"decoder.norm.weight": torch.ones(768)}, "image_encoder": {"res_l1.weight": torch.ones(2, 2)},
                "text_encoder": {}, "epoch": 1}, kad_like)
    with pytest.raises(CheckpointError, match=r"best_valid.pt is a KAD-style checkpoint.*use --model kad"):
        MedKLIP(checkpoint=str(kad_like), **common)
    clip = tmp_path / "open_clip_pytorch_model.bin"
    torch.save({"visual.conv1.weight": torch.ones(4, 3, 2, 2), "visual.proj": torch.ones(4, 2), "logit_scale": torch.ones(())}, clip)
    with pytest.raises(CheckpointError, match=r"open_clip_pytorch_model.bin does not fit.*missing keys.*CLIP"):
        MedKLIP(checkpoint=str(clip), **common)
    mavl = tmp_path / "checkpoint_full_40.pth"
    torch.save(ref_data.official_checkpoint("mavl", 0), mavl)
    with pytest.raises(CheckpointError, match=r"checkpoint_full_40.pth does not fit.*MAVL.*use --model mavl"):
        MedKLIP(checkpoint=str(mavl), **common)
    truncated = tmp_path / "checkpoint_final.pth"
    truncated.write_bytes(files["checkpoint"].read_bytes()[: 1 << 20])
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*checkpoint_final.pth.*truncated"):
        MedKLIP(checkpoint=str(truncated), **common)
    with pytest.raises(ValueError, match="needs checkpoint=.*checkpoint_final.pth"):
        MedKLIP(knowledge=knowledge, query_embeddings=str(files["book"]))


def test_missing_knowledge_and_text_encoder_are_named(files, tmp_path):
    weights = tmp_path / "checkpoint_final.pth"  # with a checkpoint, knowledge and text are required (random_init: stand-ins)
    weights.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="knowledge is required: .*observation explanation.json"):
        MedKLIP(checkpoint=str(weights), text=str(files["bert"]))
    with pytest.raises(FileNotFoundError, match=r"knowledge file not found: .*nope.json \(no such file\)"):
        MedKLIP(random_init=True, knowledge=str(tmp_path / "nope.json"), text=str(files["bert"]))
    with pytest.raises(FileNotFoundError, match="needs a local copy of .*Bio_ClinicalBERT.*text=None"):
        MedKLIP(checkpoint=str(weights), knowledge=str(files["medklip_descriptions"]))
    with pytest.raises(FileNotFoundError, match=r"text=.*missing_bert.*\(no such folder\)"):
        MedKLIP(random_init=True, knowledge=str(files["medklip_descriptions"]), text=str(tmp_path / "missing_bert"))
    empty = tmp_path / "empty_bert"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"empty_bert lacks \['vocab.txt', 'model.safetensors or pytorch_model.bin'\]"):
        MedKLIP(random_init=True, knowledge=str(files["medklip_descriptions"]), text=str(empty))
    with pytest.raises(ValueError, match="would download"):
        MedKLIP(random_init=True, knowledge=str(files["medklip_descriptions"]),
                text="hf-hub:emilyalsentzer/Bio_ClinicalBERT")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="knowledge file .*broken.json is not readable JSON"):
        MedKLIP(random_init=True, knowledge=str(broken), text=str(files["bert"]))


# -- random_init smoke run --------------------------------------------------------------------
def test_random_init_smoke_run_is_reproducible_and_flagged(smoke, files):
    assert smoke.random_weights
    out = smoke.zero_shot(ref_data.reference_images(1, batch=3), ["Pneumonia", "Fibrosis"])
    assert out.scores.shape == (3, 2) and ((out.scores >= 0) & (out.scores <= 1)).all()
    assert out.saliency.shape == (3, 2, 14, 14) and torch.isfinite(out.saliency).all()
    with pytest.warns(UserWarning, match="RANDOM"):
        twin = MedKLIP(random_init=True, knowledge=str(files["medklip_descriptions"]), text=str(files["bert"]),
                       query_cache=str(files["cache"]))
    assert all(torch.equal(a, b) for a, b in zip(smoke.state_dict().values(), twin.state_dict().values()))
    assert np.isclose(float(out.saliency.sum(dim=(-2, -1)).mean()), 1.0, atol=1e-5)
