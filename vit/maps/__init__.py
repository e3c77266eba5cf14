"""Looking inside a model: attention weights per layer and head, rollout, gradient rollout, their
pictures and the explorer page. Reads the model; nothing in vit.model imports this."""

from vit.maps.capture import attention_maps, fuse_heads, patch_grid, query_map
from vit.maps.rollout import grad_rollout, rollout, rollout_map

__all__ = [
    "attention_maps",
    "fuse_heads",
    "grad_rollout",
    "patch_grid",
    "query_map",
    "rollout",
    "rollout_map",
]
