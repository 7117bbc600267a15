"""Models for the trust tests: one whose map is computed from the input alone (the Sobel edges of the image, whatever
the weights), and a batch-independent one with its cascade declared."""

import torch
import torch.nn.functional as F

from fixture_models import LinearIntensityModel
from xbench_pl.models.base import ZeroShotOutput
from xbench_pl.models.open_clip_model import OpenCLIPModel

SOBEL = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])


def edges(images: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """``[B, 1, h, w]``: the Sobel gradient magnitude of the images' mean channel, averaged onto ``grid``."""
    gray = images.float().mean(1, keepdim=True)
    kernel = torch.stack([SOBEL, SOBEL.T])[:, None].to(gray)
    gradient = F.conv2d(F.pad(gray, (1, 1, 1, 1), mode="replicate"), kernel)
    return F.adaptive_avg_pool2d(gradient.norm(dim=1, keepdim=True), grid)


class EdgeExplainedCLIP(OpenCLIPModel):
    """CLIP whose explainer is an edge detector: ``explained`` keeps the native scores and replaces every finding's map
    by the image's edges on the native grid (a map that cannot follow the weights)."""

    def explained(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        output = self.zero_shot(images, classes)
        saliency = edges(images, tuple(output.saliency.shape[-2:])).expand_as(output.saliency).contiguous()
        return ZeroShotOutput(scores=output.scores, saliency=saliency, logits=output.logits)


class TrustedLinearIntensityModel(LinearIntensityModel):
    """``LinearIntensityModel`` with its cascade declared (its one linear map), for the trust runs: its outputs do not
    depend on the batch, so 1 and 2 DDP processes must agree byte for byte."""

    RANDOMIZATION_STAGES = (("mix", ("mix",)),)
