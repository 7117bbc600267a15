"""Prompt templates per finding, and the caches of text embeddings the models share.

A template is a ``str.format`` pattern with the finding's name as ``{}`` or ``{finding}``:
``"{}"``, ``"no {}"``, ``"There is no {finding}"``. A prompt set has positive templates
(the finding is present) and optionally negative ones (it is absent); several templates of
one polarity are an ensemble: their unit embeddings are averaged and re-normalised (CLIP's
prompt ensembling). Defaults follow CheXzero (``"{}"`` vs ``"no {}"``), the published
zero-shot convention for chest X-rays; XBench's own templates are not public, so they are
config options to sweep.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from xbench_pl.data.base import Phrase

CHEXZERO_POSITIVE = ("{}",)
CHEXZERO_NEGATIVE = ("no {}",)


def as_templates(templates: str | Sequence[str] | None) -> tuple[str, ...]:
    """One template or a list of them -> a tuple (``None`` -> empty)."""
    if templates is None:
        return ()
    return (templates,) if isinstance(templates, str) else tuple(templates)


def fill(template: str, finding: str) -> str:
    """The prompt of ``finding``; the template names it ``{}`` or ``{finding}``."""
    try:
        return template.format(finding, finding=finding)
    except (IndexError, KeyError) as error:
        raise ValueError(f"prompt template {template!r} may only use '{{}}' or '{{finding}}'") from error


@dataclass(frozen=True)
class PromptSet:
    """Positive and (optional) negative templates; ``polarities`` are ordered (positive, negative)."""

    positive: tuple[str, ...] = CHEXZERO_POSITIVE
    negative: tuple[str, ...] = CHEXZERO_NEGATIVE

    def __post_init__(self) -> None:
        if not self.positive:
            raise ValueError("a prompt set needs at least one positive template")
        for template in self.positive + self.negative:
            fill(template, "finding")  # fail at configuration time, not mid-run

    @property
    def polarities(self) -> tuple[tuple[str, ...], ...]:
        return (self.positive, self.negative) if self.negative else (self.positive,)

    def texts(self, classes: Sequence[str]) -> list[str]:
        """All prompts, ordered class-major, then polarity, then template."""
        return [fill(t, name) for name in classes for templates in self.polarities for t in templates]


class EmbeddingCache:
    """Text embeddings of one model, computed once per (texts, device); iterating gives those keys.

    The model's text weights are part of the key implicitly: a model whose embeddings depend on
    its own weights clears its cache in ``load_state_dict``.
    """

    def __init__(self):
        self._store: dict[tuple, Any] = {}

    def clear(self) -> None:
        self._store.clear()

    def __len__(self) -> int:
        return len(self._store)

    def thaw(self) -> None:
        """Replace each stored tensor made in inference mode (alone or in a tuple) by a normal copy, which autograd
        can read (explainers run outside inference mode): the embeddings stay cached, not recomputed."""
        def normal(value):
            return value.clone() if isinstance(value, torch.Tensor) and torch.is_inference(value) else value

        with torch.inference_mode(False):
            for key, value in self._store.items():
                self._store[key] = tuple(normal(v) for v in value) if isinstance(value, tuple) else normal(value)

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._store)

    def get_texts(self, texts: Sequence[str], device: torch.device, compute: Callable[[list[str]], torch.Tensor],
                  scope: Hashable = None) -> torch.Tensor:
        """``compute(texts)`` ``[len(texts), ...]``, kept per (``scope``, texts, device). A list holding a sample's phrases
        (``data.base.Phrase``: phrase grounding) is kept text by text, so that the class names and phrases many samples
        share are computed once, each alone: the same whatever else a batch grounds (1 or N processes alike)."""
        def key(part: tuple[str, ...]) -> Hashable:
            return part if scope is None else (scope, part)

        if not any(isinstance(t, Phrase) for t in texts):
            return self.get_or_compute(key(tuple(texts)), device, lambda: compute(list(texts)))
        return torch.cat([self.get_or_compute(key((str(t),)), device, lambda t=t: compute([t])) for t in texts])

    def get_or_compute(self, texts: Hashable, device: torch.device, compute: Callable[[], Any]) -> Any:
        """The value kept for ``(texts, device)``; ``compute()`` makes it the first time."""
        key = (texts, str(device))
        if key not in self._store:
            self._store[key] = compute()
        return self._store[key]


class TextEmbeddingCache(EmbeddingCache):
    """Unit text embeddings ``[C, P, D]`` (class, polarity, dim) per (prompt set, classes, device); a list holding
    phrases (``data.base.Phrase``) per (prompt set, text, device), text by text.

    Every prompt of a class list is encoded once, in batches of ``batch_size`` through
    ``encode(texts) -> [N, D]``; later batches reuse the result.
    """

    def __init__(self, batch_size: int = 256):
        if batch_size < 1:
            raise ValueError(f"text batch_size must be positive, got {batch_size}")
        super().__init__()
        self.batch_size = batch_size

    def get(
        self, prompts: PromptSet, classes: Sequence[str], device: torch.device, encode: Callable[[list[str]], torch.Tensor]
    ) -> torch.Tensor:
        return self.get_texts(classes, device, lambda texts: self.ensembles(prompts, texts, encode), scope=prompts)

    def ensembles(self, prompts: PromptSet, classes: Sequence[str], encode: Callable[[list[str]], torch.Tensor]) -> torch.Tensor:
        """Per class and polarity, its templates' unit embeddings averaged and re-normalised."""
        texts = prompts.texts(classes)
        embeddings = torch.cat([encode(texts[i : i + self.batch_size]).float() for i in range(0, len(texts), self.batch_size)])
        embeddings = F.normalize(embeddings, dim=-1)
        per_polarity = [len(t) for t in prompts.polarities]
        by_class = embeddings.view(len(classes), sum(per_polarity), -1)
        ensembles = [chunk.mean(dim=1) for chunk in by_class.split(per_polarity, dim=1)]
        return F.normalize(torch.stack(ensembles, dim=1), dim=-1)
