"""The errors bad input raises: ``DataError`` (naming the file and row) and the ``Problem`` it records."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path


#: the end of the reason for a box that does not parse in a row that still labels its finding: what
#: ``on_error="skip"`` does (true whichever mode the run is in)
UNUSABLE_BOX = "on_error=skip drops the box and keeps the label"


class DataError(ValueError):
    """Bad input: the message names the file (and row) and says what is wrong.

    Picklable (``__reduce__``). ``DataError(message)`` alone is how torch re-raises an error
    from a DataLoader worker: the message is the worker's traceback, which ends in the
    original message naming the file; ``problem`` then holds it as its reason.
    """

    def __init__(self, file: str | Path, reason: str | None = None, row: int | str | None = None, action: str = "skipped"):
        row = None if row is None else str(row)
        self.arguments = (str(file), reason, row, action)
        if reason is None:
            self.problem = Problem("", None, str(file), action)
            super().__init__(str(file))
        else:
            self.problem = Problem(str(file), row, reason, action)
            super().__init__(str(self.problem))

    def __reduce__(self):
        return type(self), self.arguments


@dataclass(frozen=True)
class Problem:
    """One bad input found while reading a dataset.

    ``row`` is the 1-based line of the annotation file (the header is line 1), or ``None``
    for a whole file; for an image (``file`` is the image) it is the row of the annotation
    table listing it, which the reason names; ``action`` says what was done about it: ``"skipped"`` (the row, region
    or image was left out; an error unless ``on_error="skip"``), or a correction recorded in
    either mode: ``"clipped"`` (a box or polygon reaching outside its image was cut to it and
    kept), ``"deduplicated"`` (an exact repeat of an earlier row was dropped), ``"empty_on_grid"``
    (a region covering no eval-grid pixel centre, smaller than one eval pixel or outside its
    image, was dropped; a larger ``eval_size`` keeps a small one).
    """

    file: str
    row: str | None
    reason: str
    action: str = "skipped"

    def __str__(self) -> str:
        # an image's problem carries the row of the table listing it, named in its reason
        where = self.file if self.row is None or f", row {self.row}" in self.reason else f"{self.file}, row {self.row}"
        return f"{where}: {self.reason}"

    def to_dict(self) -> dict:
        return asdict(self)
