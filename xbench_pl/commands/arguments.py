"""What the command modules share: the program name, the commands' one-line summaries, argv option taking."""

from __future__ import annotations

import re

PROG = "python -m xbench_pl"
#: the Lightning Trainer verbs (``trainer.XBenchCLI`` subcommands)
TRAINER_COMMANDS = ("test", "fit")
#: one line per command for ``--help``
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
    "report": "build report.md and a self-contained report.html from run folders (tables, figures, heatmaps)",
}


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


def datamodule_problems(datamodule) -> dict[str, list]:
    return {dm.name: list(dm.problems) for dm in datamodule.datamodules}
