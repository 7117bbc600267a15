"""One canonical finding vocabulary, with each dataset's spellings mapped onto it.

Tables line up across datasets only if "Effusion" (NIH), "Pleural Effusion" (CheXlocalize)
and "Pleural effusion" (VinDr) are one row. ``canonical(name)`` maps a dataset's spelling
to the canonical name; unknown spellings are an error, never silently passed through.
"""

from __future__ import annotations

# canonical name -> spellings found in the datasets' native files (matched case-insensitively)
SYNONYMS: dict[str, tuple[str, ...]] = {
    "Atelectasis": ("Atelectasis",),
    "Cardiomegaly": ("Cardiomegaly",),
    "Pleural Effusion": ("Effusion", "Pleural Effusion", "Pleural effusion"),
    "Infiltration": ("Infiltrate", "Infiltration"),
    "Mass": ("Mass",),
    "Nodule": ("Nodule",),
    "Pneumonia": ("Pneumonia",),
    "Pneumothorax": ("Pneumothorax",),
}

_LOOKUP = {spelling.lower(): name for name, spellings in SYNONYMS.items() for spelling in (name, *spellings)}


def canonical(spelling: str) -> str:
    """Canonical finding name for a dataset's spelling; ``KeyError`` naming the spelling if unknown."""
    try:
        return _LOOKUP[spelling.strip().lower()]
    except KeyError:
        raise KeyError(f"unknown finding name {spelling!r}; known: {sorted(SYNONYMS)}") from None
