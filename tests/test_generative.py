"""The grounded generative family (``xbench_pl.models.generative``): tiny random configurations of each real
architecture, built in code, through the benchmark; the stated-box metrics end to end with a model that states the
ground truth."""

from __future__ import annotations

import json

import pytest
import torch
from test_cli import in_process, one_and_two_processes

from xbench_pl.metrics.boxes import BOX_KEYS
from xbench_pl.registry import create_model

FAMILIES = ("maira2", "medgemma", "lingshu", "radvlm")


@pytest.fixture(scope="module")
def tiny():
    """Each family's tiny random model (short answers: the grounding path runs, the runs stay quick)."""
    return {name: create_model(name, random_init=True, max_new_tokens=8) for name in FAMILIES}


def images(model, n=1, seed=0):
    size = model.preprocess.size
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def pixel_forward(model, x, prompts, token_inputs=True, **extra):
    """The release processor's path: the prompts' ids, the image's pixels for each row (the tower once per row) and
    what the processor gives beside the ids."""
    inputs = model.encode(prompts)
    with torch.no_grad():
        out = model.network(**inputs, **(model.token_inputs(inputs["input_ids"]) if token_inputs else {}),
                            **model.positions(inputs["attention_mask"]), **model.image_inputs(x.expand(len(prompts), -1, -1, -1)),
                            use_cache=False, **extra)
    return out, inputs


@pytest.mark.parametrize("name", FAMILIES)
def test_the_map_is_the_last_querys_attention_as_eager_attention_gives_it(tiny, name):
    """The answer (the image tower once per image, its features given to every prompt: ``mm_encoder_outputs``) equals
    the processor's path (pixels per prompt); the map read by ``last_query_attention`` (SDPA for the layers' outputs,
    the last query row's weights beside them) equals transformers' eager attention weights of that row, averaged over
    layers and heads, at the image tokens."""
    from xbench_pl.models.generative.base import LAST_QUERY

    model = tiny[name]
    x = images(model)
    texts = ["Nodule", "Pleural effusion"]
    ours = model.zero_shot(x, texts)
    if name == "maira2":  # its score is a likelihood contrast (test_maira2_reference checks its logits)
        return
    model.network.set_attn_implementation({"text_config": "eager"})
    try:
        out, inputs = pixel_forward(model, x, [model.prompt(model.question.format(t)) for t in texts], output_attentions=True)
    finally:
        model.network.set_attn_implementation({"text_config": LAST_QUERY})
    last = torch.stack([a[:, :, -1] for a in out.attentions]).mean(dim=(0, 2))
    assert torch.allclose(ours.saliency[0], model.image_attention(last, inputs["input_ids"]), atol=1e-6, rtol=1e-5)
    answer = out.logits[:, -1, list(model.answer_ids)].float().log_softmax(-1)
    assert torch.allclose(ours.logits[0], answer[:, 0] - answer[:, 1], atol=1e-5)


@pytest.mark.parametrize("name", ["medgemma", "lingshu"])
def test_the_processors_token_types_change_the_answer_and_are_given(tiny, name):
    """Gemma 3's ``token_type_ids`` (image tokens attend both ways) and Qwen2.5-VL's ``mm_token_type_ids`` (its
    multimodal rope) change the forward: without them the answer differs from the one scored here."""
    model = tiny[name]
    x = images(model, seed=2)
    prompt = [model.prompt(model.question.format("Nodule"))]
    with_types, _ = pixel_forward(model, x, prompt)
    without, _ = pixel_forward(model, x, prompt, token_inputs=False)
    assert (with_types.logits[0, -1] - without.logits[0, -1]).abs().max() > 1e-4
    answer = with_types.logits[:, -1, list(model.answer_ids)].float().log_softmax(-1)
    assert torch.allclose(model.zero_shot(x, ["Nodule"]).logits[0, 0], answer[0, 0] - answer[0, 1], atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_findings_answer_does_not_depend_on_the_other_prompts_of_its_forward(tiny, name):
    """Left padding with the mask's positions: a finding queried alone or beside a longer text gets the same score,
    map and generated text (to float32 round-off)."""
    model = tiny[name]
    x = images(model, seed=1)
    alone = model.zero_shot(x, ["Nodule"])
    padded = model.zero_shot(x, ["Nodule", "a much longer phrase about a left pleural effusion"])
    assert abs(float(alone.logits[0, 0] - padded.logits[0, 0])) < 1e-5
    assert torch.allclose(alone.saliency[0, 0], padded.saliency[0, 0], atol=1e-7)
    assert alone.stated.texts[0][0] == padded.stated.texts[0][0]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_runs_the_benchmark_and_writes_the_box_keys(tmp_path, name):
    result = in_process("test", "--model", name, "--model.random_init", "true", "--model.max_new_tokens", "8",
                        "--model.bootstrap", "20", "--data", "ms_cxr_demo", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RANDOM weights" in result.stderr and "stand-in tokenizer" in result.stderr
    report = json.loads((tmp_path / "metrics.json").read_text())
    table = report["datasets"]["ms_cxr_demo"]
    assert set(BOX_KEYS) <= set(table["mean"])
    assert 0 <= table["mean"]["parse_failure_rate"] <= 1 and table["mean"]["box_miou"] is not None
    assert "parse_failure_rate" in table["ci"]["mean"]
    assert report["random_weights"] is True


@pytest.mark.ddp_pair
def test_one_and_two_processes_give_identical_metrics(tmp_path):
    """Each forward holds one image's prompts (``GenerativeModel.rows``), so how the images fall into batches and
    processes changes no number."""
    a, b, _ = one_and_two_processes(tmp_path, "test", "--model", "lingshu", "--model.random_init", "true",
                                    "--model.max_new_tokens", "6", "--model.bootstrap", "20", "--data", "ms_cxr_demo",
                                    "--data.batch_size", "3", "--trainer.accelerator", "cpu")
    assert json.dumps(a) == json.dumps(b)


def test_a_model_that_states_the_ground_truth_scores_one(tmp_path):
    """The oracle states every finding's ground-truth boxes in model-input pixels (``fixture_models.OracleBoxModel``):
    mapped back through the affine and judged, every box metric is perfect, whatever the crop of the input."""
    result = in_process("test", "--model", "fixture_models.OracleBoxModel", "--model.bootstrap", "0", "--data", "demo",
                        "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    mean = json.loads((tmp_path / "metrics.json").read_text())["datasets"]["demo"]["mean"]
    assert mean["box_acc@0.5"] == 1 and mean["box_miou"] == pytest.approx(1, abs=1e-9)
    assert mean["box_precision"] == 1 and mean["box_recall"] == 1
    assert mean["box_map50"] == pytest.approx(1) and mean["box_map"] == pytest.approx(1)
    assert mean["parse_failure_rate"] == 0 and mean["box_absent_drawn"] == 0
    # the map is 1 inside its boxes: its maximum always is; its mass leaks only by the warp's bilinear rim
    assert mean["self_consistency_pg"] == 1 and 0.85 < mean["self_consistency_mass"] < 1


def test_a_box_drawn_for_an_absent_finding_is_counted(tmp_path):
    result = in_process("test", "--model", "fixture_models.OracleBoxModel", "--model.absent_box", "true", "--model.bootstrap", "0",
                        "--data", "demo", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    table = json.loads((tmp_path / "metrics.json").read_text())["datasets"]["demo"]
    assert table["mean"]["box_absent_drawn"] == 1
    assert table["mean"]["box_acc@0.5"] == 1  # the findings present are still found
    # a stated box on an image without the finding is a false positive of that finding's mAP
    assert table["mean"]["box_map50"] < 1


def test_the_store_keeps_the_boxes_and_texts_and_rescores_to_the_runs_numbers(tmp_path):
    """``--predictions``: the stated boxes and raw texts go into the shards; ``score`` of the store gives the run's
    metrics, box keys included."""
    store = tmp_path / "store"
    run = in_process("test", "--model", "radvlm", "--model.random_init", "true", "--model.max_new_tokens", "8", "--model.bootstrap", "0",
                     "--data", "ms_cxr_demo", "--predictions", str(store), "--predictions_dtype", "float32", "--out", str(tmp_path / "run"))
    assert run.returncode == 0, run.stderr[-3000:]
    from xbench_pl.prediction_store import Store

    shards = Store(store).load_intact()
    stated = shards[0]["stated"]
    assert len(stated.texts) == len(shards[0]["image_ids"]) and all(isinstance(t, str) for row in stated.texts for t in row)
    rescored = in_process("score", "--predictions", str(store), "--out", str(tmp_path / "rescored"))
    assert rescored.returncode == 0, rescored.stderr[-3000:]
    a, b = (json.loads((tmp_path / name / "metrics.json").read_text())["datasets"]["ms_cxr_demo"] for name in ("run", "rescored"))
    assert set(BOX_KEYS) <= set(b["mean"]) and a["mean"] == b["mean"] and a["classes"] == b["classes"]


def test_maira2_crops_as_the_releases_processor_floors_the_offset(tiny):
    """transformers' ``center_crop`` (the release's ``BitImageProcessor``) floors the crop offset: a 3000 x 2000 image
    resized to 777 x 518 is cut at x = 129, where torchvision's ``CenterCrop`` would round to 130."""
    preprocess = tiny["maira2"].preprocess
    side = preprocess.size
    _, (_, _, tx, _) = type(preprocess)(**{**preprocess.__dict__, "size": 518}).plan(2000, 3000)
    assert preprocess.crop_offset == "floor" and side == 56 and tx == -129


@pytest.mark.parametrize("name", ["maira2", "medgemma"])
def test_gradient_explainers_explain_the_answer_on_the_image_tower(tiny, name):
    """``--model.explainer gradcam``: Grad-CAM of the answer's logit on the image tower's last block (the tower runs once
    per image in the recognition forward); the boxes are still stated, the scores are the native forward's."""
    from xbench_pl.registry import create_model

    explained = create_model(name, random_init=True, max_new_tokens=4, explainer="gradcam")
    x = images(explained, n=2, seed=3)
    native = tiny[name].zero_shot(x, ["Nodule", "Mass"])
    cam = explained.explained(x, ["Nodule", "Mass"])
    assert torch.allclose(cam.scores, native.scores, atol=1e-5)
    side = explained.preprocess.size // 14 if name == "maira2" else explained.network.config.vision_config.image_size // 8
    assert cam.saliency.shape == (2, 2, side, side)  # the tower's patch grid (MedGemma's attention map: its pooled tokens)
    assert cam.saliency.shape != native.saliency.shape or not torch.allclose(cam.saliency, native.saliency)
    assert cam.stated is not None and native.stated.texts[0][0].startswith(cam.stated.texts[0][0])  # 4 of its 8 tokens


def test_a_family_whose_tower_no_explainer_reads_is_refused_in_one_line():
    from xbench_pl.registry import create_model

    with pytest.raises(ValueError, match="Lingshu has no image tower an explainer knows"):
        create_model("lingshu", random_init=True, explainer="gradcam")


@pytest.mark.parametrize("name", ["medgemma", "lingshu", "radvlm"])
def test_a_release_folder_loads_and_answers_as_the_model_it_was_saved_from(tiny, name, tmp_path):
    """``--model.checkpoint DIR``: the folder's ``config.json``, tokenizer and safetensors (here a tiny model saved in
    transformers' layout) build the same network, strictly loaded, with the same answers; a folder without weights is
    one error naming it."""
    from safetensors.torch import save_file

    from xbench_pl.models.checkpoints import CheckpointError
    from xbench_pl.registry import create_model

    model = tiny[name]
    (tmp_path / "config.json").write_text(model.network.config.to_json_string())
    model.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=f"{tmp_path}: no \\*.safetensors"):
        create_model(name, checkpoint=str(tmp_path), max_new_tokens=8)
    save_file({k: v.detach().clone().contiguous() for k, v in model.network.state_dict().items()}, str(tmp_path / "model.safetensors"))
    size = {"image_size": model.preprocess.size} if name == "lingshu" else {}  # its release input is 448: the tiny one's here
    loaded = create_model(name, checkpoint=str(tmp_path), max_new_tokens=8, **size)
    assert not loaded.random_weights and loaded.preprocess == model.preprocess
    x = images(loaded, seed=4)
    a, b = loaded.zero_shot(x, ["Nodule"]), model.zero_shot(x, ["Nodule"])
    assert torch.allclose(a.logits, b.logits, atol=1e-5) and torch.allclose(a.saliency, b.saliency, atol=1e-6)
    assert a.stated.texts == b.stated.texts


@pytest.mark.parametrize("name, size, grid", [("lingshu", 448, 16), ("medgemma", 896, 16), ("radvlm", 384, 27), ("maira2", 518, 37)])
def test_random_init_at_the_release_size_builds_the_releases_network(name, size, grid):
    """``--model.random_size release`` (benchmarks on a GPU): the release's configuration (``models/configs/generative``)
    with the stand-in tokenizer's ids in its token fields; built here on the meta device (no memory)."""
    from xbench_pl.registry import create_model

    with torch.device("meta"):
        model = create_model(name, random_init=True, random_size="release")
    assert model.preprocess.size == size and model.image_grid() == (grid, grid)
    ids = model.tokenizer.convert_tokens_to_ids
    assert all(getattr(model.network.config, field) == ids(token) for field, token in model.TOKEN_FIELDS.items())
    assert model.network.config.get_text_config().eos_token_id == ids(model.STOP_TOKEN)
    assert sum(p.numel() for p in model.network.parameters()) > 4e9


def test_the_trust_measures_compare_maps_without_generating_boxes(tmp_path, monkeypatch):
    """``--model.trust randomization``: each randomized copy's maps come from ``map_output`` (the recognition forward),
    never from a generation whose boxes nothing reads."""
    from xbench_pl.models.generative.base import GenerativeModel

    calls = []
    original = GenerativeModel.stated
    monkeypatch.setattr(GenerativeModel, "stated", lambda self, images, classes: calls.append(len(classes)) or original(self, images, classes))
    result = in_process("test", "--model", "lingshu", "--model.random_init", "true", "--model.max_new_tokens", "4",
                        "--model.bootstrap", "0", "--model.trust", "randomization", "--data", "ms_cxr_demo", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    table = json.loads((tmp_path / "metrics.json").read_text())["datasets"]["ms_cxr_demo"]
    assert [s["stage"] for s in table["trust"]["stages"]] == ["language model", "image tower"]
    assert table["mean"]["randomization_ssim"] is not None
    batches = len(calls)  # the trained model's own batches state boxes; its two randomized copies do not
    assert batches > 0 and sum(calls) == table["mean"]["n_pos"] + table["mean"]["n_neg"]
