"""Towers shared by model families, in plain torch, one contract per file.

* ``image_encoders``: ``ResNetPatches`` (torchvision ResNet-50 to stage 3 or 4) and
  ``ViTPatches`` (ViT-B/16 in the Hugging Face ``google/vit-base-patch16-224-in21k`` key
  layout) return patch tokens ``[B, N, C]`` (row-major raster: token ``y * w + x``) and their
  grid ``(h, w)``.
* ``text_encoders``: ``BertModel`` (Hugging Face BERT key layout) and ``BertQueryEncoder``
  (a BERT, pooled by ``"pooler"`` or ``"cls"``, optionally through a GELU MLP) -> one
  embedding per text; ``without_trailing_padding`` cuts the padding a caller never reads.
* ``query_decoder``: ``QueryDecoder``, a DETR-style pre-norm transformer decoder (queries
  self-attend, then cross-attend to patch tokens; no positional encodings) returning the
  decoded queries and every layer's head-averaged cross-attention ``[L, B, Q, N]``.
* ``hf_blocks``: the Hugging Face key-level blocks (``Dense``, ``SelfAttention``) that both the
  BERT and the ViT are built of.
* ``pooling``: ``AttentionPool2d`` (CLIP's ResNet attention pooling, MAVL's global branch)
  -> one global feature per image.
* ``cxr_bert``: ``CXRBert`` (BioViL's CXR-BERT: a BERT whose ``[CLS]`` goes through a projection head,
  the authors' ``CXRBertModel`` key layout) -> one projected embedding per text.

Key names follow the released checkpoints' layouts, so a family's filter function only renames
prefixes. Nothing here downloads or reads weights.
"""

from xbench_pl.models.layers.image_encoders import ResNetPatches, ViTPatches
from xbench_pl.models.layers.pooling import AttentionPool2d
from xbench_pl.models.layers.query_decoder import QueryDecoder, QueryDecoderLayer
from xbench_pl.models.layers.text_encoders import BertModel, BertQueryEncoder, without_trailing_padding

__all__ = ["AttentionPool2d", "BertModel", "BertQueryEncoder", "QueryDecoder", "QueryDecoderLayer", "ResNetPatches", "ViTPatches",
           "without_trailing_padding"]
