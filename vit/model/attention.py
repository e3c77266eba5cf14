"""Scaled dot-product attention, masks and multi-head self-attention (https://arxiv.org/abs/1706.03762).

This is the one file that builds the attention matrix or calls PyTorch's fused kernel. The explicit
path computes softmax(q k^T / sqrt(d_k)) v step by step and can return the weights; the fused path
(F.scaled_dot_product_attention) never materialises them. `Attention` keeps both behind one small,
explicit choice (`kernel`), and a test holds them equal.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

Kernel = Literal["auto", "fused", "explicit"]
KERNELS: tuple[str, ...] = ("auto", "fused", "explicit")
MIMETIC_QK = (0.7, 0.7)  # (noise, identity) scales of W_q^T W_k per head: the paper's ViT values
MIMETIC_VO = (0.4, 0.4)  # (noise, -identity) scales of W_v^T W_proj^T


def causal_mask(n: int, *, device: torch.device | str | None = None) -> Tensor:
    """Boolean (n, n) mask, True where query i may attend to key j (j <= i)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    training: bool = True,
    mask_self: bool = False,
) -> tuple[Tensor, Tensor]:
    """Attention the explicit way: returns (context, weights).

    q: (..., N, d_k), k: (..., M, d_k), v: (..., M, d_v), any leading dims.
    mask: broadcastable to (..., N, M); boolean (True = attend, as in PyTorch) or additive (float,
    added to the scores, -inf to block). `weights` are after softmax and before dropout.
    mask_self: query i may not attend to key i (locality self-attention), by writing -inf on the
    scores' diagonal in place: the same as a mask with False on the diagonal, for N writes
    instead of a pass over all N x M scores.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., N, M)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    if mask_self:
        scores.diagonal(dim1=-2, dim2=-1).fill_(float("-inf"))
    weights = scores.softmax(dim=-1)
    dropped = F.dropout(weights, p=dropout_p, training=training) if dropout_p > 0 else weights
    return dropped @ v, weights


def mask_and_renormalize(weights: Tensor, mask: Tensor) -> Tensor:
    """The tutorials' second way to mask: zero the blocked weights, then rescale rows to sum to 1.

    Applied to softmax(scores) this equals softmax of the scores with -inf at blocked places, since
    softmax's denominator cancels: exp(s_j) / sum_{allowed} exp(s_i).
    """
    masked = weights.masked_fill(~mask, 0.0)
    return masked / masked.sum(dim=-1, keepdim=True)


def default_kernel(
    device: torch.device, dtype: torch.dtype = torch.float32
) -> Literal["fused", "explicit"]:
    """The kernel `auto` picks: fused on accelerators and for float32 on CPU, explicit for bf16 on CPU.

    Measured, not assumed (docs/performance.md): on 2-core CPUs at 65 tokens, the fused CPU kernel
    loses most of bf16's gain in training, while in float32 it is level in training and faster in
    inference.
    """
    return "explicit" if device.type == "cpu" and dtype != torch.float32 else "fused"


class Attention(nn.Module):
    """Multi-head self-attention with timm's layout: one `qkv` projection and an output `proj`."""

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        kernel: Kernel = "auto",
        lsa: bool = False,
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(
                f"embed_dim={dim} is not divisible by num_heads={num_heads}; each head gets "
                f"embed_dim / num_heads channels, so pick num_heads among the divisors of {dim}."
            )
        if kernel not in KERNELS:
            raise ValueError(f"kernel={kernel!r} is not one of {KERNELS}.")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.attn_drop = attn_drop
        self.kernel: Kernel = kernel
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.lsa = lsa
        if lsa:  # a trained multiplier of each head's 1/sqrt(d_k), starting at 1
            self.temperature = nn.Parameter(torch.ones(num_heads))

    def _masks(
        self, mask: Tensor | None, nq: int, nk: int, *, device: torch.device, fused: bool
    ) -> tuple[Tensor | None, bool]:
        """The (mask, mask_self) a kernel gets: the given mask as is, unless lsa adds its diagonal.

        Locality self-attention (Lee, Lee & Song 2021, arXiv:2112.13492) makes two changes for
        small datasets, where attention tends to stay flat: a diagonal mask stops every token from
        attending to itself, so the weights go to the others, and each head's scores get a trained
        temperature (folded into the query weights: _qkv_params). With no given mask the explicit
        path writes the diagonal in place (mask_self) and the fused one gets a boolean mask; a
        given mask is combined with the diagonal (boolean: both must allow; additive: -inf on it).
        """
        if not self.lsa:
            return mask, False
        if mask is None and not fused:
            return None, True
        others = ~torch.eye(nk, dtype=torch.bool, device=device)[:nq]  # (Q, N), True = attend
        if mask is None:
            return others, False
        if mask.dtype == torch.bool:
            mask = mask & others
            empty = ~mask.any(dim=-1)
        else:
            mask = mask.masked_fill(~others, float("-inf"))
            empty = ~mask.isfinite().any(dim=-1)
        if empty.any():  # only with a given mask: the plain ViT path never pays for this check
            raise ValueError(
                "with lsa=True each token's own key is masked, and the given mask leaves some "
                "tokens no other key (a causal mask does that to the first token): the softmax "
                "would be 0/0. Use lsa=False with causal masks, or allow every query another key."
            )
        return mask, False

    def _qkv_params(self) -> tuple[Tensor, Tensor | None]:
        """qkv's weight and bias; with lsa, each head's query rows times its temperature.

        Scaling q_h by t_h scales that head's scores q_h k^T by t_h: the LSA temperature, for a
        (3C, C) product per step instead of one over the (B, H, N, D) queries.
        """
        w, b = self.qkv.weight, self.qkv.bias
        if not self.lsa:
            return w, b
        c = self.proj.in_features
        ones = self.temperature.new_ones(2 * c)
        scale = torch.cat([self.temperature.repeat_interleave(self.head_dim), ones])  # (3C,)
        return w * scale[:, None], None if b is None else b * scale

    @torch.no_grad()
    def mimetic_init_(
        self,
        qk: tuple[float, float] = MIMETIC_QK,
        vo: tuple[float, float] = MIMETIC_VO,
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        """Mimetic initialisation (Trockman & Kolter, ICML 2023, https://arxiv.org/abs/2305.09828).

        Trained ViTs show structure in their attention weights: per head, W_q^T W_k is close to
        a positive multiple of the identity plus noise (a token's query matches its own key, so
        early maps look at nearby, similar tokens), and the value-output product W_v^T W_proj^T is
        close to a negative multiple of the identity. This init writes that structure in from the
        start, which the paper found to help most on small datasets (CIFAR-10: up to 5 points):

        - per head h: M = a Z + b I with Z ~ N(0, 1/dim) (qk = (a, b)); W_q^T W_k of the head is
          M's best rank-head_dim approximation (from its SVD, U S V^T: W_q = S^1/2 U^T and
          W_k = S^1/2 V^T on the top head_dim singular directions);
        - all heads together: M = a Z - b I (vo = (a, b)), and W_v^T W_proj^T = M exactly.

        A row vector x then scores x W_q^T W_k y^T against key token y and maps through
        values and output as x W_v^T W_proj^T. Biases are zeroed; other weights stay as they are.
        """
        dim, hd = self.proj.in_features, self.head_dim

        def noisy_identity(scale: float, sign: float) -> Tensor:
            z = torch.randn(dim, dim, generator=generator) / math.sqrt(dim)
            return scale * z + sign * torch.eye(dim)

        w = self.qkv.weight  # rows: [q (h d) | k (h d) | v (h d)]
        for h in range(self.num_heads):
            u, s, vh = torch.linalg.svd(noisy_identity(qk[0], qk[1]))
            root = s[:hd].sqrt()[:, None]
            rows = slice(h * hd, (h + 1) * hd)
            w[rows] = (root * u[:, :hd].T).to(w.dtype)  # W_q of head h: (head_dim, dim)
            w[dim:][rows] = (root * vh[:hd]).to(w.dtype)  # W_k of head h
        u, s, vh = torch.linalg.svd(noisy_identity(vo[0], -vo[1]))
        root = s.sqrt()
        w[2 * dim :] = (root[:, None] * u.T).to(w.dtype)  # W_v = S^1/2 U^T
        self.proj.weight.copy_(vh.T * root[None, :])  # W_proj = V S^1/2
        for layer in (self.qkv, self.proj):
            if layer.bias is not None:
                layer.bias.zero_()

    def _qkv(self, x: Tensor, num_queries: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, Q, D) for the first `num_queries` tokens (all if None); k, v (B, H, N, D)."""
        w, b = self._qkv_params()
        if num_queries is None:
            qkv = F.linear(x, w, b)  # (B, N, 3 * H * D)
            q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
            return q, k, v
        # the same projection, row blocks of one weight: queries for the first tokens only
        c = x.shape[-1]
        q = F.linear(x[:, :num_queries], w[:c], None if b is None else b[:c])  # (B, Q, H * D)
        kv = F.linear(x, w[c:], None if b is None else b[c:])  # (B, N, 2 * H * D)
        k, v = rearrange(kv, "b n (two h d) -> two b h n d", two=2, h=self.num_heads)
        return rearrange(q, "b n (h d) -> b h n d", h=self.num_heads), k, v

    def _out(self, ctx: Tensor) -> Tensor:
        ctx = rearrange(ctx, "b h n d -> b n (h d)")  # concatenate the heads
        return self.proj_drop(self.proj(ctx))

    def forward(
        self, x: Tensor, *, mask: Tensor | None = None, num_queries: int | None = None
    ) -> Tensor:
        """x: (B, N, C) -> (B, N, C), with the kernel chosen by `kernel` (auto: per device and dtype).

        num_queries: compute outputs for the first `num_queries` tokens only, (B, Q, C), with keys
        and values from all N tokens: the same rows as the full output, for less work.
        """
        q, k, v = self._qkv(x, num_queries)  # (B, H, Q, D), (B, H, N, D), (B, H, N, D)
        if mask is not None and num_queries is not None:
            mask = mask[..., :num_queries, :]  # the queried rows
        dropout_p = self.attn_drop if self.training else 0.0
        kernel = default_kernel(q.device, q.dtype) if self.kernel == "auto" else self.kernel
        nq, nk, fused = q.shape[-2], k.shape[-2], kernel == "fused"
        mask, mask_self = self._masks(mask, nq, nk, device=q.device, fused=fused)
        if fused:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        else:
            ctx, _ = scaled_dot_product_attention(
                q, k, v, mask=mask, dropout_p=dropout_p, training=self.training, mask_self=mask_self
            )
        return self._out(ctx)

    def forward_with_weights(
        self, x: Tensor, *, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Like forward, always on the explicit path; also returns weights (B, H, N, N)."""
        q, k, v = self._qkv(x)
        n = x.shape[1]
        mask, mask_self = self._masks(mask, n, n, device=x.device, fused=False)
        ctx, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            dropout_p=self.attn_drop,
            training=self.training,
            mask_self=mask_self,
        )
        return self._out(ctx), weights
