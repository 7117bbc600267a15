"""Class activation maps through pytorch-grad-cam (PyPI ``grad-cam``), batched over findings.

For finding c of an image the map is the library's own per-layer CAM: its ``get_cam_image`` on the
target layer's activations and the gradients of the model's target ``y[:, c]`` (its logits where it
exposes them, else its scores), followed by the ReLU its ``compute_cam_per_layer`` applies, on the
layer's own grid, before the library's min-max scaling and resize (the benchmark warps and
normalises every map itself).

What the library would do per finding and per image, this does once per batch:

* one forward with a hook on the target layer, whose output becomes a leaf of the graph: the tower
  below it runs without autograd (every parameter is frozen meanwhile), and nothing is kept once
  the maps are made;
* one backward per finding through that small graph (the layer on): the gradient of ``sum_b y[b, c]`` is
  each image's own, since images do not interact (eval mode); the forward's scores are the run's (the native
  forward's operations, with autograd from the layer on), so the model runs once per batch;
* EigenCAM: the library's ``get_2d_projection`` (each image's centred activations ``[h*w, K]`` projected on their
  first right-singular vector) with the reduced SVD, ``first_component_projection``: the library's full one builds a
  ``K x K`` basis (1,024-2,048 square on a ResNet) to use its first row, which LAPACK computes the same, bit for bit
  (tests: every family, and the released towers' layer shapes);
* ScoreCAM: the library's ``get_cam_weights`` on chunks of channels, with a target that records each
  masked forward's scores of every finding; the softmax over all channels and the weighted sum are
  its own two lines, redone per finding. One pass over the masked inputs serves all findings, and
  memory stays bounded by the chunk.
"""

from __future__ import annotations

from contextlib import contextmanager
from importlib.metadata import version
from typing import Iterator

import numpy as np
import torch
from pytorch_grad_cam import EigenCAM, GradCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, ScoreCAM, XGradCAM, score_cam
from torch import nn

from xbench_pl.explainers.towers import token_grid

CAM_METHODS = {"gradcam": GradCAM, "gradcam++": GradCAMPlusPlus, "hirescam": HiResCAM, "layercam": LayerCAM,
               "xgradcam": XGradCAM, "eigencam": EigenCAM, "scorecam": ScoreCAM}
#: channels whose masked inputs ScoreCAM scores per call (bounds the masked copies held at once)
SCORECAM_CHANNELS = 64
LIBRARY = "pytorch-grad-cam"


def library_version() -> str:
    return version("grad-cam")


def first_component_projection(activation_batch: np.ndarray) -> np.ndarray:
    """``pytorch_grad_cam.utils.svd_on_activations.get_2d_projection`` ``[B, h, w]`` of ``[B, K, h, w]``, its SVD reduced
    (``full_matrices=False``): the first right-singular vector is all it reads."""
    activation_batch = activation_batch.copy()  # C-ordered, as the library's: the layout decides the matmul's bits
    activation_batch[np.isnan(activation_batch)] = 0
    projections = []
    for activations in activation_batch:
        reshaped = activations.reshape(activations.shape[0], -1).transpose()
        reshaped = reshaped - reshaped.mean(axis=0)  # centred, as the library does
        first = np.linalg.svd(reshaped, full_matrices=False)[2][0]
        projections.append((reshaped @ first).reshape(activations.shape[1:]))
    return np.float32(projections)


class TargetModel(nn.Module):
    """The model as pytorch-grad-cam wants one: images -> the explained targets ``[B, C]``."""

    def __init__(self, model: nn.Module, classes: list[str]):
        super().__init__()
        self.model, self.classes = model, classes

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.explainer_forward(images, self.classes, grad=torch.is_grad_enabled())[1]


class RecordingTarget:
    """A pytorch-grad-cam target that keeps each output row (every finding) it is shown."""

    def __init__(self):
        self.rows: list[torch.Tensor] = []

    def __call__(self, output: torch.Tensor) -> torch.Tensor:
        self.rows.append(output.detach().float().cpu())
        return output[0]


@contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[None]:
    """No parameter requires a gradient while open: autograd records only from the explained layer on."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for parameter, _ in flags:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter, flag in flags:
            parameter.requires_grad_(flag)


class _NoProgress:
    """Stands for the ``tqdm`` module in ``pytorch_grad_cam.score_cam``, whose loop draws a bar per image."""

    @staticmethod
    def tqdm(iterable, *args, **kwargs):
        return iterable


@contextmanager
def quiet_progress() -> Iterator[None]:
    """ScoreCAM's loop without its progress bars (they would interleave with the benchmark's own lines)."""
    module = score_cam.tqdm
    score_cam.tqdm = _NoProgress
    try:
        yield
    finally:
        score_cam.tqdm = module


class CAMExplainer:
    """``name`` (a key of ``CAM_METHODS``) on the module at ``layer`` of the model."""

    def __init__(self, name: str, layer: str, grid: tuple[int, int] | None):
        self.name, self.layer, self.grid = name, layer, grid
        self.method = CAM_METHODS[name]
        self.uses_gradients = name not in ("eigencam", "scorecam")

    def activations(self, model: nn.Module, images: torch.Tensor, classes: list[str]) -> tuple[torch.Tensor, object, torch.Tensor]:
        """The target layer's output ``[B, ...]`` (a leaf of the graph when gradients are needed), the model's output
        (``ZeroShotOutput``) and the targets ``[B, C]``."""
        captured = []

        def keep(module, inputs, output):
            if not isinstance(output, torch.Tensor):
                raise ValueError(f"explainer layer {self.layer!r} returns {type(output).__name__}, not a tensor")
            captured.append(output.detach().requires_grad_(self.uses_gradients))
            return captured[-1]

        handle = model.get_submodule(self.layer).register_forward_hook(keep)
        try:
            with frozen_parameters(model):
                output, targets = model.explainer_forward(images, classes, grad=self.uses_gradients)
        finally:
            handle.remove()
        if len(captured) != 1:
            raise ValueError(f"explainer layer {self.layer!r} ran {len(captured)} times in one forward: choose a layer of "
                             "the image tower, which runs once")
        return captured[0], output, targets

    def gradients(self, activation: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
        """Per finding, the gradient of its target summed over the batch with respect to the layer's output ``[B, ...]``:
        each image's own, since images do not interact (eval mode). One backward per finding through the graph past
        the layer (kept until the last): on CPU this loop ran at 0.85-1.7x the speed of one ``is_grads_batched`` backward
        over all findings (bench_explainers' floor), whose vmapped kernels also move CLIP's gradients by round-off."""
        count = targets.shape[1]
        gradients = []
        for finding in range(count):
            gradient, = torch.autograd.grad(targets[:, finding].sum(), activation, retain_graph=finding < count - 1,
                                            allow_unused=True)
            if gradient is None:
                raise ValueError(f"the model's targets do not depend on explainer layer {self.layer!r}: choose a layer they read")
            gradients.append(gradient)
        return gradients

    def as_map(self, tensor: torch.Tensor) -> np.ndarray:
        """The layer's output (or its gradient) as the library takes it: float32 ``[B, K, h, w]`` on the host."""
        return token_grid(tensor, self.grid, self.layer).float().cpu().numpy()

    def saliency(self, model: nn.Module, images: torch.Tensor, classes: list[str]) -> tuple[torch.Tensor, object]:
        """``[B, C, h, w]`` on the layer's grid, and the model's output of the same forward."""
        activation, output, targets = self.activations(model, images, classes)
        layer = model.get_submodule(self.layer)
        cam = self.method(TargetModel(model, classes), [layer])
        cam.activations_and_grads.release()  # its hooks: this class takes activations and gradients itself
        features = self.as_map(activation.detach())
        if self.name == "eigencam":  # no target: one map per image, the same for every finding
            maps = [first_component_projection(features)] * len(classes)
        elif self.name == "scorecam":
            maps = self.scorecam(cam, images, layer, features, len(classes))
        else:
            gradients = self.gradients(activation, targets)
            maps = [cam.get_cam_image(images, layer, None, features, self.as_map(g), False) for g in gradients]
        return torch.from_numpy(np.maximum(np.stack(maps, axis=1), 0)).to(images.device), output

    @staticmethod
    def scorecam(cam: ScoreCAM, images: torch.Tensor, layer: nn.Module, features: np.ndarray, count: int) -> list[np.ndarray]:
        """Per finding, ScoreCAM's ``[B, h, w]``: channel weights = softmax over channels of the finding's
        score on the input masked by each upsampled, min-max scaled channel (the library's masking and forwards)."""
        scores = np.empty((*features.shape[:2], count), dtype=np.float32)
        with torch.no_grad(), quiet_progress():
            for image in range(features.shape[0]):
                for start in range(0, features.shape[1], SCORECAM_CHANNELS):
                    chunk = features[image:image + 1, start:start + SCORECAM_CHANNELS]
                    recorder = RecordingTarget()
                    cam.batch_size = SCORECAM_CHANNELS  # one forward per chunk
                    cam.get_cam_weights(images[image:image + 1], layer, [recorder], chunk, None)
                    scores[image, start:start + chunk.shape[1]] = torch.stack(recorder.rows).numpy()
        maps = []
        for finding in range(count):
            weights = torch.nn.Softmax(dim=-1)(torch.from_numpy(scores[..., finding])).numpy()
            maps.append((weights[:, :, None, None] * features).sum(axis=1))
        return maps
