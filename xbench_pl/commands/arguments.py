"""What the command modules share: the program name, the commands' one-line summaries, argv option taking."""

from __future__ import annotations

import re
import shlex
from typing import Optional

PROG = "python -m xbench_pl"
#: the Lightning Trainer verbs (``trainer.XBenchCLI`` subcommands)
TRAINER_COMMANDS = ("test", "fit")
#: one line per command for ``--help``
#: set (to anything but 0) to show the traceback of an error, as ``--debug`` does
DEBUG_ENV = "XBENCH_DEBUG"

SUMMARIES = {
    "test": "benchmark a model on datasets: prints the per-dataset table, writes OUT/metrics.json and metrics.md",
    "fit": "fine-tune a model on a dataset's training split, validating every epoch with the benchmark's metrics",
    "describe": "count a dataset's images, positives and regions per finding and list its input problems",
    "score": "recompute metrics.json and metrics.md from a prediction store (test --predictions DIR), without the model",
    "export": "write a prediction store as .npy maps + scores.csv (what score --maps reads) or CheXlocalize's *_map.pkl",
    "store": "store upgrade DIR: convert a prediction store of an older format (read-only) to the current one",
    "compare": "paired bootstrap of two prediction stores on the same data: each metric's difference, 95 % CI and p-value",
    "sweep": "run a W&B sweep YAML locally (no server): one test per configuration, a summary table",
    "weights": "weights list|pull|verify: the registered models' released weights, fetched by name into one cache",
    "data": "data list|pull|verify: the datasets by name: hosts and terms, download, check a folder against its split",
    "report": "build report.md and a self-contained report.html from run folders (tables, figures, heatmaps)",
}


#: ``test``/``fit``'s own options beside the model's, the data's and the Trainer's: name -> (type, default, help)
RUN_OPTIONS = {
    "out": (str, "results", "folder for metrics.json and metrics.md"),
    "model_name": (Optional[str], None, "the model's name in the report (default: the --model value as given)"),
    "predictions": (Optional[str], None, "prediction store folder: save every score and native-grid map as the run goes "
                                         "(re-score with: score --predictions DIR)"),
    "resume": (bool, False, "continue the --predictions store of an interrupted run: skip the images it holds "
                            "(--resume alone: true)"),
    "overwrite": (bool, False, "into an --out that holds an earlier run (test: its metrics.json, fit: its fit.json): "
                               "replace its files (--overwrite alone: true); without it such an --out is refused"),
    "predictions_dtype": (str, "float16", "dtype of the stored maps: float16 (half the size) or float32 (bit-identical "
                                          "re-scoring)"),
    "predictions_shard_images": (int, 64, "images of one dataset per shard and rank (a crash loses at most these)"),
    "columns": (Optional[str], None, "the printed table's columns: all, or KEY,KEY,... (default: the README's eight and "
                                     "n_regions; metrics.md and metrics.json keep every column)"),
}
#: run options that set a Trainer argument (callbacks write under the trainer's default_root_dir: the run's --out)
LINKED_OPTIONS = {"out": "trainer.default_root_dir"}
SEED_DEFAULT = 0
TRAINER_DEFAULTS = {"logger": False, "enable_checkpointing": False, "devices": 1}
#: ``fit``'s epochs where none of ``--trainer.max_epochs``, ``max_steps``, ``max_time`` is given (Lightning's: 1,000)
FIT_DEFAULT_EPOCHS = 1
#: ``fit`` checkpoints (``OUT/checkpoints/last.ckpt`` unless a logger or a ModelCheckpoint says otherwise); its
#: trainable parameters are counted in the closing lines, not in Lightning's model summary
FIT_TRAINER_DEFAULTS = {**TRAINER_DEFAULTS, "enable_checkpointing": True, "enable_model_summary": False}
#: the Trainer verb's arguments the CLI gives itself, not options (Lightning's skip sets)
VERB_SKIPPED = {"test": {"model", "dataloaders", "datamodule"}, "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"}}
#: our defaults of the Trainer verb's own arguments: no Lightning metric table; a --ckpt_path is read with
#: torch.load(weights_only=True), tensors and plain data only (the project's stance on weights files)
VERB_DEFAULTS = {"test": {"verbose": False, "weights_only": True}, "fit": {"weights_only": True}}
#: the end of ``test --help`` and ``fit --help``
NAMES_HELP = ("Registered models (--model NAME): {models}. Registered datasets (--data NAME): {data}. "
              "Explainers of the maps (--model.explainer NAME): {explainers}. A model's options, the explainers "
              "it takes among them: --model.help NAME (a dataset's options: --data.help NAME).")


def plain(text: str) -> str:
    """Docstring text as help shows it: without reStructuredText markup (````x````, ``:class:`~a.B```)."""
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def command_help(usage: str, text: str, options: dict[str, str]) -> str:
    """The ``--help`` of a command that parses its options itself: usage line, ``text``, one line per option."""
    width = max(len(flag) for flag in options)
    lines = [f"usage: {PROG} {usage}", "", plain(text).strip(), "", "options:"]
    lines += [f"  {flag:<{width}}  {plain(what)}" for flag, what in options.items()]
    return "\n".join(lines)


def is_name(value: str) -> bool:
    """A registered name (``--model NAME``), not a class path, a file or inline YAML."""
    return not ("." in value or "/" in value or value.startswith("{"))


def take_option(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """The value of ``flag VALUE`` (or ``flag=VALUE``) in ``argv``, and ``argv`` without it; None where the flag has no
    value (absent, last, or followed by another option)."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            return argv[i + 1], argv[:i] + argv[i + 2 :]
        if arg.startswith(flag + "="):
            return arg.partition("=")[2], argv[:i] + argv[i + 1 :]
    return None, argv


def bare_flags(argv: list[str]) -> list[str]:
    """``argv`` with each boolean run option given alone (``--resume``, at the end or before another option) as
    ``--resume true``; ``--resume false`` and ``--resume=false`` stay as they are."""
    flags = {f"--{name}" for name, (kind, _, _) in RUN_OPTIONS.items() if kind is bool}
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg in flags and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append("true")
    return out


def flag_value(argv: list[str], flag: str) -> bool:
    """Whether a boolean run option is on in ``argv`` (``--overwrite``, ``--overwrite true``, ``--overwrite=yes``)."""
    value = take_option(bare_flags(argv), flag)[0]
    return value is not None and value.strip().lower() in ("true", "yes", "on")


def continue_command(command: str, argv: list[str], options: dict[str, str | None] | None = None) -> str:
    """``PROG COMMAND ARGV`` with ``options`` (option -> value; None: a boolean run option, on) at the end, each once
    (given already, perhaps otherwise, it is taken out of ``argv``): the command that goes on where a run stopped
    (``--resume``), ready to paste."""
    options = options or {}
    kept, i = [], 0
    while i < len(argv):
        if argv[i].partition("=")[0] in options:
            with_value = "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("-")
            i += 1 + with_value
            continue
        kept.append(argv[i])
        i += 1
    added = [part for option, value in options.items() for part in ([option] if value is None else [option, value])]
    return shlex.join([*PROG.split(), command, *kept, *added])


def datamodule_problems(datamodule) -> dict[str, list]:
    return {dm.name: list(dm.problems) for dm in datamodule.datamodules}
