"""BioViL / BioViL-T: our layout against the authors' state dicts (meta-device manifests of hi-ml-multimodal
0.2.2), our scores and maps against their inference engines on seeded checkpoints, the smoothing against
scipy, the transform against torchvision, bad files, sizes, random_init and the CLI."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import biovil_reference as ref  # noqa: E402
from test_cli import in_process  # noqa: E402
from xbench_pl.geometry import Preprocess  # noqa: E402
from xbench_pl.models.biovil import BioViL, BioViLImage, checkpoint_filter_fn, rename_image_key, smooth  # noqa: E402
from xbench_pl.models.checkpoints import CheckpointError  # noqa: E402
from xbench_pl.models.layers.cxr_bert import CXRBert  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "xbench_pl" / "models" / "configs"
TEMPORAL = {"biovil": None, "biovil_t": 256}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The seeded image checkpoints of both variants and the tiny text folder (with and without weights)."""
    root = tmp_path_factory.mktemp("biovil")
    out = {variant: ref.write_image_checkpoint(root / ref.IMAGE_WEIGHTS[variant], variant) for variant in ref.VARIANTS}
    out["text"] = ref.write_text_folder(root / "text")
    out["text_config_only"] = ref.write_text_folder(root / "text_config_only", weights=False)
    return out


@pytest.fixture(scope="module")
def reference():
    return torch.load(ref.DATA / "biovil_reference.pt", weights_only=True)


@pytest.fixture(scope="module")
def models(files):
    return {variant: BioViL(variant, checkpoint=str(files[variant]), text=str(files["text"])) for variant in ref.VARIANTS}


def meta_tensors(entry: dict) -> dict[str, torch.Tensor]:
    return {key: torch.empty(shape, dtype=getattr(torch, dtype), device="meta") for key, (shape, dtype) in entry["keys"].items()}


# -- layout ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ref.VARIANTS)
def test_image_layout_is_the_authors(variant):
    """Every key of their full-size ImageModel maps onto ours with its shape, or is one they never use."""
    entry = ref.manifest()["image"][variant]
    with torch.device("meta"):
        ours = BioViLImage(joint=ref.JOINT, temporal_width=TEMPORAL[variant])
    mapped = checkpoint_filter_fn(meta_tensors(entry), ours, "manifest")
    expected = ours.state_dict()
    assert {k: tuple(v.shape) for k, v in mapped.items() if k in expected} == {k: tuple(v.shape) for k, v in expected.items()}
    ignored = {k for k in mapped if k not in expected}
    assert all(any(re.search(p, k) for p in BioViL.IGNORE_UNEXPECTED_IMAGE) for k in ignored)
    # what we leave out is exactly what gets no gradient through their single-image forward (manifest "unused")
    assert ignored == {rename_image_key(k) for k in entry["unused"]}
    assert sum(p.numel() for p in ours.parameters()) + sum(mapped[k].numel() for k in ignored) == entry["parameters"]


def test_text_layout_is_the_authors():
    """Their full-size CXRBertModel (BERT-base, vocabulary 30522, projection 128) minus its MLM head is ours."""
    entry = ref.manifest()["text"]["full"]
    assert entry["config"] == {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                               "intermediate_size": 3072, "max_position_embeddings": 512, "projection_size": 128}
    with torch.device("meta"):
        ours = CXRBert(**entry["config"])
    theirs = {k: tuple(shape) for k, (shape, _) in entry["keys"].items() if not k.startswith("cls.predictions.")}
    assert theirs == {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert all(k.startswith("cls.predictions.") for k in entry["keys"] if k not in theirs)


# -- equal to the authors' code --------------------------------------------------------------------
@pytest.mark.parametrize("variant", ref.VARIANTS)
def test_scores_and_maps_equal_the_authors(models, reference, variant):
    model = models[variant]
    assert reference["classes"] == list(ref.CLASSES)
    tokens = model.tokenize(reference["prompts"])
    assert torch.equal(tokens["input_ids"], reference["input_ids"])  # CXR-BERT-layout ids: [CLS] = 2, [SEP] = 3
    text = F.normalize(model.encode_text(reference["prompts"]), dim=-1)
    assert (text - reference["text_embeddings"]).abs().max() <= 1e-6
    images = ref.reference_images()
    out = model.zero_shot(images, list(ref.CLASSES))
    theirs = reference[variant]
    with torch.no_grad():
        image = F.normalize(model.visual(images).mean(dim=(2, 3)), dim=-1)  # their projected_global_embedding, normalised
    assert (image - theirs["global_embeddings"]).abs().max() <= 1e-6
    assert out.saliency.shape == theirs["maps"].shape == (2, 4, 6, 6)
    assert (out.scores - theirs["scores"]).abs().max() <= 1e-5
    assert (out.saliency - theirs["maps"]).abs().max() <= 1e-6
    # the scores are their cosines' pair softmax; the pair is not degenerate
    assert (theirs["similarity"][..., 0] - theirs["similarity"][..., 1]).abs().max() > 1e-3


@pytest.mark.parametrize("size", [1, 4, 6, 14, 15, 20])
def test_smoothing_is_scipys_gaussian_filter(size):
    ndimage = pytest.importorskip("scipy.ndimage")
    maps = torch.randn(3, size, size + 1, generator=torch.Generator().manual_seed(size))
    ours = smooth(maps, 1.5, 4.0)
    theirs = torch.stack([torch.from_numpy(ndimage.gaussian_filter(m.numpy(), sigma=(1.5, 1.5), order=0)) for m in maps])
    assert (ours - theirs).abs().max() <= 1e-6
    # torch's "reflect" (scipy's "mirror") gives another border: the mode matters
    if size >= 6:
        mirror = torch.stack([torch.from_numpy(ndimage.gaussian_filter(m.numpy(), sigma=1.5, mode="mirror")) for m in maps])
        assert (ours - mirror).abs().max() > 1e-3


@pytest.mark.parametrize("variant,crop", [("biovil", 480), ("biovil_t", 448)])
def test_transform_is_resize_512_and_centre_crop(variant, crop):
    torchvision = pytest.importorskip("torchvision.transforms")
    from PIL import Image

    config = json.loads((CONFIGS / f"{variant}.json").read_text())["preprocess"]
    preprocess = Preprocess(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})
    grey = (ref.reference_images(seed=3, batch=1, size=700)[0, 0, :, 100:690] * 255).round().to(torch.uint8)  # 700 x 590
    theirs = torchvision.Compose([torchvision.Resize(512), torchvision.CenterCrop(crop), torchvision.ToTensor()])(
        Image.fromarray(grey.numpy()))
    ours, affine = preprocess(grey.numpy().astype(np.float32) / 255)
    assert ours.shape == (3, crop, crop) and torch.equal(ours[0], ours[2])
    assert (ours[0] - theirs[0]).abs().max() <= 1.5 / 255  # PIL resizes in uint8, we in float
    scale = 512 / 590
    assert affine.tolist() == pytest.approx([scale, int(512 * 700 / 590) / 700, -round((512 - crop) / 2),
                                             -round((int(512 * 700 / 590) - crop) / 2)])


# -- behaviour, files, sizes -------------------------------------------------------------------------
def test_free_text_classes_and_cache(files):
    model = BioViL("biovil", random_init=True, text=str(files["text_config_only"]))
    out = model.zero_shot(torch.rand(1, 3, 64, 64), ["Pneumothorax", "small left apical pneumothorax"])
    assert out.scores.shape == (1, 2) and out.saliency.shape == (1, 2, 2, 2)
    assert ((out.scores > 0) & (out.scores < 1)).all() and not torch.allclose(out.saliency[:, 0], out.saliency[:, 1])
    assert len(model.text_cache) == 1
    model.load_state_dict(model.state_dict())
    assert not len(model.text_cache)
    with pytest.raises(ValueError, match=r"special token"):
        model.zero_shot(torch.rand(1, 3, 64, 64), ["effusion [SEP] pneumothorax"])


def test_prompts_are_configurable(files):
    model = BioViL("biovil", random_init=True, text=str(files["text_config_only"]), positive=["{}", "there is {}"],
                   negative="no {finding}")
    assert model.prompts.texts(["Edema"]) == ["Edema", "there is Edema", "no Edema"]
    with pytest.raises(ValueError, match="negative"):
        BioViL("biovil", random_init=True, text=str(files["text_config_only"]), negative=[])


def test_random_init_is_deterministic_and_flagged(files):
    a, b = (BioViL("biovil_t", random_init=True, text=str(files["text_config_only"])) for _ in range(2))
    assert a.random_weights and b.random_weights
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_refuses_other_sizes(files):
    with pytest.raises(ValueError, match=r"image_size=224.*480 px only"):
        BioViL("biovil", random_init=True, text=str(files["text_config_only"]), image_size=224)
    assert BioViL("biovil_t", random_init=True, text=str(files["text_config_only"]), image_size=448).preprocess.size == 448


def test_wrong_files_are_named(files, tmp_path):
    text = str(files["text"])
    with pytest.raises(CheckpointError, match=r"biovil_t_image.*BioViL-T image state dict.*--model biovil_t"):
        BioViL("biovil", checkpoint=str(files["biovil_t"]), text=text)
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin is not a BioViL image state dict"):
        BioViL("biovil", checkpoint=str(files["text"] / "pytorch_model.bin"), text=text)
    with pytest.raises(FileNotFoundError, match=r"needs a local copy of the hub folder microsoft/BiomedVLP-BioViL-T"):
        BioViL("biovil_t", checkpoint=str(files["biovil_t"]))  # with weights, the text folder too (random_init: a stand-in)
    with pytest.raises(FileNotFoundError, match=r"holds no weights"):
        BioViL("biovil", checkpoint=str(files["biovil"]), text=str(files["text_config_only"]))
    with pytest.raises(FileNotFoundError, match=r"checkpoint file not found"):
        BioViL("biovil", checkpoint=str(tmp_path / "missing.pt"), text=text)


def test_gradcam_explains_the_resnet(files):
    model = BioViL("biovil", random_init=True, text=str(files["text_config_only"]), explainer="gradcam")
    out = model.explained(torch.rand(2, 3, 96, 96), ["Edema", "Pneumothorax"])
    assert model.explainer_info["target_layer"] == "visual.trunk.layer4"
    assert out.saliency.shape[:2] == (2, 2) and torch.isfinite(out.saliency).all()


def test_cli_random_init_on_the_demo(files, tmp_path):
    architecture = json.loads((CONFIGS / "biovil.json").read_text())
    architecture["preprocess"] = {**architecture["preprocess"], "canvas": 72, "size": 64}  # a fast smoke run
    small = tmp_path / "biovil-64.json"
    small.write_text(json.dumps(architecture))
    result = in_process("test", "--model", "biovil", "--model.random_init", "true", "--model.text", str(files["text_config_only"]),
                        "--model.architecture", str(small), "--data", "demo", "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert report["random_weights"] is True
    assert report["config"]["model"]["class_path"] == "xbench_pl.models.biovil.BioViL"
    mean = report["datasets"]["demo"]["mean"]
    assert 0.0 <= mean["auroc"] <= 1.0 and 0.0 <= mean["pointing_game"] <= 1.0
    assert "RANDOM weights" in result.stdout + result.stderr


def test_cli_needs_the_text_folder_with_a_checkpoint(tmp_path):
    (tmp_path / "image.pt").write_bytes(b"")  # weights given: the text folder is too (random_init without both: stand-ins)
    result = in_process("test", "--model", "biovil", "--model.checkpoint", str(tmp_path / "image.pt"), "--data", "demo",
                        "--out", str(tmp_path))
    assert result.returncode != 0 and "microsoft/BiomedVLP-CXR-BERT-specialized" in result.stderr
