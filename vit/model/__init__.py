"""The network, from first principles: attention, patch embedding, the block, the Vision
Transformer and its configuration. Imports torch and einops only."""

from vit.model.attention import Attention
from vit.model.block import Block
from vit.model.config import NetworkConfig
from vit.model.embed import PatchEmbed
from vit.model.vision_transformer import VisionTransformer, create_model

__all__ = ["Attention", "Block", "NetworkConfig", "PatchEmbed", "VisionTransformer", "create_model"]
