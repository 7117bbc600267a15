"""A weight-free model whose scores and maps depend on the pixels, for end-to-end tests."""

import torch
import torch.nn.functional as F

from xbench_pl.geometry import Preprocess
from xbench_pl.models.base import ZeroShotModel, ZeroShotOutput


class IntensityModel(ZeroShotModel):
    """Saliency = the image brightness on a 14 x 14 grid (shifted per class); score = a squashed mean brightness."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.preprocess = Preprocess(resize="crop", size=56)

    def zero_shot(self, images, classes):
        grid = F.adaptive_avg_pool2d(images[:, :1], 14)  # [B, 1, 14, 14]
        shifts = torch.arange(len(classes), device=images.device, dtype=images.dtype)
        saliency = grid + 0.01 * shifts.view(1, -1, 1, 1) * grid.roll(1, dims=-1)
        # in float64, rounded to float32 at the end: float32 reductions and vectorised exp round differently
        # with the thread count and the batch size (one process has 2 threads, each of 2 DDP processes 1),
        # and the DDP tests need outputs that are the same whatever the batch
        brightness = images.double().mean(dim=(1, 2, 3))
        scores = torch.sigmoid(brightness[:, None] * (1 + shifts.double()[None])).float()
        return ZeroShotOutput(scores=scores, saliency=saliency)


class RandomIntensityModel(IntensityModel):
    """``IntensityModel`` standing in for a model built with ``random_init`` and no checkpoint."""

    def __init__(self, random_init: bool = False, **kwargs):
        super().__init__(**kwargs)
        if random_init:
            self.warn_random_weights()


class LinearIntensityModel(IntensityModel):
    """``IntensityModel`` through a trainable 1 x 1 linear map (identity at start) applied to its maps and score logits:
    under autocast (``--trainer.precision bf16-mixed``/``16-mixed``) its scores and maps come out in bf16/fp16."""

    TRAINABLE = (r"^mix\.",)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.mix = torch.nn.Linear(1, 1)
        torch.nn.init.ones_(self.mix.weight)
        torch.nn.init.zeros_(self.mix.bias)

    def zero_shot(self, images, classes):
        output = super().zero_shot(images, classes)
        saliency = self.mix(output.saliency[..., None])[..., 0]
        scores = torch.sigmoid(self.mix(torch.logit(output.scores, eps=1e-6)[..., None])[..., 0])
        return ZeroShotOutput(scores=scores, saliency=saliency)
