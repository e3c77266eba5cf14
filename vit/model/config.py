"""NetworkConfig: a VisionTransformer's options as one value, for configs and checkpoints."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from vit.model.attention import Kernel
from vit.model.vision_transformer import VisionTransformer, model_config


@dataclass
class NetworkConfig:
    """The network: a preset's sizes, any of them overridden, and the ViT's options.

    Args:
        preset: Sizes to start from: vit_nano, vit_tiny, vit_lite or vit_small (vit/model/vision_transformer.py).
        img_size: Side of the (square) input images; linked to data.image_size by vit-train.
        patch_size: Side of each square patch; the image side must be a multiple of it.
        num_classes: Outputs of the head; must match the data's classes.
        embed_dim: Width of the token vectors (None: the preset's).
        depth: Number of encoder blocks (None: the preset's).
        num_heads: Attention heads per block; must divide embed_dim (None: the preset's).
        mlp_ratio: Hidden width of each block's MLP over embed_dim (None: the preset's).
        qkv_bias: Biases in the query, key and value projections.
        class_token: Prepend a trained CLS token (needed by global_pool token).
        global_pool: Classify from the CLS token (token) or the mean of the patch tokens (avg).
        pos_embed: Position vectors: learned, or the fixed 1-D sinusoidal table (n = 10000).
        drop_rate: Dropout after the MLP and projections, and before the head.
        attn_drop_rate: Dropout on the attention weights.
        drop_path_rate: Stochastic depth of the last block (rising linearly from 0 at the first).
        patch_drop_rate: Fraction of each image's patch tokens dropped in training (a constant;
            vit.train.callbacks.PatchDropSchedule changes it by stage of training).
        kernel: Attention kernel: auto, fused (F.scaled_dot_product_attention) or explicit
            (softmax(q k^T / sqrt(d)) v); the same numbers, tested.
        attn_init: How attention weights start: default (timm's) or mimetic.
        pos_init: How a learned position table starts: trunc_normal (timm's) or sincos2d.
        lsa: Locality self-attention: each token's own key masked, a trained temperature per head.
        spt: Shifted patch tokenization: each patch vector also holds four half-patch shifts.
    """

    preset: str = "vit_tiny"
    img_size: int = 32
    patch_size: int = 4
    num_classes: int = 10
    embed_dim: int | None = None
    depth: int | None = None
    num_heads: int | None = None
    mlp_ratio: float | None = None
    qkv_bias: bool = True
    class_token: bool = True
    global_pool: Literal["token", "avg"] = "token"
    pos_embed: Literal["learned", "sincos"] = "learned"
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    patch_drop_rate: float = 0.0
    kernel: Kernel = "auto"
    attn_init: Literal["default", "mimetic"] = "default"
    pos_init: Literal["trunc_normal", "sincos2d"] = "trunc_normal"
    lsa: bool = False
    spt: bool = False

    def model_kwargs(self) -> dict[str, Any]:
        """VisionTransformer's arguments: the preset's sizes with the ones set here applied."""
        options = asdict(self)
        return model_config(options.pop("preset"), **options)

    def build(self) -> VisionTransformer:
        return VisionTransformer(**self.model_kwargs())
