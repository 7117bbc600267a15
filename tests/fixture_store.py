"""A model for the prediction-store tests: ``IntensityModel`` that can be stopped part-way.

With ``XBENCH_TEST_HANG_AFTER=N`` it computes N batches, then at the next one writes the file
``XBENCH_TEST_READY`` and waits to be killed (the test SIGKILLs it: a crash at a known point,
after the store's shards of those N batches were written). With ``XBENCH_TEST_LOG`` it appends
the image ids of each batch it computes (one line per image) there. Without either it is
``IntensityModel``, so the killed, the resumed and the uninterrupted runs share one config.
"""

import os
import time
from pathlib import Path

from fixture_models import IntensityModel


class StoppableIntensityModel(IntensityModel):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.batches = 0

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.batches += 1
        hang_after = os.environ.get("XBENCH_TEST_HANG_AFTER")
        if hang_after and self.batches > int(hang_after):
            Path(os.environ["XBENCH_TEST_READY"]).write_text(str(self.batches))
            while True:  # until SIGKILL
                time.sleep(0.2)
        if os.environ.get("XBENCH_TEST_LOG"):
            with open(os.environ["XBENCH_TEST_LOG"], "a") as log:
                log.writelines(f"{i}\n" for i, c in zip(batch.image_ids, batch.counted.tolist()) if c)
        return super().test_step(batch, batch_idx, dataloader_idx)
