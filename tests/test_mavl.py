"""MAVL: architecture vs the released checkpoints' layout, numerical equivalence with the authors'
code (feature and text scores, maps of every concept reduction), the 675-query concept book,
knowledge files and checkpoint errors.

The authors' outputs (``tests/data/mavl_reference.pt``, ``medklip_text_reference.pt``) were computed
by their own code on the deterministic data of ``tests/medklip_mavl_reference.py``
(``tests/data/make_medklip_mavl_reference.md``). The equivalence test injects the stand-in concept
book as a precomputed ``query_embeddings`` file; the BERT path is checked with a tiny BERT folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import medklip_mavl_reference as ref_data
import xbench_pl
from test_medklip import released_keys
from xbench_pl.models import medklip as family
from xbench_pl.models.checkpoints import CheckpointError
from xbench_pl.models.layers import AttentionPool2d
from xbench_pl.models.medklip import MAVL, save_query_embeddings
from xbench_pl.registry import read_config

DATA = Path(__file__).resolve().parent / "data"


def authors_texts(descriptions: Path, aspects: Path) -> list[str]:
    """MAVL's book texts as their test code builds them: descriptions by key, 8 aspects by key,
    re-assembled disease-major (query 9 i + j, j = 0 the description)."""
    book, concepts = json.loads(descriptions.read_text()), json.loads(aspects.read_text())
    return [t for e in ref_data.ENTITIES for t in [book[e], *concepts[e]]]


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("mavl")
    out = dict(ref_data.write_knowledge(root / "knowledge"))
    out["knowledge"] = [str(out["mavl_descriptions"]), str(out["mavl_aspects"])]
    out["bert"] = ref_data.write_bert_folder(root / "bert", seed=0)
    out["checkpoint"] = root / "checkpoint_full_40.pth"
    torch.save(ref_data.official_checkpoint("mavl", seed=0), out["checkpoint"])
    texts = authors_texts(out["mavl_descriptions"], out["mavl_aspects"])
    out["book"] = save_query_embeddings(root / "mavl_book.pt", texts, ref_data.query_book("mavl", seed=0))
    out["cache"] = root / "cache"
    return out


@pytest.fixture(scope="module")
def official(files) -> MAVL:
    return xbench_pl.create_model("mavl", checkpoint=str(files["checkpoint"]), knowledge=files["knowledge"],
                                  query_embeddings=str(files["book"]), query_cache=str(files["cache"]))


@pytest.fixture(scope="module")
def reference() -> dict:
    reference = torch.load(DATA / "mavl_reference.pt", weights_only=True)
    assert reference["seed"] == 0 and reference["entities"] == list(ref_data.ENTITIES)
    return reference


# -- architecture vs the released checkpoints --------------------------------------------------------
def test_architecture_matches_released_checkpoint_layout(files):
    """Every key of checkpoint_full_40/46.pth maps to one of ours with its shape, or is declared
    unused (temp, location_emb); the AttentionPool2d (text-mode scores) is built and loaded.
    19,654,220 parameters in the file."""
    spec = json.loads((DATA / "mavl_checkpoint_manifest.json").read_text())
    with torch.device("meta"), pytest.warns(UserWarning, match="RANDOM"):
        model = xbench_pl.create_model("mavl", random_init=True, knowledge=files["knowledge"], text=str(files["bert"]))
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    mapped, ignored = released_keys(MAVL, spec)
    assert mapped == ours
    assert sorted(ignored) == ["location_emb.bias", "location_emb.weight", "temp"]
    counts = spec["parameters"]
    assert counts["total"] == 19_654_220  # models.md: 19.65 M
    assert sum(p.numel() for p in model.parameters()) == counts["used_by_forward"] == 17_883_971
    assert sum(p.numel() for p in model.pool.parameters()) == counts["pool"] == 3_612_928
    assert counts["total"] - counts["used_by_forward"] == counts["location_emb"] + counts["temp"]


@pytest.mark.parametrize("name", ["mavl", "mavl_46"])
def test_registered_mavl_configs(name):
    cls, init_args = read_config("models", name)
    assert cls is MAVL and init_args["architecture"] == "mavl" and init_args["score_mode"] == "feature"
    config = family.read_architecture("mavl")
    assert "15970307" in config["_source"] and config["map_concepts"] == list(ref_data.GROUNDING_CONCEPTS)
    assert config["concepts"][1:] == list(ref_data.ASPECTS) and config["findings"]["Fibrosis"] == "tail_abnorm_obs"
    assert config["preprocess"] == family.read_architecture("medklip")["preprocess"]


# -- equivalence with the authors' code -------------------------------------------------------------
def test_scores_and_maps_equal_the_authors_code(official, files, reference):
    texts, index = official.query_texts(list(ref_data.ENTITIES))
    assert list(texts) == authors_texts(files["mavl_descriptions"], files["mavl_aspects"]) and len(texts) == 675
    assert index == list(range(75))
    images = ref_data.reference_images(0)
    out = official.zero_shot(images, list(ref_data.ENTITIES))
    assert (out.scores - reference["scores"]).abs().max() <= 1e-5
    assert out.saliency.shape == (2, 75, 14, 14)
    assert (out.saliency - reference["maps"]).abs().max() <= 1e-6
    decoded = official.decode(images, official.query_embeddings(texts))
    assert (decoded["logits"] - reference["logits"]).abs().max() <= 1e-4
    assert (decoded["attn"][:, 0].mean(dim=0) - reference["attn_layers_mean_image0"]).abs().max() <= 1e-6
    # the authors' other map reductions: max over the 4 concepts, and the description alone ("global")
    assert (official.saliency(decoded["attn"], (14, 14)) - reference["maps"]).abs().max() <= 1e-6
    official.map_reduce = "max"
    try:
        assert (official.saliency(decoded["attn"], (14, 14)) - reference["maps_max"]).abs().max() <= 1e-6
        official.map_reduce, official.map_concepts = "mean", [0]
        assert (official.saliency(decoded["attn"], (14, 14)) - reference["maps_global"]).abs().max() <= 1e-6
    finally:
        official.map_reduce, official.map_concepts = "mean", list(ref_data.GROUNDING_CONCEPTS)


def test_text_mode_scores_equal_the_authors_code(official, reference):
    images = ref_data.reference_images(0)
    decoded = official.decode(images, official.query_embeddings(official.query_texts(list(ref_data.ENTITIES))[0]))
    assert (official.pool(decoded["tokens"]) - reference["global_feature"]).abs().max() <= 1e-5
    assert (official.text_logits(decoded) - reference["text_logits"]).abs().max() <= 1e-6
    official.score_mode = "text"
    try:
        out = official.zero_shot(images, ["Pneumonia", "Fibrosis"])
    finally:
        official.score_mode = "feature"
    columns = [ref_data.ENTITIES.index("pneumonia"), ref_data.ENTITIES.index("tail_abnorm_obs")]
    assert (out.scores - reference["text_scores"][:, columns]).abs().max() <= 1e-5


def test_attention_pool_matches_torch_multi_head_attention():
    torch.manual_seed(0)
    pool = AttentionPool2d(grid=3, width=16, heads=4, out=8)
    tokens = torch.randn(2, 9, 16)
    x = torch.cat([tokens.mean(1, keepdim=True), tokens], 1).transpose(0, 1) + pool.positional_embedding[:, None]
    expected, _ = torch.nn.functional.multi_head_attention_forward(
        x, x, x, 16, 4, None, torch.cat([pool.q_proj.bias, pool.k_proj.bias, pool.v_proj.bias]), None, None, False, 0.0,
        pool.c_proj.weight, pool.c_proj.bias, use_separate_proj_weight=True, q_proj_weight=pool.q_proj.weight,
        k_proj_weight=pool.k_proj.weight, v_proj_weight=pool.v_proj.weight, need_weights=False)
    assert torch.allclose(pool(tokens), expected[0], atol=1e-6)
    with pytest.raises(ValueError, match="built for 9 tokens, got 16"):
        pool(torch.randn(1, 16, 16))


# -- the concept book ---------------------------------------------------------------------------------
def test_concept_book_equals_the_authors_book_code(files, tmp_path):
    """Through the model: tiny BERT, 675 texts from the knowledge files; rows of the two diseases of
    the reference (pneumonia, obscure) equal their concept book. obscure/opacity is longer than 64
    tokens: truncated to [CLS] + 63 pieces as theirs."""
    text_ref = torch.load(DATA / "medklip_text_reference.pt", weights_only=True)
    with pytest.warns(UserWarning, match="RANDOM"):
        model = MAVL(random_init=True, knowledge=files["knowledge"], text=str(files["bert"]), query_cache=str(tmp_path))
    texts, _ = model.query_texts(["Pneumonia"])
    rows = [9 * ref_data.ENTITIES.index(e) + j for e in ("pneumonia", "obscure") for j in range(9)]
    assert [texts[r] for r in rows[::9]] == text_ref["mavl_descriptions"]
    assert [texts[r] for r in rows if r % 9] == text_ref["mavl_aspects"]
    tokens = model.text_encoder.tokenize([texts[r] for r in rows if r % 9])
    assert torch.equal(tokens["input_ids"], text_ref["mavl_aspect_input_ids"])
    long = 9 * ref_data.ENTITIES.index("obscure") + 4  # aspect 3 = opacity
    assert model.text_encoder.tokenize([texts[long]])["attention_mask"].sum() == 64
    book = model.query_embeddings(texts)
    assert book.shape == (675, 768)
    assert torch.allclose(book[rows], text_ref["mavl_concept_book"], rtol=0, atol=1e-5)


def test_unseen_finding_adds_nine_queries(official, files, tmp_path):
    texts, index = official.query_texts(["COVID-19 Opacity", "Pneumonia"])  # MAVL's files have covid19
    assert len(texts) == 684 and index == [75, 20]
    assert texts[-9:] == (json.loads(files["mavl_descriptions"].read_text())["covid19"],
                          *json.loads(files["mavl_aspects"].read_text())["covid19"])
    with pytest.raises(ValueError, match=r"no description for 'ILD' \(key 'ild'\)"):
        official.query_texts(["ILD"])
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"ild": "ild is a lung disease.", "copd": "copd is a lung disease."}))
    aspects = tmp_path / "extra_aspects.json"
    aspects.write_text(json.dumps({"ild": [f"{a}: text" for a in ref_data.ASPECTS], "copd": ["border: only one"]}))
    model = MAVL(checkpoint=str(files["checkpoint"]), knowledge=[*files["knowledge"], str(extra), str(aspects)],
                 text=str(files["bert"]), query_embeddings=str(files["book"]), query_cache=str(tmp_path / "c"))
    out = model.zero_shot(ref_data.reference_images(0), ["ILD", "Pneumonia"])
    assert out.scores.shape == (2, 2) and out.saliency.shape == (2, 2, 14, 14)
    with pytest.raises(ValueError, match=r"exactly 8 aspect sentences per entity.*'copd' has 1 \(.*extra_aspects.json\)"):
        model.query_texts(["COPD"])


def test_knowledge_is_read_by_key(files):
    # MedKLIP's copy spells pneumonia "eumonia": MAVL reads by key, so it is missing there
    with pytest.raises(ValueError, match=r"no description for 1 of the 75 entities \('pneumonia'\).*'eumonia'"):
        MAVL(checkpoint=str(files["checkpoint"]), knowledge=[str(files["medklip_descriptions"]), str(files["mavl_aspects"])],
             query_embeddings=str(files["book"])).query_texts(["Pneumonia"])
    with pytest.raises(ValueError, match=r"no 8 aspect sentences \(as in gpt4_mimic.json\) for 75 of the 75 entities"):
        MAVL(checkpoint=str(files["checkpoint"]), knowledge=[str(files["mavl_descriptions"])],
             query_embeddings=str(files["book"])).query_texts(["Pneumonia"])


# -- errors ---------------------------------------------------------------------------------------
def test_wrong_checkpoints_name_the_file_and_the_fix(files, tmp_path):
    common = {"knowledge": files["knowledge"], "query_embeddings": str(files["book"])}
    medklip = tmp_path / "checkpoint_final.pth"
    torch.save(ref_data.official_checkpoint("medklip", 0), medklip)
    with pytest.raises(CheckpointError, match=r"checkpoint_final.pth does not fit.*MedKLIP.*use --model medklip"):
        MAVL(checkpoint=str(medklip), **common)
    truncated = tmp_path / "checkpoint_full_46.pth"
    truncated.write_bytes(files["checkpoint"].read_bytes()[:-4096])
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*checkpoint_full_46.pth.*truncated"):
        MAVL(checkpoint=str(truncated), **common)
    checkpoint = ref_data.official_checkpoint("mavl", 0)
    del checkpoint["model"]["module.pool.c_proj.bias"]
    checkpoint["model"]["module.classifier.weight"] = torch.zeros(2, 256)
    edited = tmp_path / "edited.pth"
    torch.save(checkpoint, edited)
    with pytest.raises(CheckpointError, match=r"edited.pth does not fit.*missing keys: \[pool.c_proj.bias\].*"
                                              r"classifier.weight \(2, 256\) != \(2, 2304\)"):
        MAVL(checkpoint=str(edited), **common)
    with pytest.raises(FileNotFoundError, match="knowledge is required: .*gpt4_mimic.json"):
        MAVL(checkpoint=str(files["checkpoint"]), query_embeddings=str(files["book"]))
    with pytest.raises(ValueError, match="score_mode must be one of"):
        MAVL(score_mode="global", **common)


def test_random_init_smoke_run(files):
    with pytest.warns(UserWarning, match="RANDOM"):
        model = xbench_pl.create_model("mavl", random_init=True, knowledge=files["knowledge"],
                                       text=str(files["bert"]), query_cache=str(files["cache"]), score_mode="text")
    assert model.random_weights
    out = model.zero_shot(ref_data.reference_images(2, batch=1), ["Pneumothorax", "Cardiomegaly", "Lung Opacity"])
    assert out.scores.shape == (1, 3) and ((out.scores >= 0) & (out.scores <= 1)).all()
    assert out.saliency.shape == (1, 3, 14, 14) and torch.isfinite(out.saliency).all()
