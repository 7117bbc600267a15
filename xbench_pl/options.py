"""Types of init args with a constrained domain. The command line (jsonargparse) checks a value
against its arg's type while parsing, so a bad one is refused before anything is built, naming
the option (``--data.batch_size: must be > 0, got 0``). Number ranges use jsonargparse's own
restricted types (``PositiveInt``, ``NonNegativeInt``, ``ClosedUnitInterval``, ...); choices are
``typing.Literal``s; this module adds the types jsonargparse lacks.
"""

from __future__ import annotations

from typing import Literal

from jsonargparse.typing import extend_base_type


def _on_threshold_grid(cls, value) -> None:
    import torch  # here: the commands' --help reads these types without torch

    from xbench_pl.metrics.kernels import default_thresholds

    number = float(value)
    if not torch.isclose(default_thresholds(dtype=torch.float64), torch.tensor(number, dtype=torch.float64), atol=1e-9).any():
        raise ValueError(f"{value} is not on the threshold grid 0, 0.01, ..., 1")


#: a Dice/IoU threshold on the metrics' grid (``kernels.default_thresholds``)
GridThreshold = extend_base_type("GridThreshold", float, _on_threshold_grid, register_key=("xbench_pl", "GridThreshold"),
                                 docstring="a threshold on the grid 0, 0.01, ..., 1")


#: where a model's saliency maps come from (``xbench_pl.explainers``): ``native`` or an explanation method
ExplainerName = Literal["native", "gradcam", "gradcam++", "hirescam", "layercam", "xgradcam", "eigencam", "scorecam",
                        "rollout", "chefer"]


def _group_names(cls, value) -> None:
    from xbench_pl.data.groups import parse_groups

    parse_groups(value)


#: subgroups to report (``--model.groups sex,age,view``, any subset): comma-separated names of ``data.groups.GROUPS``
GroupNames = extend_base_type("GroupNames", str, _group_names, register_key=("xbench_pl", "GroupNames"),
                              docstring="comma-separated subgroups: sex, age, view (any subset)")


#: the trust measures ``--model.trust`` takes (``xbench_pl.models.trust_run``), in the order they run
TRUST_MEASURES = ("randomization", "deletion", "insertion", "random_target")


def parse_trust(value: str) -> tuple[str, ...]:
    """``--model.trust``'s comma-separated measures as a tuple in ``TRUST_MEASURES`` order; a ValueError names an
    unknown one."""
    names = [name.strip() for name in str(value).split(",") if name.strip()]
    unknown = [name for name in names if name not in TRUST_MEASURES]
    if unknown or not names:
        raise ValueError(f"unknown trust measure {unknown[0] if unknown else value!r}; give any of {', '.join(TRUST_MEASURES)}")
    return tuple(name for name in TRUST_MEASURES if name in names)


def _trust_names(cls, value) -> None:
    parse_trust(value)


#: trust measures to run (``--model.trust randomization,deletion``, any subset): comma-separated names of ``TRUST_MEASURES``
TrustMeasures = extend_base_type("TrustMeasures", str, _trust_names, register_key=("xbench_pl", "TrustMeasures"),
                                 docstring="comma-separated trust measures: randomization, deletion, insertion, random_target")
