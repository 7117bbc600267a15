"""Patient subgroups (``--model.groups``): sex, age band and view of each image, read from the dataset's own metadata.

A record's ``groups`` (``Record.groups``) maps a group name to its value; a name it lacks is ``unknown``: the
dataset has no such field, the cell is empty, or it holds something outside the group's values (counted in
``by_group``, never guessed).

========  =================================  ==============================================================
group     values                             read from
========  =================================  ==============================================================
``sex``   ``F``, ``M``                       NIH ``Patient Gender``; CheXpert ``Sex``; DICOM PatientSex;
                                             COVID-19 Rural ``covid_rural_patient_info.csv`` ``SEX``
``age``   ``<40``, ``40-59``, ``60-79``,     NIH ``Patient Age`` (years); CheXpert ``Age``; DICOM PatientAge
          ``80+``                            (``nnnY``; ``D``/``W``/``M`` units are under a year); COVID-19 Rural ``AGE``
``view``  ``PA``, ``AP``                     NIH ``View Position``; CheXpert ``AP/PA``; DICOM ViewPosition
========  =================================  ==============================================================

Age bands are in whole years: 39 is ``<40``, 40 is ``40-59``, 59 is ``40-59``, 60 is ``60-79``, 79 is ``60-79``,
80 is ``80+``. A negative or non-numeric age is ``unknown``. Sex and view are matched after stripping blanks and
upper-casing (``Female``/``Male`` as CheXpert writes them count as ``F``/``M``); any other view (``LL``, ``AP
Supine`` ...) is ``unknown``.
"""

from __future__ import annotations

import re

#: each group's values, in table order (``unknown`` is never one of them)
GROUPS: dict[str, tuple[str, ...]] = {
    "sex": ("F", "M"),
    "age": ("<40", "40-59", "60-79", "80+"),
    "view": ("PA", "AP"),
}
UNKNOWN = "unknown"
AGE_BOUNDS = (40, 60, 80)  # lower bounds of the bands after the first

_SEX = {"F": "F", "FEMALE": "F", "M": "M", "MALE": "M"}
_DICOM_AGE = re.compile(r"^(\d{1,3})([DWMY])$")


def parse_groups(value: str) -> tuple[str, ...]:
    """``"sex,age,view"`` (any subset, any order) as a tuple of group names; a ValueError naming the bad one."""
    names = tuple(part.strip() for part in str(value).split(","))
    for name in names:
        if name not in GROUPS:
            raise ValueError(f"unknown group {name!r}: choose from {', '.join(GROUPS)} (comma-separated)")
    if len(set(names)) != len(names):
        raise ValueError(f"group listed twice in {value!r}")
    return names


def sex_group(value) -> str:
    """``F``/``M`` from a sex cell, else ``unknown``."""
    return _SEX.get(str(value).strip().upper(), UNKNOWN) if value is not None else UNKNOWN


def age_years(value) -> float | None:
    """Age in years from a number, a numeric string (``"58"``, ``"58.0"``) or a DICOM age string (``"058Y"``;
    ``D``/``W``/``M`` ages are converted); None where missing, negative or unreadable."""
    if value is None:
        return None
    text = str(value).strip().upper()
    match = _DICOM_AGE.match(text)
    if match:
        number, unit = int(match.group(1)), match.group(2)
        return number / {"D": 365.25, "W": 52.1775, "M": 12.0, "Y": 1.0}[unit]
    try:
        years = float(text)
    except ValueError:
        return None
    return years if years >= 0 and years == years else None  # NaN != NaN


def age_group(value) -> str:
    """The age band of ``value`` (see ``age_years``), else ``unknown``."""
    years = age_years(value)
    if years is None:
        return UNKNOWN
    index = sum(years >= bound for bound in AGE_BOUNDS)
    return GROUPS["age"][index]


def view_group(value) -> str:
    """``PA``/``AP`` from a view cell, else ``unknown``."""
    text = str(value).strip().upper() if value is not None else ""
    return text if text in GROUPS["view"] else UNKNOWN


def metadata_groups(sex=None, age=None, view=None) -> dict[str, str]:
    """A record's ``groups`` from its raw sex, age and view cells (None: no such field)."""
    return {"sex": sex_group(sex), "age": age_group(age), "view": view_group(view)}

