"""CXR-BERT's text tower (Boecking et al., ECCV 2022): a BERT whose ``[CLS]`` state goes through a projection head.

Key names are those of the authors' ``CXRBertModel`` (hi-ml-multimodal ``text/model/modelling_cxrbert.py``,
also the hub folders' remote code) without its masked-language-model head (``cls.predictions.*``, unused
for embeddings): ``bert.*`` (Hugging Face BERT layout, no pooler) and ``cls_projection_head.*``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xbench_pl.models.layers.text_encoders import BertModel


class ProjectionHead(nn.Module):
    """``dense_to_hidden`` (hidden -> projection), exact GELU, ``LayerNorm`` (eps 1e-12), ``dense_to_output``."""

    def __init__(self, hidden_size: int, projection_size: int):
        super().__init__()
        self.dense_to_hidden = nn.Linear(hidden_size, projection_size)
        self.LayerNorm = nn.LayerNorm(projection_size, eps=1e-12)
        self.dense_to_output = nn.Linear(projection_size, projection_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_to_output(self.LayerNorm(F.gelu(self.dense_to_hidden(x))))


class CXRBert(nn.Module):
    """``forward(input_ids, attention_mask) -> [N, projection_size]``: the projected ``[CLS]`` embedding of the
    last layer, unnormalised. Built from the fields of a CXR-BERT ``config.json`` (``projection_size`` included)."""

    def __init__(self, projection_size: int = 128, **bert_config):
        super().__init__()
        self.bert = BertModel(**{**bert_config, "add_pooling_layer": False})
        self.cls_projection_head = ProjectionHead(self.bert.hidden_size, projection_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.bert(input_ids, attention_mask)
        return self.cls_projection_head(hidden[:, 0])
