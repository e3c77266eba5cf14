"""MLP, DropPath and the pre-norm transformer block (https://arxiv.org/abs/2010.11929)."""

from __future__ import annotations

from torch import Tensor, nn

from vit.model.attention import Attention, Kernel


class Mlp(nn.Module):
    """Two linear layers with GELU between: the position-wise feed-forward network."""

    def __init__(self, dim: int, *, hidden_dim: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth (https://arxiv.org/abs/1603.09382): drop a residual branch per sample."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= drop_prob < 1.0:  # at 1 every branch is dropped and kept ones divide by 0
            raise ValueError(
                f"DropPath drop_prob={drop_prob} must be in [0, 1): the chance a sample's branch "
                "is dropped (0.1 is usual for a small ViT)."
            )
        self.drop_prob = drop_prob

    def forward(self, x: Tensor) -> Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)  # (B, 1, 1)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"


class Block(nn.Module):
    """Pre-norm transformer encoder block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        kernel: Kernel = "auto",
        lsa: bool = False,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=drop,
            kernel=kernel,
            lsa=lsa,
        )
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, hidden_dim=int(dim * mlp_ratio), drop=drop)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: Tensor, *, num_queries: int | None = None) -> Tensor:
        """(B, N, C) -> (B, N, C); with num_queries, only the first tokens' rows, (B, Q, C)."""
        attn_out = self.attn(self.norm1(x), num_queries=num_queries)
        x = x[:, :num_queries] + self.drop_path1(attn_out)  # [:, :None] keeps every token
        return x + self.drop_path2(self.mlp(self.norm2(x)))

    def forward_with_attention(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Like forward, also returning this block's attention weights (B, H, N, N)."""
        attn_out, weights = self.attn.forward_with_weights(self.norm1(x))
        x = x + self.drop_path1(attn_out)
        return x + self.drop_path2(self.mlp(self.norm2(x))), weights
