"""Memory of ``score --boxes`` / ``score --maps``: what one metric update holds is bounded, whatever the
number of images or the size of their maps (issue 30: 3.4 GB on the 12-image demo, from one update of
every image's 512² box maps and a ``[B, C, C, h * w]`` product in ``map_similarity``)."""

import torch
from test_score_boxes import truth, write_csv  # noqa: F401  (truth: a fixture)
from torch.profiler import ProfilerActivity, profile

from xbench_pl.commands import main
from xbench_pl.metrics.functional import map_similarity
from xbench_pl.predictions import Replayer

#: map bytes (float32) one replayed update may hold: 16 MiB (the demo's 12 images of 8 box maps on the 512² grid are 96 MiB)
UPDATE_BYTES = 16 * 2**20


def test_map_similarity_allocates_no_product_of_all_pairs():
    saliency = torch.rand(4, 6, 64, 64, generator=torch.Generator().manual_seed(0))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        map_similarity(saliency)
    one_copy = saliency.numel() * 8  # the maps once, in float64
    assert max(event.cpu_memory_usage for event in prof.events()) <= one_copy  # (the pairwise product: C = 6 copies)


def test_score_boxes_feeds_the_metrics_a_bounded_share_of_maps(truth, tmp_path, monkeypatch):
    fed = []

    judge = Replayer.update_metrics

    def update_metrics(self, batch, output):
        fed.append(output.saliency.shape)
        return judge(self, batch, output)

    monkeypatch.setattr(Replayer, "update_metrics", update_metrics)
    boxes = write_csv(tmp_path / "boxes.csv", truth)
    assert main(["score", "--boxes", str(boxes), "--data", "demo", "--out", str(tmp_path / "out"), "--bootstrap", "0"]) == 0
    assert sum(shape[0] for shape in fed) == 12 and fed[0][-2:] == (512, 512)  # every image, maps on the eval grid
    assert max(shape.numel() * 4 for shape in fed) <= UPDATE_BYTES
