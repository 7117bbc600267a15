"""The cascading randomization (``xbench_pl.models.randomization``) of every family on tiny random models: each stage
re-initialises exactly its modules' parameters, earlier stages stay as they were randomized, one seed gives one set
of weights, the original model is untouched and the cached text embeddings are dropped. And the issue's done-check:
an input-only map fails the randomization test, a gradient map passes it."""

from __future__ import annotations

import json
from itertools import islice

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import biovil_reference
import xbench_pl
import radzero_reference
from fixture_models import LinearIntensityModel
from test_explainers_families import FAMILIES, builders  # noqa: F401  (builders: the tiny models' fixture)
from xbench_pl.metrics.functional import normalize_saliency
from xbench_pl.metrics.trust import passes_randomization, random_pair_baseline, spearman, ssim
from xbench_pl.metrics.trust_mode import value_columns
from xbench_pl.models.baselines import UniformBaseline
from xbench_pl.models.biovil import BioViL
from xbench_pl.models.radzero import RadZero
from xbench_pl.models.randomization import (INIT_STD, Cascade, cascade_stages, detached_copy, parameter_names,
                                           randomized_copy)

pytestmark = pytest.mark.filterwarnings("ignore:.*RANDOM weights:UserWarning")

CLASSES = ["Atelectasis", "Pleural Effusion", "Nodule"]
RESNET3_BLOCKS = [f"image layer{layer}.{block}" for layer, blocks in ((3, 6), (2, 4), (1, 3))
                  for block in reversed(range(blocks))]
RESNET50_BLOCKS = [f"image layer4.{block}" for block in (2, 1, 0)] + RESNET3_BLOCKS
#: each tiny family's stages, top first (the table in docs/trust.md)
STAGES = {
    "clip": ["text", "image head", "image resblocks.1", "image resblocks.0", "image stem"],
    "biomedclip": ["text", "image head", *[f"image blocks.{i}" for i in reversed(range(6))], "image stem"],
    "medklip": ["decoder", "query", "image head", *RESNET3_BLOCKS, "image stem"],
    "mavl": ["decoder", "query", "image head", *RESNET3_BLOCKS, "image stem"],
    "kad": ["decoder", "text", "image head", *RESNET3_BLOCKS, "image stem"],
    "devide": ["decoder", "text", "image head", "image layer.1", "image layer.0", "image stem"],
    "carzero": ["decoder", "text", "image head", "image layer.1", "image layer.0", "image stem"],
    "biovil": ["text", "image head", *RESNET50_BLOCKS, "image stem"],
    "radzero": ["alignment", "text", "image head", "image layer.1", "image layer.0", "image stem"],
}


@pytest.fixture(scope="module")
def build(builders, tmp_path_factory):  # noqa: F811
    """name -> a tiny random model of that family (BioViL: the full ResNet-50 with a tiny text tower)."""
    root = tmp_path_factory.mktemp("randomization")
    biovil_text = str(biovil_reference.write_text_folder(root / "biovil_text", weights=False))
    radzero_architecture = root / "radzero.json"
    towers = radzero_reference.write_tower_folders(root / "towers")
    radzero_architecture.write_text(json.dumps(radzero_reference.tiny_architecture(towers)))
    radzero_text = str(radzero_reference.write_tokenizer_folder(root / "radzero_text"))

    def make(name: str, **options) -> nn.Module:
        torch.manual_seed(0)
        if name == "biovil":
            return BioViL("biovil", random_init=True, text=biovil_text, **options)
        if name == "radzero":
            return RadZero(str(radzero_architecture), random_init=True, text=radzero_text, **options)
        return builders(name, **options)

    return make


def images_for(model, count: int = 1) -> torch.Tensor:
    size = model.preprocess.size
    return torch.randn(count, 3, size, size, generator=torch.Generator().manual_seed(5))


def parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def fill_caches(model: nn.Module) -> None:
    """Put an entry in every embedding cache of ``model`` (as a forward would), cheaply."""
    for cache in model.embedding_caches():
        cache.get_or_compute(("probe",), "cpu", lambda: torch.zeros(1))


def perturbed_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Move every parameter of ``model`` off its init value (so that a re-initialised one always differs); a copy."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 + 0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return parameters(model)


def stage_owner(model: nn.Module, stages: list) -> dict[str, int]:
    return {p: index for index, (_, names) in enumerate(stages) for n in names for p in parameter_names(model, n)}


def changed_parameters(model: nn.Module, original: dict[str, torch.Tensor]) -> set[str]:
    return {n for n, p in model.named_parameters() if not torch.equal(p, original[n])}


#: a forward of MedKLIP decodes its 75 knowledge queries (a minute on a CPU): its parameters are checked only
FORWARD_CHECKED = [name for name in FAMILIES if name != "medklip"] + ["radzero"]


@pytest.mark.parametrize("name", [*FAMILIES, "biovil", "radzero"])
def test_stages_are_declared_top_first_and_cover_every_parameter(build, name):
    model = build(name)
    stages = cascade_stages(model)
    assert [stage for stage, _ in stages] == STAGES[name]
    assert sorted(stage_owner(model, stages)) == sorted(n for n, _ in model.named_parameters())  # each exactly once


#: MAVL is MedKLIP's class (its stages are checked above) and BioViL's ResNet-50 is KAD's tower at full size
@pytest.mark.parametrize("name", [name for name in FAMILIES if name != "mavl"] + ["radzero"])
def test_each_stage_randomizes_exactly_its_modules_cumulatively(build, name):
    model = build(name)
    images = images_for(model)
    fill_caches(model)
    original, state = perturbed_parameters(model), {k: v.clone() for k, v in model.state_dict().items()}
    stages = cascade_stages(model)
    owner = stage_owner(model, stages)

    last = len(stages) - 1
    previous = None
    for upto in (0, 1, last):
        randomized = randomized_copy(model, upto, seed=3)
        now = parameters(randomized)
        assert changed_parameters(randomized, original) == {n for n, stage in owner.items() if stage <= upto}, stages[upto][0]
        if previous is not None:  # the earlier stages keep the weights they were given
            assert all(torch.equal(now[n], previous[n]) for n, stage in owner.items() if stage < min(upto, 2))
        previous = now
        assert not randomized.training
        # cached text embeddings are dropped where they come from the model's weights (MedKLIP's do not)
        assert all(bool(len(cache)) != model.CACHES_FOLLOW_WEIGHTS for cache in randomized.embedding_caches())
        if upto == 0 and name in FORWARD_CHECKED:  # the top stage takes effect (a stale text cache would hide it)
            model.clear_caches()
            output = randomized.zero_shot(images, CLASSES)
            assert not torch.allclose(output.scores, model.zero_shot(images, CLASSES).scores)
            fill_caches(model)
    again = parameters(randomized_copy(model, last, seed=3))
    assert all(torch.equal(again[n], previous[n]) for n in again)  # same seed, same weights
    other = parameters(randomized_copy(model, 1, seed=4))
    drawn = [n for n in other if owner[n] == 1 and again[n].unique().numel() > 1]  # not a constant init (norms)
    assert drawn and all(not torch.equal(other[n], again[n]) for n in drawn)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # the original is untouched
    assert all(len(cache) for cache in model.embedding_caches())


def test_cascade_walks_every_stage_on_one_copy_as_randomized_copy_does_every_time(build):
    """Walked twice (the second walk starts from the trained weights again), the one working copy has each stage's
    weights and buffers as ``randomized_copy`` gives them: BatchNorm's statistics (KAD's ResNet), which its init
    resets, come back from the model too."""
    model = build("kad")
    perturbed_parameters(model)
    with torch.no_grad():
        for buffer in model.buffers():
            if buffer.is_floating_point():
                buffer.add_(0.5)  # trained statistics, away from the init's zeros and ones
    expected = [randomized_copy(model, index, seed=2).state_dict() for index in range(len(STAGES["kad"]))]
    walk, seen = Cascade(model, seed=2), []
    for _ in range(2):
        for index, stage, randomized in walk:
            seen.append(randomized)
            assert stage == STAGES["kad"][index]
            assert all(torch.equal(v, expected[index][k]) for k, v in randomized.state_dict().items()), stage
    assert len(seen) == 2 * len(STAGES["kad"]) and all(m is seen[0] for m in seen)


def demo_batches(model, count: int = 2) -> list:
    """The first ``count`` batches (two demo images each) as ``model``'s preprocessing makes them, a 32-pixel eval grid."""
    data = xbench_pl.create_datamodule("demo", preprocess=model.preprocess, batch_size=2, num_workers=0, eval_size=32)
    data.setup("test")
    return list(islice(data.test_dataloader(), count))


@pytest.mark.parametrize("name, explainer", [("clip", "gradcam"), ("carzero", "native")])
def test_the_walked_cascade_measures_what_a_copy_per_stage_measured(build, name, explainer):
    """``TrustRun`` walks one working copy down the cascade at every batch. A copy per stage (``randomized_copy``: what
    a run held before) gives the same maps and bit-identical SSIM and Spearman values, batch after batch; each stage
    encodes its texts once per run, as its own copy did (CLIP's text tower runs at the first batch only)."""
    model = build(name, explainer=explainer, trust="randomization")
    run, batches, stages = model.trust_run, demo_batches(model), len(cascade_stages(model))
    copies = [randomized_copy(model, index, seed=0) for index in range(stages)]
    columns = value_columns(stages)
    text_forwards = []
    with torch.inference_mode():
        for batch in batches:
            output = model.batch_output(batch)
            if name == "clip" and not text_forwards:  # the trained model's texts encoded: only the walk's from here on
                model.model.token_embedding.register_forward_hook(lambda *_: text_forwards.append(1))
                text_forwards.append(0)
            measured = run.measure(model, batch, output, model.normalize)
            sample, cls = measured["sample"], measured["cls"]
            assert sample.numel() > 0
            raw = run.eval_maps(output.saliency, batch, sample, cls).float()
            maps = normalize_saliency(raw, model.normalize)
            for index, (walked, randomized) in enumerate(zip(run.randomized(model), copies, strict=True)):
                theirs = randomized.map_output(batch).promoted().saliency
                assert torch.equal(walked.map_output(batch).promoted().saliency, theirs), index
                other = run.eval_maps(theirs, batch, sample, cls).float()
                expected = {"ssim": ssim(maps, normalize_saliency(other, model.normalize)), "spearman": spearman(raw, other),
                            "spearman_abs": spearman(raw, other, absolute=True)}
                for value, tensor in expected.items():
                    got = measured["values"][:, columns.index(f"stage{index}_{value}")]
                    assert torch.equal(got.nan_to_num(7.0), tensor.double().nan_to_num(7.0)), (index, value)
    if name == "clip":
        assert sum(text_forwards) == stages  # once per stage (a text batch each), not once per stage and batch


def test_a_copy_made_in_inference_mode_can_be_explained_with_gradients(build):
    """Lightning tests under ``torch.inference_mode``: the copy's weights must still take part in autograd."""
    model = build("carzero", explainer="gradcam")
    images = images_for(model)
    with torch.inference_mode():
        randomized = randomized_copy(model, 2, seed=0)
        maps = randomized.explained(images, CLASSES).saliency
    assert not any(torch.is_inference(p) for p in randomized.parameters())
    assert torch.isfinite(maps).all() and maps.shape[:2] == (1, len(CLASSES))


def test_a_copy_leaves_the_evaluation_state_behind():
    model = LinearIntensityModel()
    model.add_dataset("demo", CLASSES)
    model.results, model.region_datasets = {"demo": {"mean": {}}}, {"demo": object()}
    copy = detached_copy(model)
    assert len(copy.benchmark) == 0 and copy.results == {} and copy.region_datasets == {}
    assert "demo" in model.benchmark and model.results and model.region_datasets  # the original keeps its own
    assert torch.equal(copy.mix.weight, model.mix.weight) and copy.mix.weight is not model.mix.weight


#: the number of stages of every registered model at full size (the table in docs/trust.md); 0: nothing to randomize
FULL_SIZE_STAGES = {"clip": 15, "chexzero": 15, "biomedclip": 15, "open_clip": 15, "biovil": 19, "biovil_t": 19, "medklip": 17,
                    "mavl": 17, "mavl_46": 17, "kad": 20, "kad_224": 17, "kad_512": 20, "kad_1024": 20, "devide": 16,
                    "carzero": 16, "radzero": 16, "uniform": 0, "center": 0, "location_prior": 0, "reader": 0,
                    "maira2": 3, "medgemma": 3, "medgemma_1_5": 3, "lingshu": 2, "radvlm": 3}  # the generative ones: their tiny configurations


def test_every_registered_model_at_full_size_declares_a_cascade_covering_its_weights():
    """The shipped architectures, built on the meta device (no memory, no files): every parameter in one stage."""
    assert sorted(FULL_SIZE_STAGES) == sorted(xbench_pl.registry.available("models"))
    for name, count in FULL_SIZE_STAGES.items():
        with torch.device("meta"):
            model = xbench_pl.create_model(name, random_init=True)
        assert len(cascade_stages(model)) == count, name  # cascade_stages raises where a parameter is left out


def test_a_module_without_its_own_init_gets_the_stated_normal():
    """A parameter that no module init covers (a class token, a temperature) is drawn from N(0, INIT_STD²)."""

    class Tokens(nn.Module):
        RANDOMIZATION_STAGES = (("all", ("token", "linear")),)

        def __init__(self):
            super().__init__()
            self.token = nn.Parameter(torch.full((4000,), 5.0))
            self.linear = nn.Linear(3, 3)

    copy = randomized_copy(Tokens(), 0, seed=7)
    torch.manual_seed(7)  # stage 0's seed: its names in declared order, the token's draw, then the Linear's own init
    token = torch.empty(4000).normal_(std=INIT_STD)
    linear = nn.Linear(3, 3)
    assert torch.equal(copy.token, token) and torch.equal(copy.linear.weight, linear.weight)
    assert torch.equal(copy.linear.bias, linear.bias)


def test_declarations_are_checked():
    assert cascade_stages(UniformBaseline()) == []  # nothing to randomize
    with pytest.raises(ValueError, match="declares no RANDOMIZATION_STAGES"):
        cascade_stages(LinearIntensityModel())

    class Partial(nn.Module):
        RANDOMIZATION_STAGES = (("head", ("head",)), ("absent", ("nothing_here",)))

        def __init__(self):
            super().__init__()
            self.head, self.body = nn.Linear(2, 2), nn.Linear(2, 2)

    with pytest.raises(ValueError, match=r"leave 2 parameters out \(first: body.weight, body.bias\)"):
        cascade_stages(Partial())
    Partial.RANDOMIZATION_STAGES = (("head", ("head", "body")), ("body", ("body.weight",)))
    with pytest.raises(ValueError, match="body.weight is in stages 'head' and 'body'"):
        cascade_stages(Partial())
    Partial.RANDOMIZATION_STAGES = (("blocks {}", ("head.*", "body")),)
    with pytest.raises(ValueError, match="either every name ends in"):
        cascade_stages(Partial())
    Partial.RANDOMIZATION_STAGES = (("all", ("head", "body")),)
    with pytest.raises(ValueError, match=r"upto must be in \[0, 0\]"):
        randomized_copy(Partial(), 1, seed=0)


# -- the done-check: an input-only map fails, a gradient map passes -----------------------------------------------
def chest_like(size: int, count: int = 4) -> torch.Tensor:
    """Images sharing a chest-like layout (two dark lungs in a bright body), each with its own bright blob and noise:
    maps of different images share structure, as real radiographs do."""
    generator = torch.Generator().manual_seed(0)
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    lungs = (((xx.abs() - 0.45) / 0.3) ** 2 + (yy / 0.7) ** 2 < 1).float()
    images = []
    for _ in range(count):
        cx, cy = (torch.rand(2, generator=generator) * 1.2 - 0.6).tolist()
        blob = torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 0.02)
        images.append(1 - 0.6 * lungs + 0.5 * blob + 0.1 * torch.randn(size, size, generator=generator))
    images = torch.stack(images)[:, None].expand(-1, 3, -1, -1)
    return (images - images.mean()) / images.std()


def on_grid(maps: torch.Tensor, grid: int = 32) -> torch.Tensor:
    """``[B, C, h, w]`` maps -> ``[B * C, grid, grid]``, bilinear, min-max normalised per map (float64)."""
    maps = F.interpolate(maps.float(), size=(grid, grid), mode="bilinear", align_corners=False).flatten(0, 1).double()
    flat = maps.flatten(1)
    low, high = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    return ((flat - low) / (high - low).clamp_min(1e-12)).view_as(maps)


def sobel_edges(model, images: torch.Tensor, classes: list[str]) -> torch.Tensor:
    """An 'explainer' that reads the input alone: the Sobel edge magnitude, the same map for every finding."""
    gray = images.mean(1, keepdim=True)
    kernel = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]]).view(1, 1, 3, 3)
    edges = (F.conv2d(gray, kernel, padding=1) ** 2 + F.conv2d(gray, kernel.transpose(-1, -2), padding=1) ** 2).sqrt()
    return edges.expand(-1, len(classes), -1, -1)


def grad_cam(model, images: torch.Tensor, classes: list[str]) -> torch.Tensor:
    return model.explained(images, classes).saliency


@pytest.mark.parametrize("explainer, passes", [(sobel_edges, False), (grad_cam, True)])
def test_an_input_only_map_fails_and_a_gradient_map_passes(build, explainer, passes):
    model = build("carzero", explainer="gradcam")
    images = chest_like(model.preprocess.size)
    trained = on_grid(explainer(model, images, CLASSES))
    randomized = on_grid(explainer(randomized_copy(model, len(cascade_stages(model)) - 1, seed=0), images, CLASSES))
    image_ids = [i for i in range(len(images)) for _ in CLASSES]
    findings = [c for _ in range(len(images)) for c in CLASSES]
    baseline = random_pair_baseline(trained, image_ids, findings, seed=0)
    similarity = float(ssim(trained, randomized).mean())
    assert 0.2 < baseline < 0.95  # the maps of different images share the layout, and differ
    assert passes_randomization(similarity, baseline) is passes
    if not passes:
        assert similarity == pytest.approx(1.0, abs=1e-12)  # the model's weights never reached the map
    assert passes_randomization(float("nan"), baseline) is None
