"""Weights between our VisionTransformer and timm's (github.com/huggingface/pytorch-image-models).

Both use the same parameter names (patch_embed.proj, cls_token, pos_embed, blocks.{i}.norm1,
attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2, norm, head), so the state-dict mapping is the
identity; the work is building the matching configuration and refusing timm variants we cannot
represent (layer scale, register tokens, fc_norm, qk-norm, ...). timm is imported lazily: the rest
of the library never needs it. Nothing is downloaded.
"""

from __future__ import annotations

from functools import partial
from types import ModuleType
from typing import Any

from torch import nn

from vit.io.state_dict import state_dict_mismatches
from vit.model.vision_transformer import VisionTransformer

EPS = 1e-6  # LayerNorm epsilon of our model (and of timm's ViTs)
# Our options that timm's VisionTransformer cannot express: to_timm refuses models built with them.
_NOT_IN_TIMM = {
    "lsa": "locality self-attention (lsa=True: a diagonal mask and trained temperatures)",
    "spt": "shifted patch tokenization (spt=True: shifted copies of the image and a LayerNorm "
    "before the patch projection)",
}


def to_timm(model: VisionTransformer, **timm_kwargs: Any) -> nn.Module:
    """timm's VisionTransformer at the same configuration, holding a copy of `model`'s weights.

    `timm_kwargs` go to timm's constructor (e.g. `drop_path_rate=0.1` to fine-tune there); they
    must not change parameter shapes. A sin-cos model becomes a timm model with a learned
    `pos_embed` initialised to the same table (timm's ViT has only learned positions).
    """
    cfg = config_of(model)  # same argument names as timm's, except pos_embed ("learn" there)
    for option, what in _NOT_IN_TIMM.items():
        if cfg.pop(option):
            raise ValueError(
                f"this model uses {what}, which timm's VisionTransformer has no option for; only "
                f"models built with {option}=False convert."
            )
    tvit = _timm()
    kwargs = dict(
        {k: v for k, v in cfg.items() if k != "pos_embed"},
        pre_norm=False,  # no LayerNorm before the blocks
        fc_norm=False,  # with global_pool='avg' timm would otherwise norm after pooling instead
        dynamic_img_size=False,
        norm_layer=partial(nn.LayerNorm, eps=EPS),
        act_layer=nn.GELU,
    )
    timm_model = tvit.VisionTransformer(**{**kwargs, **timm_kwargs})
    _copy_weights(model.state_dict(), timm_model, given_name="our model")
    return timm_model.train(model.training)


def from_timm(timm_model: nn.Module, **overrides: Any) -> VisionTransformer:
    """Our VisionTransformer at the configuration of a timm ViT, holding a copy of its weights.

    `overrides` go to our constructor (dropout rates, `kernel`); they must not change shapes.
    Raises ValueError, naming what differs, for timm variants this model cannot represent.
    """
    tvit = _timm()
    if not isinstance(timm_model, tvit.VisionTransformer):
        raise ValueError(
            f"expected a timm.models.vision_transformer.VisionTransformer, got "
            f"{type(timm_model).__name__}; other timm architectures have no counterpart here."
        )
    problems = _unsupported(timm_model, tvit)
    if problems:
        raise ValueError(
            f"this timm ViT cannot be represented by vit.model.VisionTransformer: "
            f"{'; '.join(problems)}. Build it with the defaults of a plain ViT for those options."
        )
    cfg = config_of(timm_model)  # timm's ViT has learned positions only, no LSA or SPT
    model = VisionTransformer(**{**cfg, **overrides})
    _copy_weights(timm_model.state_dict(), model, given_name="timm model")
    return model.train(timm_model.training)


def _timm() -> ModuleType:
    """timm's vision_transformer module, or an ImportError that says how to install it."""
    try:
        import timm.models.vision_transformer as tvit
    except ImportError as err:
        raise ImportError(
            'timm interop needs timm, an optional dependency: pip install -e ".[timm]" '
            '(or pip install "timm>=1.0").'
        ) from err
    return tvit


def _copy_weights(state: dict[str, Any], dst: nn.Module, *, given_name: str) -> None:
    """Strict load of an identically named state dict, with a readable report on any mismatch."""
    problems = state_dict_mismatches(dst.state_dict(), state, given_name=given_name)
    if problems:
        raise ValueError(
            f"cannot copy the {given_name}'s weights into {type(dst).__module__}."
            f"{type(dst).__name__}: {'; '.join(problems)}. The source uses an option without a "
            f"counterpart (layer scale, qk-norm, ...), or a keyword override changed a shape."
        )
    dst.load_state_dict(state)


def _unsupported(tm: nn.Module, tvit: ModuleType) -> list[str]:
    """Options of a timm ViT that change the function without changing parameter names."""
    problems = []
    if tm.global_pool not in ("token", "avg"):
        problems.append(f"global_pool={tm.global_pool!r} (ours: 'token' or 'avg')")
    if getattr(tm, "pool_include_prefix", False):
        problems.append("pool_include_prefix=True (ours averages patch tokens only)")
    if getattr(tm, "no_embed_class", False):
        problems.append("no_embed_class=True (ours adds positions to the CLS token too)")
    if getattr(tm, "num_reg_tokens", 0):
        problems.append(f"reg_tokens={tm.num_reg_tokens} (ours has none)")
    if tm.pos_embed is None:
        problems.append("pos_embed='none' (ours needs a position table)")
    if not isinstance(tm.head, nn.Linear):
        problems.append("num_classes=0 (ours needs a classifier head)")
    for name in ("norm_pre", "fc_norm"):
        if not isinstance(getattr(tm, name, nn.Identity()), nn.Identity):
            problems.append(f"{name}: {type(getattr(tm, name)).__name__} (ours has none)")
    if not isinstance(tm.norm, nn.LayerNorm):
        problems.append(f"final norm: {type(tm.norm).__name__} (ours: LayerNorm)")
    embed = tm.patch_embed
    if embed.img_size is None or len(set(embed.img_size)) != 1 or len(set(embed.patch_size)) != 1:
        problems.append(f"img_size={embed.img_size}, patch_size={embed.patch_size} (ours: square)")
    if not isinstance(embed.norm, nn.Identity):
        problems.append("a norm in patch_embed (ours has none)")
    kinds = {(type(b), type(b.attn), type(b.mlp)) for b in tm.blocks}
    if kinds != {(tvit.Block, tvit.Attention, tvit.Mlp)}:
        problems.append(f"block types {sorted(str(k) for k in kinds)} (ours: timm's plain Block)")
    acts = {repr(b.mlp.act) for b in tm.blocks if not _exact_gelu(b.mlp.act)}
    if acts:
        problems.append(f"MLP activation {sorted(acts)} (ours: exact GELU)")
    eps = {m.eps for m in tm.modules() if isinstance(m, nn.LayerNorm)}
    if eps - {EPS}:
        problems.append(f"LayerNorm eps {sorted(eps)} (ours: {EPS})")
    return problems


def _exact_gelu(act: nn.Module) -> bool:
    """torch's or timm's GELU without the tanh approximation."""
    return type(act).__name__ == "GELU" and getattr(act, "approximate", "none") == "none"


def config_of(model: nn.Module) -> dict[str, Any]:
    """The architecture of a built model, ours or timm's ViT, as our constructor arguments
    (dropout rates not included). timm keeps sizes as pairs and has no LSA, SPT or sin-cos table."""
    block, dim, embed = model.blocks[0], model.embed_dim, model.patch_embed
    return dict(
        img_size=_side(embed.img_size),
        patch_size=_side(embed.patch_size),
        in_chans=getattr(embed, "in_chans", None) or embed.proj.in_channels,
        num_classes=model.head.out_features,
        embed_dim=dim,
        depth=len(model.blocks),
        num_heads=block.attn.num_heads,
        mlp_ratio=mlp_ratio_of(dim, block.mlp.fc1.out_features),
        qkv_bias=block.attn.qkv.bias is not None,
        class_token=model.cls_token is not None,
        global_pool=model.global_pool,
        pos_embed="learned" if isinstance(model.pos_embed, nn.Parameter) else "sincos",
        lsa=getattr(block.attn, "lsa", False),
        spt=getattr(embed, "spt", False),
    )


def _side(size: int | tuple[int, int]) -> int:
    return size[0] if isinstance(size, (tuple, list)) else size


def mlp_ratio_of(dim: int, hidden: int) -> float:
    """The mlp_ratio that rebuilds an MLP of `hidden` units, as int(dim * mlp_ratio) == hidden."""
    ratio = hidden / dim
    return ratio if int(dim * ratio) == hidden else (hidden + 0.5) / dim  # float rounding
