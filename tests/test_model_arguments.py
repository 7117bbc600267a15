"""One vocabulary of model arguments across families (old names as aliases with a note), the docs' table of
them, and ``random_init`` without any file (stand-in tokenizers, text configs, knowledge)."""

import inspect
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml

import kad_reference
from test_cli import in_process, warm_process

import xbench_pl
from xbench_pl.models.base import ZeroShotModel
from xbench_pl.models.stand_ins import LAYOUTS, stand_in_tokenizer
from xbench_pl.registry import RENAMED_ARGS, available, read_config

DOCS = Path(__file__).resolve().parents[1] / "docs" / "models.md"
#: what each model made up for its missing files with random_init and no checkpoint
STAND_INS = {"biomedclip": ["tokenizer"], "biovil": ["tokenizer"], "biovil_t": ["tokenizer"], "carzero": ["tokenizer"],
             "devide": ["tokenizer"], "kad": ["tokenizer"], "kad_224": ["tokenizer"], "kad_512": ["tokenizer"],
             "kad_1024": ["tokenizer"], "radzero": ["tokenizer"], "medklip": ["knowledge", "text encoder"],
             "mavl": ["knowledge", "text encoder"], "mavl_46": ["knowledge", "text encoder"],
             "reader": ["reader who marked nothing"], "maira2": ["tokenizer"], "medgemma": ["tokenizer"], "medgemma_1_5": ["tokenizer"], "lingshu": ["tokenizer"],
             "radvlm": ["tokenizer"]}


def model_arguments(cls: type) -> set[str]:
    """The init arguments of a model class above ``ZeroShotModel``'s, following ``**kwargs`` to its parents."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is ZeroShotModel or not issubclass(klass, ZeroShotModel):
            break
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return names


# -- random_init needs no file ----------------------------------------------------------------------
@pytest.mark.parametrize("name", available("models"))
def test_every_model_builds_with_random_init_and_no_file(name, tmp_path, monkeypatch):
    """Every registered model, full size (on the meta device: nothing allocated), from ``random_init`` alone."""
    monkeypatch.chdir(tmp_path)  # no file of the working directory either
    with warnings.catch_warnings(record=True) as caught, torch.device("meta"):
        warnings.simplefilter("always")
        model = xbench_pl.create_model(name, random_init=True)
    assert model.stand_ins == STAND_INS.get(name, [])
    said = [str(w.message) for w in caught if "RANDOM weights" in str(w.message)]
    if model.stand_ins:  # the one warning says the weights are random and what stands in for the files
        assert len(said) == 1 and f"stand-in {' and '.join(model.stand_ins)}" in said[0]


def test_files_are_still_required_without_random_init():
    with pytest.raises(ValueError, match="reader needs annotations=FILE"):
        xbench_pl.create_model("reader")


def test_stand_in_tokenizers_have_the_real_layout():
    for hub_id, layout in LAYOUTS.items():
        tokenizer = stand_in_tokenizer(f"hf/{hub_id}")
        assert len(tokenizer) == layout.size
        for role, (token, index) in layout.specials.items():
            assert getattr(tokenizer, role) == token and tokenizer.convert_tokens_to_ids(token) == index
        ids = tokenizer(["Pleural Effusion, left."])["input_ids"][0]
        assert ids[0] == layout.specials["cls_token"][1] and ids[-1] == layout.specials["sep_token"][1]
        assert layout.specials["unk_token"][1] not in ids  # any text tokenises (as letters)


def test_medklip_and_mavl_stand_in_knowledge_and_text_encoder():
    """The query book of a random_init MedKLIP / MAVL without files: entity names, Bio_ClinicalBERT's layout."""
    with torch.device("meta"):
        medklip = xbench_pl.create_model("medklip", random_init=True)
        mavl = xbench_pl.create_model("mavl", random_init=True)
        assert medklip.text_encoder.bert().embeddings.word_embeddings.num_embeddings == 28996  # Bio_ClinicalBERT's config
    texts, index = medklip.query_texts(["Pleural Effusion", "Lung Abscess"])  # no entity: appended
    assert len(texts) == 76 and texts[index[0]] == "effusion" and texts[-1] == "lung abscess"
    tokens = medklip.text_encoder.tokenize(texts)
    assert tokens["input_ids"].shape == (76, 64) and (tokens["input_ids"][:, 0] == 101).all()  # [CLS], no [SEP]
    texts, _ = mavl.query_texts(["Pleural Effusion"])
    assert len(texts) == 75 * 9 and texts[9 * mavl.base_entities.index("effusion") + 1] == "border of effusion"


def smoke_run(folder: Path):
    """The background job of the test below, in the warm process: the README's smoke command for a model that needed
    its text folder, on one demo image."""
    return warm_process("test", "--model", "biovil", "--model.random_init", "true", "--data", "demo", "--data.batch_size", "1",
                        "--trainer.limit_test_batches", "1", "--out", str(folder))


@pytest.mark.background(job=smoke_run)
def test_cli_smoke_run_needs_no_file(background):
    folder, result = background
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RANDOM weights (random_init=True, no checkpoint) and a stand-in tokenizer" in result.stderr
    assert json.loads((folder / "metrics.json").read_text())["random_weights"] is True


# -- one name per thing, old names as aliases --------------------------------------------------------
def test_no_model_takes_an_old_name():
    for name in available("models"):
        cls, defaults = read_config("models", name)
        assert not (model_arguments(cls) | set(defaults)) & set(RENAMED_ARGS), name


@pytest.fixture(scope="module")
def med_kebert(tmp_path_factory) -> str:
    return str(kad_reference.write_tokenizer(tmp_path_factory.mktemp("Med-KEBERT")))


def test_create_model_takes_old_and_new_names(med_kebert, capsys):
    with torch.device("meta"):
        new = xbench_pl.create_model("kad_224", random_init=True, text=med_kebert)
        assert "note:" not in capsys.readouterr().err
        old = xbench_pl.create_model("kad_224", random_init=True, tokenizer=med_kebert)
    assert capsys.readouterr().err.strip() == "note: tokenizer= is now text="
    assert len(old.tokenizer) == len(new.tokenizer) == len(kad_reference.vocabulary()) and not old.stand_ins
    with pytest.raises(ValueError, match="tokenizer= and text= name the same argument"):
        xbench_pl.create_model("kad_224", random_init=True, tokenizer=med_kebert, text=med_kebert)


def shown_model_args(result) -> dict:
    assert result.returncode == 0, result.stderr[-2000:]
    return yaml.safe_load(result.stdout)["model"]["init_args"]


def test_cli_takes_old_names_on_the_command_line_and_in_files(med_kebert, tmp_path):
    new = in_process("test", "--model", "kad", "--model.text", med_kebert, "--data", "demo", "--print_config")
    assert shown_model_args(new)["text"] == med_kebert and "note:" not in new.stderr
    old = in_process("test", "--model", "medklip", f"--model.text_encoder={med_kebert}", "--data", "demo", "--print_config")
    assert shown_model_args(old)["text"] == med_kebert
    assert "note: --model.text_encoder is now --model.text" in old.stderr.splitlines()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": {"class_path": "xbench_pl.models.kad.KAD", "init_args": {"tokenizer": med_kebert}}}))
    from_config = in_process("test", "--config", str(config), "--data", "demo", "--print_config")
    assert shown_model_args(from_config)["text"] == med_kebert
    assert "note: --config: model.init_args.tokenizer is now model.init_args.text" in " ".join(from_config.stderr.split())
    model_file = tmp_path / "carzero.yaml"
    model_file.write_text(yaml.safe_dump({"class_path": "xbench_pl.models.carzero.CARZero", "init_args": {"tokenizer": med_kebert}}))
    from_file = in_process("test", "--model", str(model_file), "--data", "demo", "--print_config")
    assert shown_model_args(from_file)["text"] == med_kebert
    assert f"note: {model_file}: init_args.tokenizer is now init_args.text" in " ".join(from_file.stderr.split())


# -- docs/models.md's table -------------------------------------------------------------------------
def documented_arguments() -> dict[str, set[str]]:
    """``{model: arguments}`` of the table in docs/models.md's "Arguments" section."""
    section = DOCS.read_text().split("## Arguments", 1)[1].split("\n## ", 1)[0]
    found: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            for model in re.findall(r"`([^`]+)`", cells[0]):
                found.setdefault(model, set()).update(re.findall(r"`([^`]+)`", cells[1]))
    return found


def test_docs_table_lists_exactly_the_arguments_the_code_takes():
    documented = documented_arguments()
    assert sorted(documented) == available("models")
    for name in available("models"):
        assert documented[name] == model_arguments(read_config("models", name)[0]), name
    section = DOCS.read_text().split("## Arguments", 1)[1]
    common = set(inspect.signature(ZeroShotModel.__init__).parameters) - {"self"}
    assert all(f"`{name}`" in section for name in common)
