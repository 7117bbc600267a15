"""DeViDe (Luo, Zhou, Royer, Sekuboyina, Menze; arXiv 2404.03618): KAD's query decoder on a ViT.

No code or weights of DeViDe are public, so this model is partly inferred. Read its numbers
with that in mind.

From the paper:
    * a ViT-B image encoder and the Med-KEBERT text encoder (``xmcmic/Med-KEBERT``);
    * KAD's lineage: knowledge-enhanced queries decoded against image patches, pre-trained on
      MIMIC-CXR (their training adds retrieval, cross-view fusion and a multi-description
      projection; none of that is used at zero-shot test time).

Inferred (unverified):
    * image encoder: ViT-B/16 at 224 px in the Hugging Face ``ViTModel`` layout of
      ``google/vit-base-patch16-224-in21k`` (the ViT that KAD's ``A3_CLIP/models/vit.py::ModelViT224``
      loads), patch tokens ``last_hidden_state[:, 1:]`` (14 x 14), no projection (width 768);
    * text encoder, decoder and head exactly as KAD's (``kad.py``): pooled Med-KEBERT +
      GELU MLP, 4-layer 4-head pre-norm TQN with the shared decoder norm, ``Linear(768, 2)``;
    * score ``softmax(head)[..., 1]``; saliency = the last decoder layer's head-averaged
      cross-attention on the 14 x 14 grid;
    * preprocessing: squash to 224 (bicubic), ImageNet mean/std; KAD's query texts.

Weights: a KAD-style dict ``{image_encoder, text_encoder, model, ...}`` whose ``image_encoder``
holds ``vit.*`` (the Hugging Face ViT, its unused ``vit.pooler`` tolerated). No released DeViDe
checkpoint has been seen or verified; a real one may differ and would then fail to load with
the list of differing keys. ``random_init=True`` runs it with random weights for smoke tests
(the run's report says so).
"""

from __future__ import annotations

from xbench_pl.models.kad import KAD


class DeViDe(KAD):
    """DeViDe: ``KAD`` with the ``devide`` architecture (ViT-B/16 patches); see the module docstring."""

    INPUT_SIZES = {224: "devide"}

    def __init__(self, architecture: str = "devide", **kwargs):
        super().__init__(architecture=architecture, **kwargs)
