"""How long does each command take before it does anything? Prints, per command line, the median over
``--repeats`` fresh processes of the wall time and of the import time (the sum of the top-level entries of
``python -X importtime``), and whether Lightning, torchmetrics and torch were imported.

The command lines: every command's ``--help``, the typical early errors (an unknown model or dataset, a
``--data.root`` that is no folder, an ``--out`` that cannot be written, a bad number or choice), each as a user types
it, and whole runs on the demo: ``test`` of the ``center`` baseline (native maps: no explainer library should
load) writing a prediction store, then ``score``, ``compare`` (the store with itself), ``export`` and ``store upgrade``
of that store, and ``describe`` of the demo. Run: ``python benchmarks/bench_startup.py
[--repeats 3] [--only test] [--repo DIR]`` (``--repo``: another checkout to measure, e.g. an older commit's
``git archive``, for a before/after on the same machine).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: (what, command line after ``python -m xbench_pl``)
LINES = [
    ("score --help", ["score", "--help"]),
    ("score --maps --help", ["score", "--maps", "DIR", "--help"]),
    ("export --help", ["export", "--help"]),
    ("compare --help", ["compare", "--help"]),
    ("report --help", ["report", "--help"]),
    ("describe --help", ["describe", "--help"]),
    ("test --help", ["test", "--help"]),
    ("fit --help", ["fit", "--help"]),
    ("test: unknown model", ["test", "--model", "nope", "--data", "demo"]),
    ("test: unknown dataset", ["test", "--model", "center", "--data", "nope"]),
    ("test: --data.root no folder", ["test", "--model", "center", "--data", "nih_bbox", "--data.root", "/no/such/folder"]),
    ("test: --out not writable", ["test", "--model", "center", "--data", "demo", "--out", "/proc/version/out"]),
    ("test: bad number", ["test", "--model", "center", "--data", "demo", "--data.batch_size", "0"]),
    ("test: bad choice", ["test", "--model", "center", "--data", "demo", "--model.normalize", "foo"]),
    ("test: --data.root not given", ["test", "--model", "center", "--data", "nih_bbox"]),
    ("score: no store", ["score", "--predictions", "/no/such/store"]),
    # whole runs ({work}: a temporary folder; the store of the test run is the one score reads)
    ("test: a native run (center, demo)", ["test", "--model", "center", "--data", "demo", "--model.bootstrap", "0",
                                           "--predictions", "{work}/store", "--out", "{work}/test"]),
    ("score: a run (the store above)", ["score", "--predictions", "{work}/store", "--out", "{work}/score"]),
    ("compare: a run (the store above, with itself)", ["compare", "--predictions", "{work}/store", "{work}/store",
                                                      "--bootstrap", "10", "--out", "{work}/compare"]),
    ("describe: a run (demo)", ["describe", "--data", "demo"]),
    ("export: a run (the store above)", ["export", "--predictions", "{work}/store", "--to", "npy", "--out", "{work}/npy"]),
    ("store upgrade: a run (the store above)", ["store", "upgrade", "{work}/store"]),
]
#: the libraries only an explainer other than ``native`` needs
EXPLAINER_LIBRARIES = {"pytorch_grad_cam", "open_clip", "timm"}
#: ``-X importtime``'s lines: cumulative µs, the indent (one space: a top-level import) and the module
IMPORT = re.compile(r"^import time:\s+\d+ \|\s+(\d+) \|( +)([\w.]+)$", re.M)


def measure(args: list[str], repo: Path) -> tuple[float, float, set[str], int]:
    """One fresh process: wall seconds, import seconds, the top-level packages it imported, and its exit status."""
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "xbench_pl", *args], cwd=repo, env=env,
                         capture_output=True, text=True)
    wall = time.perf_counter() - started
    entries = IMPORT.findall(run.stderr)
    imports = sum(int(us) for us, indent, _ in entries if len(indent) == 1) / 1e6
    return wall, imports, {name.split(".")[0] for _, _, name in entries}, run.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="only the lines whose label contains this")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to measure (default: this one)")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the start; "
          f"median of {args.repeats} fresh processes of {args.repo}")
    print("| command line | wall s | import s | exit | lightning | torchmetrics | torch | explainer libraries |\n"
          "|---|---:|---:|---:|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for label, line in LINES:
            if args.only not in label:
                continue
            line = [token.format(work=work) for token in line]
            runs = []
            for _ in range(args.repeats):
                # each test run writes a new store (the last one stays for score); each export a new folder
                for folder in {"test": ("store", "test"), "export": ("npy",)}.get(line[0], ()):
                    shutil.rmtree(Path(work) / folder, ignore_errors=True)
                runs.append(measure(line, args.repo))
            wall, imports = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            packages, code = runs[-1][2], runs[-1][3]
            loaded = {name: "yes" if name in packages else "no" for name in ("lightning", "torchmetrics", "torch")}
            print(f"| `{label}` | {wall:.2f} | {imports:.2f} | {code} | {loaded['lightning']} | {loaded['torchmetrics']} | "
                  f"{loaded['torch']} | {', '.join(sorted(packages & EXPLAINER_LIBRARIES)) or 'none'} |",
                  flush=True)
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
