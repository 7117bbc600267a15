"""How long does a bad ``test`` command line take to say what is wrong (issue 43, "late checks")? Prints, per case,
the median over ``--repeats`` fresh processes of the wall time, its ratio to ``python -c pass`` (the interpreter's
own start, measured the same way, alternating with the cases), the exit status and whether Lightning and torch were
imported; with ``--before DIR`` (another checkout, e.g. an older commit's ``git archive``), the same for it,
alternating with this checkout's runs so that both see the same machine load.

The cases: a misspelt option, a dataset given no root (not pulled), no ``--model``, a value off its grid, a
``--predictions`` folder that cannot be made (under a regular file), a model whose weights are not pulled, ``score``
of a folder that is no prediction store, and ``--model.help`` / ``--data.help`` of registered names. Run:
``.venv/bin/python benchmarks/bench_cli_checks.py [--repeats 3] [--before DIR]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: (what, command line after ``python -m xbench_pl``; ``{file}``: a regular file)
CASES = [
    ("1 misspelt option", ["test", "--model", "clip", "--data", "demo", "--modle.x", "1"]),
    ("2 dataset without root", ["test", "--model", "center", "--data", "nih_bbox"]),
    ("3 no --model", ["test", "--data", "demo"]),
    ("4 value off the grid", ["test", "--model", "center", "--data", "demo", "--model.fixed_threshold", "1.7"]),
    ("5 --predictions not writable", ["test", "--model", "center", "--data", "demo", "--predictions", "{file}/store"]),
    ("6 weights not pulled", ["test", "--model", "chexzero", "--data", "demo"]),
    ("7 score: no store", ["score", "--predictions", "{folder}", "--data", "demo"]),
    ("8 --model.help", ["test", "--model", "clip", "--model.help"]),
    ("8 --data.help", ["test", "--model", "center", "--data", "demo", "--data.help"]),
]
#: ``-X importtime``'s lines: the module of each
IMPORT = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s+([\w.]+)$", re.M)


def measure(command: list[str], repo: Path, env: dict[str, str]) -> tuple[float, int, set[str], str]:
    """One fresh process in ``repo``: wall seconds, exit status, the top-level packages imported, the last line it
    printed on stderr (stdout for a help)."""
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-X", "importtime", *command], cwd=repo, capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(repo)})
    wall = time.perf_counter() - started
    said = [line for line in run.stderr.splitlines() if not line.startswith("import time:")] or run.stdout.splitlines()[:1]
    return wall, run.returncode, {name.split(".")[0] for name in IMPORT.findall(run.stderr)}, (said or [""])[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout to time alongside this one")
    args = parser.parse_args()
    repos = {"now": REPO, **({"before": args.before.resolve()} if args.before else {})}
    work = Path(tempfile.mkdtemp(prefix="bench_cli_checks_"))
    (work / "file").write_text("a regular file\n")
    (work / "no_store").mkdir()
    env = {**os.environ, "XBENCH_DATA_DIR": str(work / "data"), "XBENCH_WEIGHTS_DIR": str(work / "weights"),
           "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "NO_ALBUMENTATIONS_UPDATE": "1"}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the start; "
          f"median of {args.repeats}")
    baseline = [measure(["-c", "pass"], REPO, env)[0] for _ in range(args.repeats)]
    width = max(len(label) for label, _ in CASES)
    for label, case in CASES:
        command = ["-m", "xbench_pl", *(a.format(file=work / "file", folder=work / "no_store") for a in case)]
        runs: dict[str, list] = {name: [] for name in repos}
        for _ in range(args.repeats):  # alternating: the same load for each checkout and for python -c pass
            for name, repo in repos.items():
                runs[name].append(measure(command, repo, env))
            baseline.append(measure(["-c", "pass"], REPO, env)[0])
        python = statistics.median(baseline)
        for name, results in runs.items():
            wall = statistics.median(r[0] for r in results)
            code, modules, said = results[-1][1:]
            loaded = ", ".join(m for m in ("lightning", "torch") if m in modules) or "neither"
            print(f"{label:<{width}}  {name:<6}  {wall:6.2f} s  {wall / python:6.1f} x python -c pass  exit {code}  "
                  f"imports {loaded:<16}  {said[:90]}")
    print(f"python -c pass: {statistics.median(baseline):.3f} s (median of {len(baseline)})")


if __name__ == "__main__":
    main()
