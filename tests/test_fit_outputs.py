"""``fit --out`` over an earlier fit: refused in one line unless ``--overwrite``, as ``test`` over an earlier test; a fit
that did not finish (its checkpoints, no ``fit.json``: resumed with ``--ckpt_path``) is no earlier run."""

import json

from test_fit import TINY_CLIP

from xbench_pl.commands import main


def test_fit_over_an_earlier_fit_is_refused_unless_overwrite(tmp_path, capsys):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "fit.json").write_text('{"earlier": true}\n')
    unbuildable = ["--model", "open_clip", "--model.checkpoint", str(tmp_path / "absent.pt"), "--data", "demo"]
    line = (f"error: --out {earlier}: holds an earlier run (its fit.json); choose another --out, or add --overwrite to "
            "replace its files\n")
    assert main(["fit", *unbuildable, "--out", str(earlier)]) == 2
    assert capsys.readouterr().err == line
    assert (earlier / "fit.json").read_text() == '{"earlier": true}\n'

    interrupted = tmp_path / "interrupted"  # checkpoints, no fit.json: not refused (the model then fails on its file)
    (interrupted / "checkpoints").mkdir(parents=True)
    (interrupted / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert main(["fit", *unbuildable, "--out", str(interrupted)]) == 2
    assert "earlier run" not in capsys.readouterr().err

    architecture = tmp_path / "tiny_clip.json"
    architecture.write_text(json.dumps(TINY_CLIP))
    tiny = ["--model", "open_clip", "--model.architecture", str(architecture), "--model.random_init", "true",
            "--model.bootstrap", "0", "--data", "demo", "--data.batch_size", "4", "--trainer.accelerator", "cpu",
            "--trainer.enable_progress_bar", "false", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "0"]
    assert main(["fit", *tiny, "--out", str(earlier), "--overwrite"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert json.loads((earlier / "fit.json").read_text())["model"] == "open_clip"
    assert f"wrote {earlier / 'fit.json'} and the split {earlier / 'split.csv'}, replacing the earlier run's (--overwrite)" in out
