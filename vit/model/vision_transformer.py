"""VisionTransformer in plain PyTorch, with timm's names (https://arxiv.org/abs/2010.11929).

Image -> patches -> linear projection -> [CLS] + patch vectors + positions -> encoder blocks ->
final LayerNorm -> linear head on the CLS vector (or on the mean of the patch vectors).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from vit.model.attention import Kernel
from vit.model.block import Block
from vit.model.embed import (
    PatchEmbed,
    keep_index,
    resize_pos_embed,
    sincos_2d_table,
    sinusoidal_table,
    take_patches,
)

ATTN_INITS = ("default", "mimetic")  # how attention weights start (VisionTransformer.init_weights)
POS_INITS = ("trunc_normal", "sincos2d")  # how a learned position table starts (init_weights)

# Presets sized for 32x32 images with 4x4 patches (64 patches + CLS = 65 tokens).
PRESETS: dict[str, dict[str, Any]] = {
    "vit_nano": dict(embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0),  # ~0.8 M params
    "vit_tiny": dict(embed_dim=192, depth=6, num_heads=3, mlp_ratio=4.0),  # ~2.7 M params
    "vit_lite": dict(embed_dim=256, depth=7, num_heads=4, mlp_ratio=2.0),  # ~3.7 M params
    "vit_small": dict(embed_dim=384, depth=6, num_heads=6, mlp_ratio=4.0),  # ~10.7 M params
}


class VisionTransformer(nn.Module):
    """A ViT classifier. All arguments are keyword-only; see PRESETS for tested sizes."""

    def __init__(
        self,
        *,
        img_size: int = 32,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 10,
        embed_dim: int = 192,
        depth: int = 6,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        class_token: bool = True,
        global_pool: Literal["token", "avg"] = "token",
        pos_embed: Literal["learned", "sincos"] = "learned",
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        patch_drop_rate: float = 0.0,
        kernel: Kernel = "auto",
        dynamic_img_size: bool = False,
        attn_init: Literal["default", "mimetic"] = "default",
        pos_init: Literal["trunc_normal", "sincos2d"] = "trunc_normal",
        lsa: bool = False,
        spt: bool = False,
    ) -> None:
        super().__init__()
        _check_config(locals())
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_prefix_tokens = 1 if class_token else 0
        self.embed_dim = embed_dim
        self.patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            dynamic_img_size=dynamic_img_size,
            spt=spt,
        )
        num_tokens = self.num_prefix_tokens + self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, embed_dim))
        else:
            self.register_buffer("pos_embed", sinusoidal_table(num_tokens, embed_dim)[None])
        self.pos_drop = nn.Dropout(pos_drop_rate)
        self.patch_drop_rate = (
            patch_drop_rate  # training only; a curriculum changes it: set_patch_drop
        )
        rates = torch.linspace(0, drop_path_rate, depth).tolist()  # deeper blocks drop more
        self.blocks = nn.ModuleList(
            Block(
                embed_dim,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias,
                drop=drop_rate,
                attn_drop=attn_drop_rate,
                drop_path=rate,
                kernel=kernel,
                lsa=lsa,
            )
            for rate in rates
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes)
        self.init_weights(attn_init, pos_init)

    def init_weights(self, attn_init: str = "default", pos_init: str = "trunc_normal") -> None:
        """timm's ViT init: truncated normal (std 0.02) for positions and linear weights.

        attn_init="mimetic" then gives each block's attention the structure trained ViTs show
        (Attention.mimetic_init_: W_q^T W_k near +identity per head, W_v^T W_proj^T near -identity).
        pos_init="sincos2d" starts the learned position table at the 2-D sine-cosine table of the
        patch grid (the CLS entry at zero) instead of noise; it stays a trained parameter.
        """
        _check_init_names(attn_init, pos_init)
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)  # drawn either way: same RNG stream
            if pos_init == "sincos2d":  # so every other weight starts as with the default
                with torch.no_grad():
                    self.pos_embed.zero_()
                    table = sincos_2d_table(self.patch_embed.grid_size, self.embed_dim)
                    self.pos_embed[0, self.num_prefix_tokens :] = table
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        # a linear map of a flattened patch (a conv, or a Linear with spt): LeCun-style init
        w = self.patch_embed.proj.weight
        nn.init.trunc_normal_(w, std=(1.0 / w[0].numel()) ** 0.5)
        nn.init.zeros_(self.patch_embed.proj.bias)
        if attn_init == "mimetic":
            for block in self.blocks:
                block.attn.mimetic_init_()

    def set_patch_drop(self, rate: float) -> None:
        """Drop this fraction of each image's patch tokens in training from now on (never in
        evaluation): what a patch-drop curriculum calls between steps."""
        if not 0 <= rate < 1:
            raise ValueError(f"patch_drop_rate={rate} must be in [0, 1): the fraction dropped.")
        self.patch_drop_rate = rate

    def set_dynamic_img_size(self, enabled: bool) -> None:
        """Take square images of any side that is a multiple of the patch, not only img_size: the
        position table is resized to each grid per forward (vit/model/embed.py). A resolution
        curriculum turns this on before training."""
        self.patch_embed.dynamic_img_size = enabled

    def no_weight_decay(self) -> set[str]:
        """Parameter names (besides biases and norms) that AdamW should not decay."""
        return {"cls_token", "pos_embed"}

    def embed(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, N, D) tokens: patch vectors, CLS prepended, positions added.

        In training, with patch_drop_rate > 0, a random part of each image's patches is dropped
        first (keep_index): the kept ones are embedded and take their own positions, so the
        tokens are those of every patch with the dropped rows left out, for less work from the
        patch embedding on. Evaluation always sees every patch.
        """
        grid = self.patch_embed.grid(x)
        keep = None
        if self.training and self.patch_drop_rate > 0:
            keep = keep_index(x.shape[0], grid * grid, self.patch_drop_rate, device=x.device)
        x = self.patch_embed(x, keep=keep)
        pos = self.pos_embed
        if grid != self.patch_embed.grid_size:  # dynamic_img_size: another grid
            pos = resize_pos_embed(pos, new_grid=grid, num_prefix_tokens=self.num_prefix_tokens)
        prefix_pos, patch_pos = pos[:, : self.num_prefix_tokens], pos[:, self.num_prefix_tokens :]
        x = x + (patch_pos if keep is None else take_patches(patch_pos, keep))
        if self.cls_token is not None:
            cls = (self.cls_token + prefix_pos).expand(x.shape[0], -1, -1)
            x = torch.cat([cls, x], dim=1)
        return self.pos_drop(x)

    def forward_features(self, x: Tensor) -> Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward_head(self, x: Tensor) -> Tensor:
        """(B, N, D) tokens -> (B, num_classes) logits."""
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)
        else:
            x = x[:, 0]
        return self.head(self.head_drop(x))

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, num_classes) logits, equal to forward_head(forward_features(x)).

        With CLS pooling the head reads one token, so the last block computes that token's row
        only (its keys and values still come from every token): about 1/depth less work for the
        same logits (a test holds them equal).
        """
        if self.global_pool == "avg":
            return self.forward_head(self.forward_features(x))
        x = self.embed(x)
        for block in self.blocks[:-1]:
            x = block(x)
        x = self.blocks[-1](x, num_queries=self.num_prefix_tokens)  # (B, 1, D): the CLS row
        return self.forward_head(self.norm(x))

    def forward_with_attention(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Logits and each layer's attention weights, (B, heads, N, N), after softmax.

        Runs the explicit attention path whatever `kernel` the normal forward uses, and computes
        the same function: a test holds its logits equal to forward's.
        """
        x = self.embed(x)
        maps = []
        for block in self.blocks:
            x, weights = block.forward_with_attention(x)
            maps.append(weights)
        return self.forward_head(self.norm(x)), maps


def model_config(preset: str, **overrides: Any) -> dict[str, Any]:
    """Constructor arguments of a preset, with every override that is not None applied."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}.")
    return {**PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None}}


def create_model(preset: str, **overrides: Any) -> VisionTransformer:
    """Build a preset by name, with any constructor argument overridden."""
    return VisionTransformer(**model_config(preset, **overrides))


def _check_config(cfg: dict[str, Any]) -> None:
    """Fail at construction, with the fix, on values that cannot make a model."""
    for key in ("num_classes", "embed_dim", "depth", "num_heads"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"{key}={cfg[key]!r} must be a positive integer.")
    if cfg["mlp_ratio"] <= 0:
        raise ValueError(f"mlp_ratio={cfg['mlp_ratio']} must be positive (4.0 is usual).")
    for key in (
        "drop_rate",
        "pos_drop_rate",
        "attn_drop_rate",
        "drop_path_rate",
        "patch_drop_rate",
    ):
        if not 0.0 <= cfg[key] < 1.0:
            raise ValueError(f"{key}={cfg[key]} must be in [0, 1); it is a probability.")
    if cfg["patch_size"] > cfg["img_size"]:
        raise ValueError(
            f"patch_size={cfg['patch_size']} is larger than img_size={cfg['img_size']}; "
            f"use a patch that divides the image, e.g. 4 for 32x32."
        )
    if cfg["lsa"] and (cfg["img_size"] // cfg["patch_size"]) ** 2 + cfg["class_token"] < 2:
        raise ValueError(  # LSA masks each token's own score: one token would attend to nothing
            "lsa=True needs at least 2 tokens, but this model has 1 (one patch, no class token); "
            "use a smaller patch_size, class_token=True, or lsa=False."
        )
    if cfg["global_pool"] not in ("token", "avg"):
        raise ValueError(f"global_pool={cfg['global_pool']!r} must be 'token' or 'avg'.")
    if cfg["global_pool"] == "token" and not cfg["class_token"]:
        raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg'.")
    _check_init_names(cfg["attn_init"], cfg["pos_init"])
    if cfg["pos_embed"] not in ("learned", "sincos"):
        raise ValueError(f"pos_embed={cfg['pos_embed']!r} must be 'learned' or 'sincos'.")
    if cfg["pos_init"] != "trunc_normal" and cfg["pos_embed"] != "learned":
        raise ValueError(
            f"pos_init={cfg['pos_init']!r} sets the start of a learned table, but "
            f"pos_embed={cfg['pos_embed']!r} is a fixed one: use pos_embed='learned' with it."
        )
    if cfg["embed_dim"] % cfg["num_heads"] != 0:
        raise ValueError(
            f"embed_dim={cfg['embed_dim']} is not divisible by num_heads={cfg['num_heads']}; "
            f"pick num_heads among the divisors of {cfg['embed_dim']}."
        )


def _check_init_names(attn_init: str, pos_init: str) -> None:
    """The one check of the init names: at construction (_check_config) and in init_weights."""
    if attn_init not in ATTN_INITS:
        raise ValueError(
            f"attn_init={attn_init!r} must be one of {ATTN_INITS} ('mimetic' starts each "
            "attention near the structure trained ViTs show; 'default' is timm's init)."
        )
    if pos_init not in POS_INITS:
        raise ValueError(
            f"pos_init={pos_init!r} must be one of {POS_INITS} ('sincos2d' starts the "
            "learned position table at the 2-D sine-cosine table; 'trunc_normal' is timm's init)."
        )
