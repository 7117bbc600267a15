"""``test`` and ``fit``: the Lightning Trainer verbs, through one ``LightningCLI`` (``XBenchCLI``).

``test --model NAME --data NAME [--data.*] [--trainer.*] [--out DIR]``: ``--model``/``--data``
take a registered name (resolved to its config file, ``xbench_pl.registry``), a class path, or
a YAML file; ``--model.ARG``/``--data.ARG`` override init args; ``--print_config`` and
``--config FILE`` work as usual. ``test`` writes ``OUT/metrics.json`` and ``OUT/metrics.md``
and prints the per-dataset table. ``fit`` (same options, plus ``--data.val_fraction``,
``--data.split_seed``, ``--data.fit_split`` and ``--model.trainable``/``lr``/``weight_decay``)
fine-tunes on the dataset's training split, validates every epoch with the benchmark's metrics,
and writes ``OUT/checkpoints/last.ckpt`` (the trained tensors and a fingerprint of the base weights:
``test --ckpt_path`` with the same ``--model`` loads it), ``OUT/split.csv`` and ``OUT/fit.json``.

Before any model or data is built, the Trainer's hardware options are checked (a GPU that is not there, bad
``--trainer.devices``, ``strategy`` or ``precision``), every folder the run writes is checked (``xbench_pl.outputs``;
a ``WandbLogger`` writes under ``--out``, or ``WANDB_DIR`` when set) and a ``--ckpt_path`` is read:
a damaged file, or a checkpoint that is not for ``--model``, ends the command with one line. ``test`` and ``fit``
refuse an ``--out`` that holds an earlier run of theirs (its ``metrics.json``, ``fit.json``) unless ``--overwrite``
is given. ``fit`` trains ``FIT_DEFAULT_EPOCHS`` epoch where no ``--trainer.max_epochs`` (nor ``max_steps``,
``max_time``) is given, and says so.

Ctrl-C (SIGINT) during a run ends it with one line (``Interrupted``; exit status 130): how many images the prediction
store holds safe and the command that continues with ``--resume``; for ``fit``, the last checkpoint and the command
that resumes from it.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Literal, get_args

import yaml
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from xbench_pl.commands.arguments import (FIT_DEFAULT_EPOCHS, FIT_TRAINER_DEFAULTS, LINKED_OPTIONS, NAMES_HELP, PROG,
                                         RUN_OPTIONS, SEED_DEFAULT, SUMMARIES, TRAINER_COMMANDS, TRAINER_DEFAULTS,
                                         VERB_DEFAULTS, VERB_SKIPPED, continue_command, datamodule_problems, is_name,
                                         take_option)
from xbench_pl.commands.errors import Interrupted, UsageError
from xbench_pl.commands.parsing import PARSER_KWARGS
from xbench_pl.console import is_rank_zero, note, say
from xbench_pl.data.lightning import XBenchDataModule
from xbench_pl.models.base import ZeroShotModel
from xbench_pl.models.checkpoints import CheckpointError, check_lightning_checkpoint
from xbench_pl.options import ExplainerName
from xbench_pl.outputs import OutputError, OutputFolder, check_not_earlier_run, check_writable, write_results
from xbench_pl.registry import RENAMED_ARGS, available, class_path, config_path, renamed_args, renamed_key, resolve_class
from xbench_pl.run_files import build_report, console_table, parse_columns, provenance, publish_report

#: ``--ckpt_path`` values that Lightning resolves itself (not a file)
LIGHTNING_CKPT_NAMES = ("best", "last", "hpc", "registry")
#: the Trainer's hardware options, in the order Lightning's ``_AcceleratorConnector`` resolves them
HARDWARE_OPTIONS = ("accelerator", "devices", "num_nodes", "strategy", "precision")
#: options of ``fit`` alone, left out of the ``test`` command a fit prints for its checkpoint
FIT_ONLY = ("--model.trainable", "--model.lr", "--model.weight_decay", "--data.val_fraction", "--data.split_seed",
            "--data.fit_split")


def resolve_names(argv: list[str]) -> list[str]:
    """Replace ``--model NAME`` / ``--data NAME`` (and ``=NAME``) by the path of NAME's config file.

    A value with a dot or slash is a class path or a file and passes through; any other is a
    registered name, and an unknown one raises ``UnknownName`` listing the available names.
    ``--model VALUE`` is followed by ``--model_name VALUE``: the name the report shows (it is
    part of the config, so a saved ``--print_config`` keeps it). ``--model.help NAME`` (and
    ``--model NAME --model.help``: the model given) shows the options of NAME's class, whatever else the line
    gives; so does ``--data.help``. Old model argument names become the new ones (``renamed_model_options``).
    """
    kinds = {"--model": "models", "--data": "data"}
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        kind = kinds.get(flag.removesuffix(".help"))
        if kind and not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            value, i = argv[i + 1], i + 1
        if kind and flag.endswith(".help"):  # the whole answer: the line's other options are not parsed for it
            value = value or take_option(argv, flag.removesuffix(".help"))[0] or ""
            return [flag] + ([class_path(kind, value) if is_name(value) else value] if value else [])
        elif kind and value:
            given = str(config_path(kind, value)) if is_name(value) else value
            out += [flag, renamed_model_config(given) if kind == "models" and given == value else given]
            if flag == "--model" and not value.startswith("{"):  # a class path or file names the model too
                out += ["--model_name", value]
        else:
            out.append(arg)
        i += 1
    return renamed_model_options(out)


def renamed_model_options(argv: list[str]) -> list[str]:
    """``--model.OLD[=VALUE]`` as ``--model.NEW`` (``registry.RENAMED_ARGS``, with its note)."""
    out = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if flag.startswith("--model."):
            flag = "--model." + renamed_key(flag.removeprefix("--model."), "--model.{}")
        out.append(flag + eq + value)
    return out


def command_to_test(argv: list[str], checkpoint: str) -> str:
    """The ``test`` command of a ``fit`` run's checkpoint, ready to paste: fit's ``--model``/``--data``/``--config``
    options as given (less ``FIT_ONLY``) and ``--ckpt_path``."""
    kept, i = [], 0
    while i < len(argv):
        flag = argv[i].partition("=")[0]
        with_value = "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("--")
        part = argv[i:i + 1 + with_value]
        if flag.split(".")[0] in ("--model", "--data", "--config") and flag not in FIT_ONLY:
            kept += part
        i += len(part)
    return f"{PROG} test {shlex.join([*kept, '--ckpt_path', checkpoint])}"


def renamed_model_config(value: str) -> str:
    """A ``--model`` YAML file (or inline config) whose ``init_args`` use old names: the config, renamed, inline;
    anything else as it is."""
    path = Path(value).expanduser()
    try:
        config = yaml.safe_load(path.read_text() if path.suffix in (".yaml", ".yml") and path.is_file() else value)
    except (OSError, yaml.YAMLError):
        return value
    return json.dumps(config) if renamed_init_args(config, "init_args.{}", f"{value}: ") else value


def renamed_config(config: object) -> bool:
    """Rename the old model argument names in a ``--config`` file's content (its ``model``, at the top or under a
    subcommand), in place; whether there were any."""
    found = False
    for holder in (config, *(config.get(c) for c in TRAINER_COMMANDS)) if isinstance(config, dict) else ():
        model = holder.get("model") if isinstance(holder, dict) else None
        found = renamed_init_args(model, "model.init_args.{}", "--config: ") or found
    return found


def renamed_init_args(model: object, spelling: str, where: str) -> bool:
    """Rename the old argument names in a ``{class_path, init_args}`` mapping's ``init_args`` (``renamed_args``), in
    place; whether there were any."""
    init_args = model.get("init_args") if isinstance(model, dict) else None
    if not isinstance(init_args, dict) or not set(init_args) & set(RENAMED_ARGS):
        return False
    model["init_args"] = renamed_args(init_args, spelling, where)
    return True


def class_configs(value) -> list:
    """The ``class_path``/``init_args`` entries of a config value that may be one, a list of them, or a flag."""
    return [v for v in (value if isinstance(value, list) else [value]) if hasattr(v, "class_path")]


def output_folders(config) -> dict[str, str]:
    """Every folder a ``test``/``fit`` run writes, by the option that names it: ``--out`` (callbacks default to
    it), ``--predictions``, each logger's ``save_dir``/``dir`` and each callback's ``dirpath``."""
    folders = {"--out": config.out}
    if config.get("predictions"):
        folders["--predictions"] = config.predictions
    for kind, keys in (("logger", ("save_dir", "dir")), ("callbacks", ("dirpath",))):
        for entry in class_configs(config.trainer.get(kind)):
            for key in keys:
                if (entry.get("init_args") or {}).get(key):
                    folders[f"--trainer.{kind} {entry.class_path.rpartition('.')[2]}.{key}"] = entry.init_args[key]
    return folders


def check_hardware(trainer) -> None:
    """Lightning's own check of the Trainer's hardware options (``HARDWARE_OPTIONS``: its ``_AcceleratorConnector``, the
    first thing a Trainer builds), before any model or data is built: a GPU that is not there, bad devices, an unknown or
    unusable strategy or precision is a ``UsageError`` naming the first option that fails. Options given as classes
    (not plain values) are left to the Trainer."""
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    def refusal(options: dict) -> Exception | None:
        try:
            with warnings.catch_warnings():  # the Trainer warns (16-mixed on CPU ...) when it is built
                warnings.simplefilter("ignore")
                _AcceleratorConnector(**options)
        except Exception as error:  # Lightning raises ValueError, TypeError, MisconfigurationException, ModuleNotFoundError
            return error
        return None

    given = hardware_options(trainer)
    if refusal(given) is None:  # one build when all is well; else option by option, to name the first that fails
        return
    for count, (option, value) in enumerate(given.items(), 1):
        error = refusal(dict(list(given.items())[:count]))
        if error is not None:
            message = " ".join(str(error).split())
            known = value in AcceleratorRegistry or value == "gpu"
            if option == "accelerator" and known and not isinstance(error, ModuleNotFoundError):  # that one says what to install
                here = [name for name, entry in AcceleratorRegistry.items() if entry["accelerator"].is_available()]
                message = f"no {value} device on this machine (available here: {', '.join(here)})"
            raise UsageError(f"--trainer.{option}: {message}") from error


def hardware_options(trainer) -> dict:
    """The Trainer's ``HARDWARE_OPTIONS`` given as plain values (options given as classes are left to the Trainer)."""
    return {option: value for option in HARDWARE_OPTIONS
            if (value := trainer.get(option)) is not None and isinstance(value, (str, int, list))}


def slow_precision(trainer) -> str | None:
    """The warning for bf16 mixed precision on a CPU (``16-mixed`` becomes it there): CPUs without bfloat16 units
    emulate its autocast, about 2.6 times slower than float32 (issue 43); None elsewhere."""
    if not str(trainer.get("precision") or "").startswith(("bf16", "16")):
        return None
    from lightning.pytorch.accelerators import CPUAccelerator
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    with warnings.catch_warnings():  # Lightning's own note on 16-mixed comes when the Trainer is built
        warnings.simplefilter("ignore")
        connector = _AcceleratorConnector(**hardware_options(trainer))
    if not isinstance(connector.accelerator, CPUAccelerator) or connector.precision_plugin.precision != "bf16-mixed":
        return None
    return (f"warning: --trainer.precision {trainer.precision} on a CPU: bfloat16 autocast runs about 2.6 times slower "
            "than float32 there; leave the option out on a CPU")


def quiet_wandb(trainer) -> None:
    """With a ``WandbLogger``, W&B's terminal set up now from its environment (``wandb_defaults``: ``WANDB_SILENT``):
    ``wandb.init`` checks the arguments Lightning passes it, and warns of one (``anonymous``), before it reads that."""
    from xbench_pl.callbacks.common import wandb_logger

    if is_rank_zero() and wandb_logger(trainer) is not None:
        import wandb

        wandb.setup()


def report_config(settings: dict) -> dict:
    """The config ``metrics.json`` records (and a prediction store's manifest): model, data, precision,
    and the checkpoint whose weights replaced the model's (``--ckpt_path``, only when given)."""
    config = {"model": settings["model"], "data": settings["data"], "precision": settings["trainer"].get("precision")}
    if settings.get("ckpt_path"):
        config["ckpt_path"] = settings["ckpt_path"]
    return config


class XBenchArgumentParser(LightningArgumentParser):
    """Lightning's parser with every command's settings (``PARSER_KWARGS``), also in the parsers jsonargparse
    builds from it (the help of ``--model.help NAME``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"prog": PROG, **PARSER_KWARGS, **kwargs})

    def add_class_arguments(self, theclass, nested_key=None, *args, **kwargs):
        """A model's ``explainer`` option offers (and takes) only the explainers its class takes
        (``ZeroShotModel.explainers``)."""
        added = super().add_class_arguments(theclass, nested_key, *args, **kwargs)
        if isinstance(theclass, type) and issubclass(theclass, ZeroShotModel):
            accepted = theclass.explainers()
            for action in self._actions:
                if action.dest == f"{nested_key}.explainer" and accepted != get_args(action._typehint):
                    action._typehint, action.metavar = Literal[accepted], "{" + ",".join(accepted) + "}"
                    action.help = f"where the maps come from; {theclass.__name__} takes {' or '.join(accepted)} only"
        return added

    def _load_config_parser_mode(self, content, path="", ext_vars=None, prev_cfg=None):
        """A config file's (``--config``) old model argument names renamed first (``renamed_config``)."""
        try:  # parsed twice only where an old name may stand
            config = yaml.safe_load(content) if any(old in str(content) for old in RENAMED_ARGS) else None
        except yaml.YAMLError:
            config = None  # jsonargparse says what is wrong with it
        if renamed_config(config):
            content = yaml.safe_dump(config, sort_keys=False)
        return super()._load_config_parser_mode(content, path, ext_vars, prev_cfg)


class XBenchCLI(LightningCLI):
    def __init__(self, *args, given: list[str] = (), typed: list[str] | None = None, **kwargs):
        self.started, self.given = time.time(), list(given)  # given: the command line (after the command), names pulled
        self.typed = self.given if typed is None else list(typed)  # as typed: what a printed command repeats
        self.replacing = False  # --overwrite over an earlier run in --out
        self.default_epochs = False  # fit without max_epochs, max_steps or max_time: FIT_DEFAULT_EPOCHS
        self.prediction_writer = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return VERB_SKIPPED

    def add_arguments_to_parser(self, parser) -> None:
        for name, (kind, default, text) in RUN_OPTIONS.items():
            parser.add_argument(f"--{name}", type=kind, default=default, help=text)
        for source, target in LINKED_OPTIONS.items():
            parser.link_arguments(source, target)

    def parse_arguments(self, parser, args) -> None:
        """Then, before any model or data is built (and before Lightning reads ``--ckpt_path``): the Trainer's
        hardware options usable here (``check_hardware``), ``--columns`` known, W&B's directory under ``--out``, every output folder writable, and a ``--ckpt_path`` that is a
        readable checkpoint of this ``--model``."""
        super().parse_arguments(parser, args)
        config = self.config[self.config["subcommand"]]
        check_hardware(config.trainer)
        try:
            self.columns = parse_columns(config.get("columns"))
        except ValueError as error:
            raise UsageError(f"--columns: {error}") from None
        self.wandb_under_out(config)
        if is_rank_zero():  # DDP ranks > 0 start after rank 0 checked (and would race its probe folders)
            check_writable(output_folders(config))
            self.replacing = check_not_earlier_run(config.out, config.get("overwrite", False),
                                                   self.config["subcommand"])
        if self.config["subcommand"] == "fit":
            self.fit_epochs(config.trainer)
        if config.get("ckpt_path") and config.ckpt_path not in LIGHTNING_CKPT_NAMES:
            try:
                check_lightning_checkpoint(config.ckpt_path, config.model.class_path)
            except CheckpointError as error:
                raise UsageError(f"--ckpt_path: {error}") from error
        if warning := slow_precision(config.trainer):
            note(warning)

    def fit_epochs(self, trainer) -> None:
        """``fit`` without ``--trainer.max_epochs``, ``max_steps`` or ``max_time`` (nor ``fast_dev_run``) trains
        ``FIT_DEFAULT_EPOCHS`` epoch, not Lightning's 1,000, and says so when training starts."""
        if (trainer.get("max_epochs") is None and trainer.get("max_steps") in (None, -1) and trainer.get("max_time") is None
                and not trainer.get("fast_dev_run")):
            trainer.max_epochs, self.default_epochs = FIT_DEFAULT_EPOCHS, True

    def _run_subcommand(self, subcommand: str) -> None:
        """The subcommand; Ctrl-C during it is ``Interrupted``, saying what was kept and how to go on (Lightning ends
        an interrupted ``Trainer`` call with ``SystemExit(1)``, raised while it handled the ``KeyboardInterrupt``)."""
        try:
            super()._run_subcommand(subcommand)
        except SystemExit as error:
            if not isinstance(error.__context__, KeyboardInterrupt):
                raise
            raise Interrupted(self.interrupted_message()) from None
        except KeyboardInterrupt as error:
            if isinstance(error, Interrupted):
                raise
            raise Interrupted(self.interrupted_message()) from None

    def interrupted_message(self) -> str:
        """The line of a run stopped by Ctrl-C: what it kept (the prediction store's intact images; fit's checkpoint)
        and the command that continues from there."""
        if self.subcommand == "fit":
            checkpoint = self.trainer.checkpoint_callback if hasattr(self, "trainer") else None
            path = (checkpoint.last_model_path or checkpoint.best_model_path) if checkpoint is not None else ""
            if path and Path(path).is_file():
                return (f"interrupted (Ctrl-C): {path} holds the weights of the last epoch saved; continue with: "
                        f"{continue_command('fit', self.typed, {'--ckpt_path': path})}")
            return (f"interrupted (Ctrl-C) before fit saved a checkpoint: nothing was kept; start again with: "
                    f"{continue_command('fit', self.typed)}")
        writer = self.prediction_writer
        if writer is None:
            return ("interrupted (Ctrl-C) before the results were written: nothing was kept (--predictions DIR keeps "
                    f"every image computed); start again with: {continue_command('test', self.typed)}")
        total = self.evaluated_images()
        safe = f"{writer.stored_images()}{'' if total is None else f' of {total}'}"
        return (f"interrupted (Ctrl-C): {safe} images are safe in the prediction store {self.settings['predictions']}; "
                f"continue with: {continue_command('test', self.typed, {'--resume': None})}")

    def evaluated_images(self) -> int | None:
        """The images the run evaluates, or None where its datasets are not read yet."""
        children = getattr(getattr(self, "datamodule", None), "datamodules", None) or []
        sets = [getattr(child, "test_set", None) for child in children]
        return sum(len(test_set.records) for test_set in sets) if sets and None not in sets else None

    @staticmethod
    def wandb_under_out(config) -> None:
        """A ``WandbLogger`` without a ``save_dir`` (or ``dir``) writes under ``WANDB_DIR`` when set, else ``--out``
        (Lightning's default is the working directory, where W&B ignores ``WANDB_DIR``)."""
        from lightning.pytorch.loggers import WandbLogger

        for entry in class_configs(config.trainer.get("logger")):
            init_args = entry.get("init_args")
            if (issubclass(resolve_class(entry.class_path), WandbLogger) and init_args is not None
                    and init_args.get("save_dir") in (None, ".") and not init_args.get("dir")):
                init_args.save_dir = os.environ.get("WANDB_DIR") or config.out

    def before_test(self) -> None:
        self.model.model_name = self.config[self.subcommand].get("model_name")  # captions of the visual callbacks
        for logger in self.trainer.loggers:  # W&B's run config (CSV: hparams.yaml) says where the maps came from
            logger.log_hyperparams({"explainer": self.model.explainer_info})

    def instantiate_trainer(self, **kwargs):
        kwargs = {**kwargs, "callbacks": self.trainer_callbacks()}
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (TypeError, ValueError) as error:  # Trainer's own checks of its arguments
            raise UsageError(f"--trainer: {error}") from error
        trainer.output_folder = OutputFolder(self.config[self.subcommand].out)  # the callbacks' files and ours
        self.add_prediction_store(trainer)
        quiet_wandb(trainer)
        return trainer

    def trainer_callbacks(self) -> list:
        """The trainer's callbacks with ours added: ``fit`` keeps ``last.ckpt`` (overwritten every epoch) unless
        checkpointing is off or the user gave a ``ModelCheckpoint`` of their own, and prints a line per validation
        epoch; where the output is a log or a pipe, progress comes as plain lines unless the progress bar is off
        or the user gave one."""
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.callbacks.progress import ProgressBar

        from xbench_pl.callbacks.progress import PlainProgressBar, ValidationSummary
        from xbench_pl.console import interactive

        config = self._get(self.config_init, "trainer", default={})
        given = config.get("callbacks") or []
        given = list(given) if isinstance(given, list) else [given]
        every = given + [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        ours = []
        if self.subcommand == "fit":
            if config.get("enable_checkpointing", True) and not any(isinstance(c, ModelCheckpoint) for c in every):
                ours.append(ModelCheckpoint(filename="last", save_top_k=1, enable_version_counter=False))
            ours.append(ValidationSummary(self.columns))
            if self.default_epochs:
                from lightning.pytorch.callbacks import LambdaCallback

                ours.append(LambdaCallback(on_train_start=lambda trainer, module: note(
                    f"fit: {FIT_DEFAULT_EPOCHS} epoch, the default (Lightning's: 1,000); --trainer.max_epochs N "
                    "trains N")))
        if (config.get("enable_progress_bar") is not False and not interactive()
                and not any(isinstance(c, ProgressBar) for c in every)):
            ours.append(PlainProgressBar())
        return given + ours

    def before_fit(self) -> None:
        settings = self.settings
        if settings.get("predictions") or settings.get("resume"):
            raise UsageError("--predictions and --resume belong to test: fit keeps checkpoints (OUT/checkpoints)")
        if self.datamodule.datamodules != [self.datamodule]:
            raise UsageError(f"--data: fit trains on one dataset; {self.datamodule.name} pools "
                             f"{[dm.name for dm in self.datamodule.datamodules]} (fit on each with --data NAME)")
        self.model.model_name = settings.get("model_name")
        self.datamodule.split_out = Path(settings["out"]) / "split.csv"

    def after_fit(self) -> None:
        if not self.trainer.is_global_zero:
            return
        settings = self.settings
        checkpoint = self.trainer.checkpoint_callback
        path = (checkpoint.last_model_path or checkpoint.best_model_path) if checkpoint is not None else ""
        record = {
            "model": settings.get("model_name") or settings["model"]["class_path"],
            "checkpoint": path or None,
            "split": str(self.datamodule.split_out),
            "images": {"train": len(self.datamodule.train_set), "val": len(self.datamodule.val_set),
                       "source": self.datamodule.fit_source},
            "problems": [problem.to_dict() for problem in self.datamodule.problems],  # inputs skipped or corrected
            "trained_parameters": [n for n, p in self.model.named_parameters() if p.requires_grad],
            "validation": self.model.val_history,
            "config": report_config(settings),
            "provenance": provenance(self.trainer, self.started),
        }
        out = write_results(self.trainer.output_folder, {"fit.json": json.dumps(record, indent=2) + "\n"})
        if self.model.val_results:
            epoch = self.model.val_history[-1]["epoch"]
            print(f"\nvalidation after epoch {epoch} ({len(self.datamodule.val_set)} images):")
            print(console_table({name: table["mean"] for name, table in self.model.val_results.items()}, "dataset", self.columns))
        trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        say(f"\nfit on {record['images']['train']} images from {record['images']['source']}; "
            f"trained {trained:,} parameters ({len(record['trained_parameters'])} tensors)")
        replaced = ", replacing the earlier run's (--overwrite)" if self.replacing else ""
        say(f"wrote {out / 'fit.json'} and the split {record['split']}{replaced}")
        if path:
            say(f"checkpoint: {path}\ntest it:")
            print(f"  {command_to_test(self.given, path)}")  # one line, to copy whole
        self.print_wandb_run()

    @functools.cached_property
    def settings(self) -> dict:
        """The resolved options of this run's subcommand, as plain YAML data (read once the options are parsed:
        every hook that asks gets the same)."""
        return yaml.safe_load(self.parser.dump(self.config, skip_unset=False, skip_validation=True))[self.subcommand]

    def add_prediction_store(self, trainer) -> None:
        """``--predictions DIR [--resume] [--predictions_dtype D]``: a ``PredictionWriter`` on the trainer."""
        settings = self.settings
        if not settings.get("predictions"):
            if settings.get("resume"):
                raise UsageError("--resume continues a prediction store: give its folder with --predictions DIR")
            return
        from xbench_pl.callbacks.predictions import PredictionWriter

        try:
            writer = PredictionWriter(settings["predictions"], dtype=settings["predictions_dtype"], resume=settings["resume"],
                                      shard_images=settings["predictions_shard_images"], config=report_config(settings),
                                      model_name=settings.get("model_name"), warn_failure=False)  # after_test says it
        except ValueError as error:
            raise UsageError(f"--predictions: {error}") from error
        trainer.callbacks.append(writer)
        self.prediction_writer = writer

    def after_test(self) -> None:
        """``metrics.json`` and ``metrics.md`` into ``--out``, then, where a write into the prediction store failed (a
        full disk), one error line (``OutputError``): the store folder, what failed, how many images it kept and lost,
        and the command that stores the rest. Exit status 2, as for every output that could not be written
        (``outputs.OutputFolder``): the metrics are whole, but the run did not keep all it was asked to, and a script
        (``sweep``) must not take it for a complete run."""
        if not self.trainer.is_global_zero:
            return
        settings = self.settings
        report = build_report(
            model=settings.get("model_name") or settings["model"]["class_path"],
            results=self.model.results,
            problems=datamodule_problems(self.datamodule),
            config=report_config(settings),
            random_weights=bool(getattr(self.model, "random_weights", False)),
            provenance=provenance(self.trainer, self.started),
            explainer=self.model.explainer_info,
            evaluated={dm.name: dm.evaluated_ids() for dm in self.datamodule.datamodules},
        )
        writer = self.prediction_writer
        try:
            out = publish_report(report, self.trainer.output_folder, self.columns)
        except OutputError as error:
            if writer is None or writer.failure is None:
                raise
            raise OutputError(f"{error}; and {self.store_failure(None)}") from error
        if report["random_weights"]:
            fitted = " fitted from" if settings.get("ckpt_path") else ""
            say(f"\nNOTE: {report['model']} has{fitted} RANDOM weights (random_init, no checkpoint): these numbers only "
                "smoke-test the set-up; the report says so (random_weights: true)")
        replaced = ", replacing the earlier run's (--overwrite)" if self.replacing else ""
        say(f"\nwrote {out / 'metrics.json'} and {out / 'metrics.md'}{replaced}")
        self.print_wandb_run()
        if writer is not None and writer.failure is not None:
            raise OutputError(self.store_failure(out))

    def store_failure(self, out: Path | None) -> str:
        """The line of a prediction store that could not be written: what failed, what it kept and lost, where the
        metrics are (``out``), and the command that stores the rest (``--resume``; ``--overwrite``: ``out`` holds this
        run's metrics now)."""
        where = f" (metrics.json and metrics.md are in {out})" if out is not None else ""
        command = continue_command("test", self.typed, {"--resume": None, "--overwrite": None})
        return (f"--predictions {self.settings['predictions']}: "
                f"{self.prediction_writer.failure_message(self.evaluated_images())}{where}; make room, then store the "
                f"rest with: {command}")

    def print_wandb_run(self) -> None:
        from xbench_pl.callbacks import wandb_summary

        where = wandb_summary(self.trainer)
        if where:
            say(where)


def run_trainer(command: str, argv: list[str], from_command_line: bool, typed: list[str] | None = None) -> int:
    """``test`` or ``fit`` (``TRAINER_COMMANDS``) through ``XBenchCLI``; ``typed``: the options as the user typed them
    (default ``argv``), which a command printed to continue the run repeats."""
    from xbench_pl.callbacks import wandb_defaults

    wandb_defaults()  # a WandbLogger runs offline and quiet unless WANDB_* say otherwise (sync later: wandb sync)
    resolved = resolve_names(argv)
    # our defaults (VERB_DEFAULTS), first so that an explicit option or --config overrides them; LightningCLI reads a
    # --ckpt_path before any option applies, so a pickled object is refused whatever --weights_only says
    resolved = [*(x for name, value in VERB_DEFAULTS[command].items() for x in (f"--{name}", str(value).lower())), *resolved]
    if command == "test":  # a fit checkpoint's callbacks (checkpointing, progress) have no part in a test
        warnings.filterwarnings("ignore", message=r".*Be aware that when using `ckpt_path`, callbacks used to create")
    if from_command_line:  # DDP re-launches this command line in every rank; give them the resolved one
        sys.argv[1:] = [command, *resolved]
    XBenchCLI(
        ZeroShotModel,
        XBenchDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=None if from_command_line else [command, *resolved],
        trainer_defaults=FIT_TRAINER_DEFAULTS if command == "fit" else TRAINER_DEFAULTS,
        seed_everything_default=SEED_DEFAULT,
        save_config_callback=None,
        parser_class=XBenchArgumentParser,
        parser_kwargs={"description": SUMMARIES[command],
                       **{c: {"description": SUMMARIES[c], "epilog": NAMES_HELP.format(
                           models=", ".join(available("models")), data=", ".join(available("data")),
                           explainers=", ".join(get_args(ExplainerName)))}
                          for c in TRAINER_COMMANDS}},
        auto_configure_optimizers=False,
        given=argv,
        typed=typed,
    )
    return 0
