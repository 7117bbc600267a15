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


class OracleBoxModel(IntensityModel):
    """States each finding's ground-truth boxes (read from the dataset's records, mapped into the model input through the
    batch's affine) and one box for each absent finding (``absent_box``: the input's top-left quarter, or none), with a
    map that is 1 inside its stated boxes (``mirrored_map``: inside their mirror images, left for right): the stated-box
    metrics' end-to-end yardstick."""

    STATES_BOXES = True

    def __init__(self, absent_box: bool = False, mirrored_map: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.absent_box, self.mirrored_map = absent_box, mirrored_map  # mirrored_map: the map looks at the mirror image
        self.preprocess = Preprocess(resize="crop", size=256)  # half the demo's side: the affine is not the identity

    def batch_output(self, batch):
        from xbench_pl.data.regions import region_bounds
        from xbench_pl.judging import StatedBoxes

        output = self.zero_shot(batch.images, batch.classes)
        dataset, size = self.region_dataset(batch), batch.images.shape[-1]
        boxes, texts, saliency = [], [], torch.zeros(len(batch.image_ids), len(batch.classes), size, size)
        for b in range(len(batch.image_ids)):
            height, width = batch.original_size[b].tolist()
            sx, sy, tx, ty = batch.affine[b].double().tolist()
            record = dataset.records[int(batch.index[b])]
            row = []
            for c, finding in enumerate(batch.classes):
                bounds = [r for r in (region_bounds(x, height, width) for x in record.regions.get(finding, [])) if r is not None]
                stated = [(x0 * sx + tx, y0 * sy + ty, x1 * sx + tx, y1 * sy + ty, 1.0) for x0, y0, x1, y1 in bounds]
                if not bounds and self.absent_box:
                    stated = [(0.0, 0.0, size / 2, size / 2, 1.0)]
                for x0, y0, x1, y1, _ in stated:  # the input pixels whose centre is inside
                    if self.mirrored_map:
                        x0, x1 = size - x1, size - x0
                    saliency[b, c, round(y0):round(y1), round(x0):round(x1)] = 1.0
                row.append(torch.tensor(stated, dtype=torch.float64).reshape(-1, 5))
            boxes.append(row)
            texts.append([f"{len(r)} boxes" for r in row])
        stated = StatedBoxes(boxes, texts, torch.zeros(len(batch.image_ids), len(batch.classes), dtype=torch.bool))
        return ZeroShotOutput(scores=output.scores, saliency=saliency, stated=stated)
