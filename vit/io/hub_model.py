"""`vit.VisionTransformer`: the model with the Hugging Face Hub's methods, `save_pretrained`,
`push_to_hub` and `from_pretrained`, from huggingface_hub's ModelHubMixin.

The mixin is applied here, in io/, so vit.model keeps to torch and einops: anyone can lift the
plain class, and every model the package hands out (vit.create_model, vit.load_model,
vit.from_pretrained) is this subclass, with the same weights, names and forward.

    import vit
    model = vit.create_model("vit_tiny", num_classes=100)
    model.save_pretrained("my-vit")                       # config.json, model.safetensors, card
    model = vit.VisionTransformer.from_pretrained("my-vit")   # or "owner/name", revision="v1"
    model.push_to_hub("your-name/my-vit")                 # after `hf auth login`
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelHubMixin

from vit.io import load, timm_interop
from vit.io.hub import OURS, load_pretrained, model_card, pretrained_metadata, save_pretrained
from vit.io.hub_card import HEADER
from vit.io.hub_folder import REPO_ID
from vit.io.load import made_how
from vit.model import vision_transformer


class VisionTransformer(
    vision_transformer.VisionTransformer,
    ModelHubMixin,
    **HEADER,  # library vit, MIT, image classification: the card's header (vit/io/hub_card.py)
):
    """vit.model.VisionTransformer with the Hub's methods; `class_names` and `card_metadata`
    (how the weights were made: recipe, test_top1, ...) travel into what save_pretrained writes."""

    class_names: list[str] | None = None
    card_metadata: dict[str, str] | None = None
    _card_repo_id: str | None = None  # while push_to_hub writes: the repository the card loads

    def _save_pretrained(self, save_directory: Path) -> None:
        """The mixin's hook: vit's writer, so config.json and the card are vit's own. The card
        is replaced too (the mixin keeps an existing README.md): it states the accuracy of the
        weights beside it, which a stale one would misreport."""
        save_pretrained(
            self,
            save_directory,
            class_names=self.class_names,
            metadata=self.card_metadata,
            overwrite=True,  # the mixin's save_pretrained replaces a folder's files, as HF does
            repo_id=self._card_repo_id,
        )

    def push_to_hub(self, repo_id: str, **options: Any) -> str:
        """The mixin's push_to_hub (commit_message, private, token, branch, create_pr, ...): it
        saves to a temporary folder and uploads it; the card's use lines load `repo_id`."""
        # a bare name gets its owner from the Hub (create_repo): the card cannot name it ahead
        self._card_repo_id = repo_id if REPO_ID.fullmatch(repo_id) else None
        try:
            return super().push_to_hub(repo_id, **options)
        finally:
            self._card_repo_id = None

    def generate_model_card(
        self, *args: Any, name: str = "vit-model", repo_id: str | None = None, **kwargs: Any
    ) -> ModelCard:
        """vit's model card (what save_pretrained writes as README.md), not the mixin's template;
        `name` is the card's title, save_pretrained's folder name; `repo_id` the repository its
        use lines load."""
        meta = pretrained_metadata(self, class_names=self.class_names, metadata=self.card_metadata)
        params = sum(p.numel() for p in self.parameters())
        return ModelCard(model_card(meta, name=name, num_params=params, repo_id=repo_id))

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | Path,
        *,
        force_download: bool = False,
        token: str | bool | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        revision: str | None = None,
        **model_kwargs: Any,
    ) -> VisionTransformer:
        """A model (eval mode) from a save_pretrained folder, a Hub repository ("owner/name",
        at `revision`), a shipped name, or a .ckpt / .safetensors file; `model_kwargs` replace
        constructor arguments (img_size=48 resizes the positions)."""
        return from_pretrained(
            pretrained_model_name_or_path,
            force_download=force_download,
            token=token,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
            revision=revision,
            **model_kwargs,
        )


def as_hub_model(
    model: vision_transformer.VisionTransformer,
    *,
    class_names: list[str] | None = None,
    card_metadata: dict[str, str] | None = None,
) -> VisionTransformer:
    """`model` itself, now of the Hub-enabled class: the subclass adds methods and no state, so
    re-classing keeps every tensor and setting (dropout rates, kernel, mode) as they are."""
    if not isinstance(model, vision_transformer.VisionTransformer):
        raise ValueError(f"expected a vit VisionTransformer, got {type(model).__name__}.")
    model.__class__ = VisionTransformer
    model.class_names = list(class_names) if class_names is not None else None
    model.card_metadata = dict(card_metadata) if card_metadata is not None else None
    return model


def _handed_out(
    model: vision_transformer.VisionTransformer, info: dict[str, Any]
) -> VisionTransformer:
    """load_model's model as the Hub class, with its class names and how it was made."""
    names = (info.get("hyper_parameters") or {}).get("class_names")
    recorded = info.get("safetensors_metadata")
    if recorded is not None:  # a .safetensors, a folder or shipped weights
        made = {k: v for k, v in recorded.items() if k not in OURS}
    else:
        made = made_how(info)
    return as_hub_model(model, class_names=names, card_metadata=made)


def load_model(
    path: str | Path, *, weights: str | None = None, **overrides: Any
) -> tuple[VisionTransformer, dict[str, Any]]:
    """vit.load_model: vit.io.load.load_model's model (eval mode) with the Hub's methods, its
    `class_names` and `card_metadata`, and the checkpoint dict."""
    model, info = load.load_model(path, weights=weights, **overrides)
    return _handed_out(model, info), info


def from_pretrained(name: str | Path, **options: Any) -> VisionTransformer:
    """vit.from_pretrained: a model (eval mode) from a save_pretrained folder, a Hub repository
    ("owner/name"; revision=, token=, cache_dir=, local_files_only=, force_download=), a shipped
    name, or a .ckpt / .safetensors file; other keywords replace constructor arguments."""
    return _handed_out(*load_pretrained(name, **options))


def create_model(preset: str, **overrides: Any) -> VisionTransformer:
    """vit.create_model: a preset by name (vit.model's presets), any constructor argument
    overridden, with the Hub's methods."""
    return VisionTransformer(**vision_transformer.model_config(preset, **overrides))


def from_timm(timm_model: Any, **overrides: Any) -> VisionTransformer:
    """vit.from_timm: a timm ViT's weights in vit's model (vit/io/timm_interop.py), with the
    Hub's methods, ready for save_pretrained."""
    return as_hub_model(timm_interop.from_timm(timm_model, **overrides))
