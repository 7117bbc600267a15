"""The grounded generative family's one base: a transformers image-text-to-text model run as a ``ZeroShotModel``.

For every (image, finding or phrase) it gives three things (``zero_shot``):

1. **stated boxes** (``ZeroShotOutput.stated``): the model's own grounding prompt (``GROUNDING_PROMPT``, each family's
   documented one), generated greedily (``do_sample=False``, left padding, KV cache, at most ``max_new_tokens``), the
   raw text kept, parsed by the family's convention (``parsing``) into boxes in model-input pixels; an answer that
   cannot be parsed is counted (``parse_failure_rate``) and scored as no box.
2. **a recognition score**: one forward of a stated question (``question``, e.g. "Is there {} in this chest X-ray?"),
   no generation: ``scores = P(yes) / (P(yes) + P(no))`` of the first answer token (the family's ``ANSWERS``), and
   ``logits = log P(yes) - log P(no)`` (what gradient explainers explain).
3. **a map**: in that same forward, the attention of the last prompt position (the one whose next token is the
   answer) to the image tokens, averaged over every head of every language-model layer, on the image tokens' grid
   (``image_grid``). Only that query row is kept (``LAST_QUERY``: an attention function that computes the layer's
   output with torch's SDPA and the last row's weights beside it), so memory does not grow with the square of the
   sequence.

For the score and the map the image tower runs once per image (``image_features``); its features go to each of that
image's prompts (transformers' ``mm_encoder_outputs``; ``generate`` takes the pixels again), and a text forward never
mixes images, so how images fall into batches and processes changes none of its numbers. Gradient explainers explain the recognition forward (``explainer_forward``); the boxes
are stated after them, outside their hooks (``explained``).

An architecture module (``lingshu.py``, ``medgemma.py``, ...) subclasses ``GenerativeModel`` and gives what differs:
the transformers class and its configs (the release's and a tiny one built in code), the chat template
(``prompt``), the image inputs (``image_inputs``) and what the release's processor gives beside the ids
(``token_inputs``, ``layout_inputs``), the image token and grid, the box convention (``parse``), its stand-in
tokenizer's special tokens (``TOKEN_FIELDS``, ``STOP_TOKEN``) and its release's key names (``RELEASE_RENAMES``). Weights: a local copy of the release's folder (``checkpoint``: its
``config.json``, tokenizer files and safetensors), or ``random_init``: a tiny configuration of the same classes built
in code (``tiny_config``: a few layers, hidden sizes 32-64, a smaller input) with a stand-in tokenizer, for smoke runs
on a CPU. Nothing downloads, and no remote code runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import PositiveInt

from xbench_pl.judging import StatedBoxes, ZeroShotOutput
from xbench_pl.models.base import ZeroShotModel
from xbench_pl.models.checkpoints import CheckpointError, build_weights

#: the attention function registered with transformers that keeps each layer's last query row (``last_query_attention``)
LAST_QUERY = "xbench_last_query"
#: the releases' ``config.json`` as shipped (``random_size: release``, the meta-device checks)
RELEASE_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "generative"
#: the default recognition question (``{}``: the finding's name or the phrase)
QUESTION = "Is there {} in this chest X-ray? Answer yes or no."


class AttentionRows:
    """Where ``last_query_attention`` puts each layer's last-query weights ``[rows, heads, keys]`` while collecting."""

    collected: list[torch.Tensor] | None = None


def last_query_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' SDPA attention for the layer's output, and (while ``AttentionRows.collected`` is a list) the
    softmax weights of the last query position over every key, with the same mask, scaling and grouped heads."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    output, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if AttentionRows.collected is not None:
        keys = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        weights = (query[:, :, -1:].float() @ keys.float().transpose(-1, -2)) * scale
        if attention_mask is not None:
            mask = attention_mask[:, :, -1:, : keys.shape[-2]]
            weights = weights + mask.float() if mask.dtype != torch.bool else weights.masked_fill(~mask, float("-inf"))
        AttentionRows.collected.append(weights.softmax(-1)[:, :, 0])
    return output, None


def register_attention() -> None:
    """``LAST_QUERY`` as an attention function, with SDPA's masks (without a mask function of its own, transformers
    would build it none: padded keys would be attended to)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(LAST_QUERY, last_query_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(LAST_QUERY, sdpa_mask)


class GenerativeModel(ZeroShotModel):
    """A grounded generative VLM (see the module). Subclasses set the class attributes and the hooks.

    Args:
        checkpoint: the local folder of the release (``config.json``, tokenizer files, ``*.safetensors``), as
            ``weights pull NAME`` places it; required unless ``random_init``.
        random_init: run without weights (smoke tests; reports say so): the family's tiny configuration and a stand-in
            tokenizer.
        random_size: the configuration ``random_init`` builds: ``tiny`` (a few layers, built in code) or ``release`` (the
            release's, ``models/configs/generative/<name>.json``: real sizes, for benchmarks on a GPU).
        max_new_tokens: the longest grounding answer generated (None: the family's ``MAX_NEW_TOKENS``, its card's).
        question: the recognition question (``{}``: the finding or phrase).
        rows_per_forward: the most prompts of one image per forward and per ``generate`` call (memory).
        release: the hub repository the checkpoint folder copies (what messages name; a variant's own, e.g. MedGemma
            1.5's); None: the family's ``RELEASE``.
    """

    STATES_BOXES = True
    EXPLAINER_TARGET = "logits"
    #: the transformers class (``transformers.<NAME>``)
    NETWORK: str = ""
    #: the first answer tokens of the recognition question: (yes, no)
    ANSWERS: tuple[str, str] = ("Yes", "No")
    #: the special tokens a stand-in tokenizer needs (the image token first)
    SPECIAL_TOKENS: tuple[str, ...] = ()
    #: the model card's grounding prompt (``{}``: the finding or phrase)
    GROUNDING_PROMPT: str = ""
    #: the release: hub id, licence, the transformers version its authors pinned (docs/models.md says more)
    RELEASE: dict = {}
    #: the longest grounding answer its card generates (``max_new_tokens``' default)
    MAX_NEW_TOKENS = 128
    #: whether a forward needs ``position_ids`` from the attention mask (False: the network derives them, Qwen2.5-VL's rope)
    POSITIONS_FROM_MASK = True
    #: the config's token-id fields and the special token each names (a stand-in tokenizer's ids go there)
    TOKEN_FIELDS: dict[str, str] = {}
    #: the token that ends an answer (the chat turn's end)
    STOP_TOKEN = ""
    #: the release's key names (as its authors' transformers saved them) to this transformers' (``checkpoint_filter``)
    RELEASE_RENAMES: tuple[tuple[str, str], ...] = ()

    def __init__(self, checkpoint: str | None = None, random_init: bool = False, random_size: Literal["tiny", "release"] = "tiny",
                 max_new_tokens: PositiveInt | None = None, question: str = QUESTION, rows_per_forward: PositiveInt = 16,
                 release: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.release = release or self.RELEASE["hub"]
        if checkpoint is None and not random_init:
            raise CheckpointError(f"{type(self).__name__} needs --model.checkpoint DIR, a local copy of {self.release} "
                                  "(`python -m xbench_pl weights pull` with the model's name places it), or --model.random_init "
                                  "true for a smoke run")
        if "{}" not in question:
            raise ValueError(f"question {question!r} needs a {{}} where the finding goes")
        self.tiny = checkpoint is None and random_size == "tiny"
        self.max_new_tokens = int(max_new_tokens or self.MAX_NEW_TOKENS)
        self.question, self.rows_per_forward = question, int(rows_per_forward)
        self.checkpoint = None if checkpoint is None else Path(checkpoint).expanduser()
        if self.checkpoint is not None and not self.checkpoint.is_dir():
            raise FileNotFoundError(f"checkpoint {self.checkpoint}: no such folder; give the release folder of {self.release} "
                                    "(config.json, tokenizer files, *.safetensors)")
        register_attention()
        if self.checkpoint is not None:
            self.tokenizer = self.load_tokenizer(self.checkpoint)
            config = self.read_config(self.checkpoint)
        else:
            self.tokenizer = self.stand_in("tokenizer", self.stand_in_tokenizer())
            config = self.stand_in_ids(self.tiny_config(len(self.tokenizer)) if self.tiny else self.config_from(self.release_data()))
        build_weights(lambda: self.build(config), random_init=self.checkpoint is None)
        self.preprocess = self.input_preprocess()
        self.answer_ids = tuple(self.single_token(word) for word in self.ANSWERS)
        if self.checkpoint is not None:
            self.load_release(self.checkpoint)
        else:
            self.warn_random_weights()
        self.eval()
        self.attach_explainer()

    # -- what an architecture gives -----------------------------------------------------------------
    def tiny_config(self, vocab_size: int):
        raise NotImplementedError

    def prompt(self, text: str) -> str:
        """The whole prompt string for one image and the user's ``text``: chat template, image tokens expanded."""
        raise NotImplementedError

    def image_inputs(self, images: torch.Tensor) -> dict:
        """The network's image keyword arguments for ``images [N, 3, S, S]`` (one image per prompt row)."""
        raise NotImplementedError

    def image_grid(self) -> tuple[int, int]:
        """The (rows, columns) grid of the first ``rows * columns`` image tokens of a prompt (the map's grid)."""
        raise NotImplementedError

    def parse(self, text: str) -> list[tuple[float, float, float, float, float]]:
        """The boxes of a generated ``text`` in model-input pixels with a confidence (1 where none):
        ``parsing.ParseError`` for a text that cannot be read."""
        raise NotImplementedError

    def input_preprocess(self):
        """The model input (``geometry.Preprocess``; ``self.tiny``: the tiny configuration's smaller input)."""
        raise NotImplementedError

    @property
    def image_token_id(self) -> int:
        return int(self.tokenizer.convert_tokens_to_ids(self.SPECIAL_TOKENS[0]))

    # -- shared ------------------------------------------------------------------------------------
    @classmethod
    def model_key(cls) -> str:
        return cls.__name__.lower()

    def build(self, config) -> None:
        import transformers

        self.network = getattr(transformers, self.NETWORK)(config)
        self.network.set_attn_implementation({"text_config": LAST_QUERY})

    def stand_in_tokenizer(self):
        from xbench_pl.models.generative.tokens import chat_stand_in

        return chat_stand_in(self.SPECIAL_TOKENS, self.ANSWERS)

    def load_tokenizer(self, folder: Path):
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{folder}: no tokenizer of {self.release} there ({error}); give the release folder "
                                  "as downloaded (tokenizer.json, tokenizer_config.json)") from None

    def read_config(self, folder: Path):
        """The network's config from the release folder's ``config.json``."""
        path = folder / "config.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{path}: cannot read the release's config ({error})") from None
        return self.config_from(data)

    def config_from(self, data: dict):
        """The transformers config of a release's ``config.json`` contents (notes, ``_source*``, dropped)."""
        import transformers

        config_class = getattr(transformers, self.NETWORK).config_class
        return config_class(**{k: v for k, v in data.items() if k not in ("architectures", "auto_map") and not k.startswith("_source")})

    @classmethod
    def release_data(cls) -> dict:
        """The release's ``config.json`` as shipped here (``models/configs/generative/<name>.json``)."""
        return json.loads((RELEASE_CONFIGS / f"{cls.model_key()}.json").read_text())

    def stand_in_ids(self, config):
        """``config`` with the stand-in tokenizer's ids in its token fields (``TOKEN_FIELDS``) and its text model's end
        and padding tokens (``STOP_TOKEN``, the stand-in's padding)."""
        ids = self.tokenizer.convert_tokens_to_ids
        for field, token in self.TOKEN_FIELDS.items():
            setattr(config, field, ids(token))
        for part in {id(c): c for c in (config, config.get_text_config())}.values():  # the composite's own, where it has them
            if part is config.get_text_config() or getattr(part, "eos_token_id", None) is not None:
                part.eos_token_id, part.pad_token_id = ids(self.STOP_TOKEN), self.tokenizer.pad_token_id
        return config

    def load_release(self, folder: Path) -> None:
        from xbench_pl.models.checkpoints import load_weights
        from safetensors.torch import load_file

        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{folder}: no *.safetensors of {self.release} there")
        state = {}
        for file in files:
            state.update(load_file(file))
        load_weights(self.network, self.checkpoint_filter(state), str(folder))

    def checkpoint_filter(self, state: dict) -> dict:
        """The release's keys in transformers 5's names: each family's ``RELEASE_RENAMES`` (regex, replacement) applied in
        order; the strict loader names any key left over."""
        out = {}
        for key, value in state.items():
            for pattern, new in self.RELEASE_RENAMES:
                key = re.sub(pattern, new, key)
            out[key] = value
        return out

    @classmethod
    def release_network(cls, data: dict, device: str | torch.device = "meta"):
        """The network a checkpoint run builds (the family's ``config_from`` and ``build``) from the contents of a
        release's ``config.json`` (``data``; keys starting ``_source`` are notes and dropped), without weights or
        tokenizer, its parameters on ``device`` (``meta``: no memory; checks of key names and shapes)."""
        register_attention()
        shell = cls.__new__(cls)  # only the module machinery: config_from and build use nothing else
        torch.nn.Module.__init__(shell)
        shell.tiny = False
        with torch.device(device):
            shell.build(shell.config_from(data))
        return shell.network

    def single_token(self, word: str) -> int:
        ids = self.tokenizer.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{type(self).__name__}: the answer {word!r} is {len(ids)} tokens of this tokenizer, not one")
        return ids[0]

    def encode(self, prompts: list[str]) -> dict:
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        return {k: v.to(self.device) for k, v in encoded.items() if k in ("input_ids", "attention_mask")}

    def chunks(self, b: int, classes: list[str]) -> list[tuple[int, list[str]]]:
        """The prompt rows as ``(image index, texts)``, one image's texts per forward (in chunks of ``rows_per_forward``).
        A forward never mixes images, so what a batch holds (1 or N processes, any ``batch_size``) changes no number:
        its padding and shapes are the image's own."""
        return [(i, classes[s:s + self.rows_per_forward]) for i in range(b) for s in range(0, len(classes), self.rows_per_forward)]

    def positions(self, attention_mask: torch.Tensor) -> dict:
        """``position_ids`` that start at 0 on each row's first real token (left padding), as ``generate`` makes them;
        none for a family whose network derives them from the mask itself (``POSITIONS_FROM_MASK``)."""
        if not self.POSITIONS_FROM_MASK:
            return {}
        return {"position_ids": (attention_mask.long().cumsum(-1) - 1).clamp_min(0)}

    def token_inputs(self, input_ids: torch.Tensor) -> dict:
        """What the release's processor gives beside the ids (default: nothing): Gemma 3's ``token_type_ids`` (its image
        tokens attend to each other both ways), Qwen2.5-VL's ``mm_token_type_ids`` (its multimodal rope)."""
        return {}

    def layout_inputs(self, rows: int) -> dict:
        """What a forward on ``rows`` prompts needs of the image's layout beside its features (default: nothing; Qwen2.5-VL:
        ``image_grid_thw``, for its rope)."""
        return {}

    def image_features(self, images: torch.Tensor):
        """The image tower and projector once for ``images [B, 3, S, S]``: transformers' ``get_image_features`` output,
        whose ``pooler_output`` holds each image's features (a tensor or a list, by family)."""
        return self.network.model.get_image_features(**self.image_inputs(images), return_dict=True)

    @staticmethod
    def row_features(features, image: int, rows: int):
        """``features`` of image ``image`` repeated for ``rows`` prompts, as ``mm_encoder_outputs["image"]``."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        pooled = features.pooler_output
        mine = pooled[image:image + 1].expand(rows, *pooled.shape[1:]) if torch.is_tensor(pooled) else [pooled[image]] * rows
        return BaseModelOutputWithPooling(pooler_output=mine)

    def text_forward(self, prompts: list[str], features, image: int) -> tuple[torch.Tensor, dict, list[torch.Tensor]]:
        """One forward of ``prompts`` (all of image ``image``, its ``features`` from ``image_features``): the logits
        ``[rows, L, V]``, the encoded inputs and each layer's last-query attention ``[rows, heads, L]``."""
        inputs = self.encode(prompts)
        AttentionRows.collected = []
        try:
            out = self.network(**inputs, **self.token_inputs(inputs["input_ids"]), **self.positions(inputs["attention_mask"]),
                               **self.layout_inputs(len(prompts)), use_cache=False,
                               mm_encoder_outputs={"image": self.row_features(features, image, len(prompts))})
            layers = AttentionRows.collected
        finally:
            AttentionRows.collected = None
        return out.logits, inputs, layers

    def recognition(self, features, image: int, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of the question for each text about image ``image``: ``logits [n]`` (log P(yes) - log P(no)) and
        the maps ``[n, h, w]``."""
        logits, inputs, layers = self.text_forward([self.prompt(self.question.format(text)) for text in texts], features, image)
        answer = logits[:, -1, list(self.answer_ids)].float().log_softmax(-1)
        maps = self.image_attention(torch.stack(layers).mean(dim=(0, 2)), inputs["input_ids"])  # mean over layers and heads
        return answer[:, 0] - answer[:, 1], maps

    def image_attention(self, attention: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """The last query's attention ``[rows, keys]`` at each row's first ``h * w`` image tokens, as maps ``[rows, h, w]``."""
        image = input_ids == self.image_token_id
        h, w = self.image_grid()
        counts = image.sum(1)
        if (counts < h * w).any():
            raise ValueError(f"{type(self).__name__}: a prompt has {int(counts.min())} image tokens, fewer than its {h}x{w} grid")
        positions = image.long().argsort(dim=1, descending=True, stable=True)[:, : h * w].sort(dim=1).values
        return attention.gather(1, positions).reshape(-1, h, w)

    @torch.no_grad()
    def generate(self, images: torch.Tensor, texts: list[str]) -> list[str]:
        """The greedy answers to the grounding prompt of each text about the one image ``images [1, 3, S, S]``, decoded with
        special tokens kept up to the first end of sequence (``decode``)."""
        inputs = self.encode([self.prompt(self.GROUNDING_PROMPT.format(text)) for text in texts])
        out = self.network.generate(**inputs, **self.token_inputs(inputs["input_ids"]),
                                    **self.image_inputs(images.expand(len(texts), -1, -1, -1)), max_new_tokens=self.max_new_tokens,
                                    do_sample=False, num_beams=1, use_cache=True, pad_token_id=self.tokenizer.pad_token_id)
        return [self.decode(row) for row in out[:, inputs["input_ids"].shape[1]:]]

    def decode(self, ids: torch.Tensor) -> str:
        """A generated row as text: up to its first end-of-sequence or padding token, special tokens kept (the box
        conventions of some families are special tokens)."""
        stops = {t for t in (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id) if t is not None}
        stops |= set(self.network.generation_config.eos_token_id if isinstance(self.network.generation_config.eos_token_id, list)
                     else [self.network.generation_config.eos_token_id] if self.network.generation_config.eos_token_id is not None else [])
        kept = []
        for token in ids.tolist():
            if token in stops:
                break
            kept.append(token)
        return self.tokenizer.decode(kept, skip_special_tokens=False)

    def stated_boxes(self, texts: list[str]) -> tuple[list[torch.Tensor], list[bool]]:
        from xbench_pl.models.generative.parsing import ParseError

        boxes, failed = [], []
        for text in texts:
            try:
                parsed = self.parse(text)
                failed.append(False)
            except ParseError:
                parsed = []
                failed.append(True)
            boxes.append(torch.tensor(parsed, dtype=torch.float64).reshape(-1, 5))
        return boxes, failed

    def answered(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        """Scores, logits and maps of every (image, finding) (``recognition``; the image tower once per image), no
        generation: what ``zero_shot`` scores and what gradient explainers explain (autograd as the caller has it)."""
        b, c = images.shape[0], len(classes)
        features = self.image_features(images)
        logits, maps = [], []
        for image, texts in self.chunks(b, classes):
            row_logits, row_maps = self.recognition(features, image, texts)
            logits.append(row_logits)
            maps.append(row_maps.float())
        logits = torch.cat(logits).reshape(b, c).float()
        return ZeroShotOutput(scores=torch.sigmoid(logits), saliency=torch.cat(maps).reshape(b, c, *maps[0].shape[-2:]), logits=logits)

    def stated(self, images: torch.Tensor, classes: list[str]) -> StatedBoxes:
        """The boxes stated for every (image, finding) (``generate``, parsed by the family's ``parse``), with the texts."""
        b, c = images.shape[0], len(classes)
        texts = [text for image, part in self.chunks(b, classes) for text in self.generate(images[image:image + 1], part)]
        boxes, failed = self.stated_boxes(texts)
        return StatedBoxes([boxes[i * c:(i + 1) * c] for i in range(b)], [texts[i * c:(i + 1) * c] for i in range(b)],
                           torch.tensor(failed, dtype=torch.bool).reshape(b, c))

    @torch.no_grad()
    def zero_shot(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        output = self.answered(images, classes)
        return ZeroShotOutput(output.scores, output.saliency, output.logits, stated=self.stated(images, classes))

    def explainer_forward(self, images: torch.Tensor, classes: list[str], grad: bool = True) -> tuple[ZeroShotOutput, torch.Tensor]:
        """The recognition forward alone (``answered``: the image tower runs once, as a CAM's layer must) and its logits;
        the boxes are stated after the explainer, outside its hooks (``explained``)."""
        with torch.set_grad_enabled(grad):
            output = self.answered(images, classes)
        return output, output.logits

    def map_output(self, batch) -> ZeroShotOutput:
        """The scores and maps alone (``answered``, or the explainer's maps), no generation: the trust measures' randomized
        copies compare maps only."""
        def maps_only(images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
            if self.explainer_method is None:
                with torch.no_grad():
                    return self.answered(images, classes)
            return ZeroShotModel.explained(self, images, classes)

        return self.grounded(batch, maps_only)

    def explained(self, images: torch.Tensor, classes: list[str]) -> ZeroShotOutput:
        if self.explainer_method is None:
            return self.zero_shot(images, classes)
        output = super().explained(images, classes)
        with torch.no_grad():
            stated = self.stated(images, classes)
        return ZeroShotOutput(output.scores, output.saliency, output.logits, stated=stated)
