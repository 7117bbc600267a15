"""``--model.image_size`` beyond open_clip: a model released at several input sizes switches to that
size's variant; any other size, and any size for a fixed-size model, is refused before anything loads."""

import pytest

import xbench_pl
from test_cli import in_process
from xbench_pl.models.local_files import sized_architecture


def test_sized_architecture():
    sizes = {224: "kad-224", 512: "kad-512"}
    assert sized_architecture("kad-512", None, sizes, "KAD") == "kad-512"
    assert sized_architecture("kad-512", 224, sizes, "KAD") == "kad-224"
    with pytest.raises(ValueError, match=r"KAD cannot run at image_size=300: it exists at \[224, 512\] px only "
                                         r"\(224 px: architecture 'kad-224', 512 px: architecture 'kad-512'"):
        sized_architecture("kad-512", 300, sizes, "KAD")


@pytest.mark.parametrize("name, model", [("kad", "KAD"), ("devide", "DeViDe"), ("medklip", "MedKLIP"), ("mavl", "MAVL"),
                                         ("carzero", "CARZero")])
def test_other_sizes_are_refused_before_any_file_is_needed(name, model):
    with pytest.raises(ValueError, match=f"^{model} cannot run at image_size=336"):
        xbench_pl.create_model(name, image_size=336)


def test_kad_takes_the_variant_of_the_size(tmp_path):
    from kad_reference import write_tokenizer

    model = xbench_pl.create_model("kad", image_size=224, random_init=True, text=str(write_tokenizer(tmp_path / "tok")))
    assert model.architecture == "kad-224" and model.preprocess.size == 224


def test_cli_refusal_is_one_line(tmp_path):
    result = in_process("test", "--model", "medklip", "--model.image_size", "448", "--data", "demo", "--out", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --model.image_size: MedKLIP cannot run at image_size=448: it exists at [224] px only")
