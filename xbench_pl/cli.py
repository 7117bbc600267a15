"""``python -m xbench_pl test --model NAME --data NAME [--data.*] [--trainer.*] [--out DIR]``.

A LightningCLI: ``--model``/``--data`` take a registered name (resolved to its config file,
``xbench_pl.registry``), a class path, or a YAML file; ``--model.ARG``/``--data.ARG`` override
init args; ``--print_config`` and ``--config FILE`` work as usual. ``test`` writes
``OUT/metrics.json`` and ``OUT/metrics.md`` and prints the per-dataset table.
``python -m xbench_pl describe --data NAME ...`` summarises a dataset (``xbench_pl.describe``).
"""

from __future__ import annotations

import sys

import yaml
from lightning.pytorch.cli import LightningCLI

from xbench_pl.data.base import XBenchDataModule
from xbench_pl.models.base import ZeroShotModel
from xbench_pl.registry import config_path
from xbench_pl.report import build_report, markdown_table, write_report

TRAINER_DEFAULTS = {"logger": False, "enable_checkpointing": False, "devices": 1}


def resolve_names(argv: list[str]) -> list[str]:
    """Replace ``--model NAME`` / ``--data NAME`` (and ``=NAME``) by the path of NAME's config file.

    A value with a dot or slash is a class path or a file and passes through; any other is a
    registered name, and an unknown one raises ``KeyError`` listing the available names.
    """
    kinds = {"--model": "models", "--data": "data"}
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        if flag in kinds and not eq and i + 1 < len(argv):
            value, i = argv[i + 1], i + 1
        if flag in kinds and value and not value.startswith("{"):
            out += [flag, value if "." in value or "/" in value else str(config_path(kinds[flag], value))]
        else:
            out.append(arg)
        i += 1
    return out


def datamodule_problems(datamodule) -> dict[str, list]:
    return {dm.name: list(dm.problems) for dm in datamodule.datamodules}


class XBenchCLI(LightningCLI):
    def __init__(self, *args, model_name: str | None = None, **kwargs):
        self.model_name = model_name  # the name the user asked for, as reports should show it
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {"test": {"model", "dataloaders", "datamodule"}}  # zero-shot benchmarking: nothing to fit

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--out", default="results", help="folder for metrics.json and metrics.md")

    def after_test(self) -> None:
        if not self.trainer.is_global_zero:
            return
        settings = yaml.safe_load(self.parser.dump(self.config, skip_none=False, skip_validation=True))[self.subcommand]
        report = build_report(
            model=self.model_name or settings["model"]["class_path"],
            results=self.model.results,
            problems=datamodule_problems(self.datamodule),
            config={"model": settings["model"], "data": settings["data"], "precision": settings["trainer"].get("precision")},
        )
        out = write_report(report, settings["out"])
        print(markdown_table({n: d["mean"] for n, d in report["datasets"].items()}, "dataset"))
        print(f"\nwrote {out / 'metrics.json'} and {out / 'metrics.md'}")


def take_option(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """The value of ``flag VALUE`` (or ``flag=VALUE``) in ``argv``, and ``argv`` without it."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2 :]
        if arg.startswith(flag + "="):
            return arg.partition("=")[2], argv[:i] + argv[i + 1 :]
    return None, argv


def main(argv: list[str] | None = None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if from_command_line else argv)
    if argv and argv[0] == "describe":
        from xbench_pl import describe

        return describe.main(argv[1:])
    try:
        resolved = resolve_names(argv)
    except KeyError as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 2
    if from_command_line:  # DDP re-launches this command line in every rank; give them the resolved one
        sys.argv[1:] = resolved
    XBenchCLI(
        ZeroShotModel,
        XBenchDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=None if from_command_line else resolved,
        model_name=take_option(argv, "--model")[0],
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_callback=None,
        parser_kwargs={"prog": "python -m xbench_pl", "description": "Zero-shot recognition and grounding benchmark "
                       "of chest X-ray VLMs (xbench_pl). Also: python -m xbench_pl describe --data NAME ..."},
        auto_configure_optimizers=False,
    )
    return 0
