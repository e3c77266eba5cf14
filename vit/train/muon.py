"""Muon for the encoder's weight matrices, AdamW for everything else, in one optimizer.

Muon (Keller Jordan, 2024, https://kellerjordan.github.io/posts/muon/) keeps a momentum of the
gradient, as SGD does, and replaces each matrix's update by the nearest (semi-)orthogonal matrix:
U V^T of its SVD U S V^T, every singular value set to about one, computed by a few Newton-Schulz
iterations (matrix products only). Every direction of the matrix then moves by about the same
amount, instead of the few that dominate the gradient. It is meant for the hidden 2-D weights:
here the blocks' qkv, projection and MLP matrices. The patch projection, the head, biases, norms,
the CLS token and the positions stay with AdamW, as in Muon's own recipe (the patch projection may
join Muon: `muon_param_groups(patch_embed=True)`).

The update is scaled by 0.2 * sqrt(max(rows, cols)) ("Muon is Scalable for LLM Training", Liu et
al. 2025) so that its RMS matches a typical AdamW update: the learning rate, weight decay
(decoupled, as AdamW's) and schedule tuned for AdamW carry over. torch.optim.Muon runs its
iterations in bfloat16 always; on a CPU without native bf16 products that is many times slower
than float32, so here the iterations run in bfloat16 only where that is fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vit.system.hardware import cpu_has_fast_bf16

# the quintic iteration's coefficients from Muon's reference code: steep at zero, so five steps
# bring every singular value into about [0.7, 1.2] (not exactly 1, which does not hurt)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


# iterate on the Gram matrix (_iterate_on_the_gram) when the long side is at least this many times
# the short: 5 steps cost 17 m^3 + 2 m^2 n multiply-adds there against 5 m^3 + 10 m^2 n in the loop
GRAM_FORM_RATIO = 1.5


def orthogonalize(
    g: Tensor, *, steps: int = 5, dtype: torch.dtype = torch.float32, gram: bool = True
) -> Tensor:
    """About U V^T for g = U S V^T (singular values near one), by Newton-Schulz iterations; g is
    one matrix or a stack of them (..., m, n), each orthogonalized on its own. `gram`: iterate on
    the Gram matrix where that is cheaper and safe (float32, GRAM_FORM_RATIO); False: the loop."""
    if g.dim() < 2:
        raise ValueError(f"orthogonalize expects a matrix or a stack, got shape {tuple(g.shape)}.")
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype).reshape(-1, *g.shape[-2:])  # one batch of matrices: one product per stack
    tall = x.shape[1] > x.shape[2]
    if tall:  # iterate on the wide side: the Gram matrix x x^T is the smaller one
        x = x.mT
    # spectral norm <= Frobenius norm = 1: inside the iteration's range
    x = x / (x.norm(dim=(1, 2), keepdim=True) + 1e-7)
    if gram and dtype == torch.float32 and x.shape[2] >= GRAM_FORM_RATIO * x.shape[1]:
        x = _iterate_on_the_gram(x, steps)
    else:
        for _ in range(steps):  # x <- a x + (b G + c G^2) x, G = x x^T: three products
            xxt = torch.bmm(x, x.mT)
            x = torch.baddbmm(x, torch.baddbmm(xxt, xxt, xxt, beta=b, alpha=c), x, beta=a)
    return (x.mT if tall else x).reshape(g.shape).to(g.dtype)


def _iterate_on_the_gram(x: Tensor, steps: int) -> Tensor:
    """orthogonalize's loop for a batch of wide x (m x n, m < n), done in m x m products.

    Each step is x <- p(G) x with G = x x^T and p(G) = a + b G + c G^2, so after k steps x = Q x0
    with Q a product of polynomials in G0 = x0 x0^T: they all commute, and G <- p(G)^2 G. Each
    step's two m x m x n products become at most three more m x m x m ones, and only the first
    G0 and the last Q x0 touch n: 0.66x and 0.84x the multiply-adds for the blocks' 192 x 576
    and 192 x 384 matrices. In exact arithmetic the result is the loop's; in float32 it is within
    about 2e-4 of the largest entry (the loop: 5e-5; tested against float64). Only in float32: G
    and Q are not recomputed from x, so their rounding drifts apart, small in float32, not in
    bfloat16.
    """
    a, b, c = NS_COEFFICIENTS
    gram = x @ x.mT
    q = None
    for step in range(steps):
        p = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b G + c G^2
        p.diagonal(dim1=1, dim2=2).add_(a)
        q = p if q is None else p @ q
        if step < steps - 1:
            gram = p @ (p @ gram)
    return q @ x


def orthogonalize_stacks(
    stacks: list[Tensor],
    *,
    steps: int = 5,
    dtype: torch.dtype = torch.float32,
    padded: bool = False,
) -> list[Tensor]:
    """Each stack (k, m, n) orthogonalized matrix by matrix, as `orthogonalize` does. `padded`:
    all of them as one stack, each matrix turned wide and zero-padded to the largest: one
    iteration's launches instead of one per stack, for more multiply-adds (where the step waits
    on launches, as on a GPU). Exact in exact arithmetic: padding keeps each matrix's norm, and
    its zero rows and columns stay zero through every iteration (G = x x^T gains zero rows and
    columns, p(G) x keeps x's zero columns)."""
    if not padded or len(stacks) < 2 or len({(s.dtype, s.device) for s in stacks}) > 1:
        return [orthogonalize(s, steps=steps, dtype=dtype) for s in stacks]
    tall = [s.shape[1] > s.shape[2] for s in stacks]
    wide = [s.mT if t else s for s, t in zip(stacks, tall, strict=True)]
    m, n = max(w.shape[1] for w in wide), max(w.shape[2] for w in wide)
    out = orthogonalize(
        torch.cat([F.pad(w, (0, n - w.shape[2], 0, m - w.shape[1])) for w in wide]),
        steps=steps,
        dtype=dtype,
    )
    parts = out.split([len(w) for w in wide])
    cut = [p[:, : w.shape[1], : w.shape[2]] for p, w in zip(parts, wide, strict=True)]
    return [c.mT if t else c for c, t in zip(cut, tall, strict=True)]


def iteration_dtype(params: Iterable[Tensor]) -> torch.dtype:
    """bfloat16 where its matrix products are fast (a GPU, or a CPU with AVX512-BF16 or AMX),
    float32 elsewhere: the dtype of the Newton-Schulz iterations for these parameters."""
    on_gpu = any(p.device.type == "cuda" for p in params)
    return torch.bfloat16 if on_gpu or cpu_has_fast_bf16() else torch.float32


def check_momentum(momentum: float, name: str = "momentum") -> None:
    """Muon's momentum (the weight of the past in its average of the gradient) is in [0, 1)."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"{name}={momentum} must be in [0, 1), e.g. Muon's 0.95.")


def check_ns_steps(ns_steps: int, name: str = "ns_steps") -> None:
    """Newton-Schulz iterations per Muon step: a whole number, 1 or more."""
    if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or ns_steps < 1:
        raise ValueError(
            f"{name}={ns_steps!r}: expected a whole number of Newton-Schulz iterations, 1 or "
            "more (Muon's default is 5; fewer are cheaper and less exact)."
        )


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer, two rules: groups with `use_muon=True` take Muon's update, the others
    AdamW's (the same update as torch.optim.AdamW, tested). Both decay weights as AdamW does,
    by lr * weight_decay, and both follow the group's lr, so one schedule drives them. Build it
    once the parameters are on their device: that picks the iterations' dtype, and whether all
    shapes go through one padded orthogonalization (`one_stack`), by default.
    """

    def __init__(
        self,
        params: Iterable[dict[str, Any]],
        *,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        momentum: float = 0.95,
        ns_steps: int = 5,
        ns_dtype: torch.dtype | None = None,
        one_stack: bool | None = None,
        compiled: bool = False,
    ) -> None:
        check_momentum(momentum)
        check_ns_steps(ns_steps)
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            betas=betas,
            eps=eps,
            momentum=momentum,
            ns_steps=ns_steps,
            use_muon=False,
            split=1,
        )
        super().__init__(params, defaults)
        muon = [p for group in self.param_groups if group["use_muon"] for p in group["params"]]
        if bad := [tuple(p.shape) for p in muon if p.dim() < 2]:
            raise ValueError(
                f"Muon takes matrices only (a conv filter counts as one, out x in*k*k); this "
                f"group has shapes {bad}."
            )
        for group in (g for g in self.param_groups if g["use_muon"]):
            split = group["split"]
            if not (isinstance(split, int) and split >= 1):
                raise ValueError(f"split={split!r} must be a whole number >= 1 (3 for qkv).")
            if bad := [tuple(p.shape) for p in group["params"] if p.shape[0] % split]:
                raise ValueError(
                    f"split={split} cuts each matrix's rows into {split} equal blocks, and these "
                    f"shapes' rows do not divide: {bad}."
                )
        # None: bf16 where it is fast for these parameters (iteration_dtype), else float32
        self.ns_dtype = ns_dtype or iteration_dtype(muon)
        # None: on a GPU, where the step waits on launches, every shape in one padded stack
        # (orthogonalize_stacks); on a CPU, where it waits on products, one stack per shape
        self.one_stack = any(p.is_cuda for p in muon) if one_stack is None else one_stack
        # compiled: the step's arithmetic as one torch.compile graph (elementwise work fused);
        # the learning rates enter it as tensors, so a schedule's new value is no recompile
        self.compiled = compiled
        self._compiled_update: Callable[..., None] | None = None
        self._lr_tensors: list[Tensor] = []

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._init_state()  # outside the compiled graph: new state there would be a recompile
        groups = self._step_groups()
        if not self.compiled:
            self._update(groups, [group["lr"] for group in self.param_groups])
            return loss
        if len(self._lr_tensors) != len(self.param_groups):
            self._lr_tensors = [
                torch.zeros((), dtype=torch.float32, device=g["params"][0].device)
                for g in self.param_groups
            ]
        for lr, group in zip(self._lr_tensors, self.param_groups, strict=True):
            lr.fill_(group["lr"])
        if self._compiled_update is None:
            self._compiled_update = torch.compile(self._update, dynamic=False)
        self._compiled_update(groups, self._lr_tensors)
        return loss

    def _step_groups(self) -> list[dict[str, Any]]:
        """Each group as a new dict, with only the parameters that have a gradient, and their
        gradients and state: all an update reads, handed to it. A compiled update then guards
        on no .grad, which zero_grad frees each step (nor on the optimizer's own param_groups,
        whose lr dynamo would guard on; the update reads its lr from `lrs`)."""
        out = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            grads, states = [p.grad for p in params], [self.state[p] for p in params]
            out.append(group | {"params": params, "grads": grads, "states": states})
        return out

    def _update(self, groups: list[dict[str, Any]], lrs: list[float] | list[Tensor]) -> None:
        """One step of `_step_groups`'s groups at learning rates `lrs` (one per group): numbers
        in eager steps, 0-d tensors in the compiled one."""
        # foreach: one dispatch per operation for a whole group, not one per parameter (on a GPU,
        # each dispatch is a kernel launch); the same arithmetic as the per-parameter ops
        adamw: dict[tuple, tuple[float | Tensor, list, list, list]] = {}  # groups alike step as one
        for group, lr in zip(groups, lrs, strict=True):
            if not (params := group["params"]):
                continue
            if group["weight_decay"]:  # decoupled; a multiply by one would be a wasted dispatch
                torch._foreach_mul_(params, 1.0 - lr * group["weight_decay"])
            if group["use_muon"]:
                self._muon(group, lr)
            else:  # equal numbers, or the same tensor
                key = (id(lr) if isinstance(lr, Tensor) else lr, *group["betas"], group["eps"])
                _, *lists = adamw.setdefault(key, (lr, [], [], []))
                for into, part in zip(lists, ("params", "grads", "states"), strict=True):
                    into.extend(group[part])
        for (_, beta1, beta2, eps), (lr, params, grads, states) in adamw.items():
            self._adamw(params, grads, states, lr=lr, betas=(beta1, beta2), eps=eps)

    def _init_state(self) -> None:
        """The state every parameter with a gradient steps with, where it has none yet."""
        for group in self.param_groups:
            for p in (p for p in group["params"] if p.grad is not None and not self.state[p]):
                if group["use_muon"]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                else:
                    self.state[p] |= {
                        "step": torch.zeros((), dtype=torch.float32),
                        "exp_avg": torch.zeros_like(p),
                        "exp_avg_sq": torch.zeros_like(p),
                    }

    def _muon(self, group: dict[str, Any], lr: float | Tensor) -> None:
        """Each matrix's momentum and look-ahead, then one orthogonalization per shape for the
        stack of them (or one for all shapes, padded: `one_stack`): the blocks' matrices come in
        four shapes, and a batched product of four uses two cores better than four small ones
        (experiments/record/benchmarks/muon_ns.md). With
        the group's `split` > 1 each matrix's rows are cut into that many equal blocks, each
        orthogonalized (and scaled) on its own: qkv's query, key and value projections, as
        modded-nanogpt's Muon does."""
        mu, split = group["momentum"], group["split"]
        params, grads = group["params"], group["grads"]
        bufs = [state["momentum_buffer"] for state in group["states"]]
        torch._foreach_lerp_(bufs, grads, 1.0 - mu)  # an average of past gradients
        nesterovs = torch._foreach_lerp(grads, bufs, mu)  # look ahead along it (Nesterov)
        # matrices go through a few dispatches per shape, none per matrix: those of one shape as
        # one stack, and the stacks whose blocks share a shape as one orthogonalization
        by_shape: dict[tuple, list[tuple[Tensor, Tensor]]] = {}
        for p, nesterov in zip(params, nesterovs, strict=True):
            by_shape.setdefault((p.shape, p.dtype, p.device), []).append((p, nesterov))
        by_block: dict[tuple, list[list[tuple[Tensor, Tensor]]]] = {}
        for (shape, dtype, device), pairs in by_shape.items():
            block = (shape[0] // split, math.prod(shape[1:]))  # a filter: out x in*k*k
            by_block.setdefault((block, dtype, device), []).append(pairs)
        stacks = []
        for (block, _, _), runs in by_block.items():
            parts = [torch.stack([n for _, n in pairs]).reshape(-1, *block) for pairs in runs]
            stacks.append(torch.cat(parts) if len(parts) > 1 else parts[0])
        updates = orthogonalize_stacks(
            stacks, steps=group["ns_steps"], dtype=self.ns_dtype, padded=self.one_stack
        )
        for ((block, _, _), runs), update in zip(by_block.items(), updates, strict=True):
            sizes = [len(pairs) * split for pairs in runs]
            targets, deltas = [], []
            for pairs, u in zip(
                runs, update.split(sizes) if len(runs) > 1 else [update], strict=True
            ):
                targets += [p for p, _ in pairs]
                deltas += u.reshape(len(pairs), *pairs[0][0].shape).unbind()
            scale = 0.2 * math.sqrt(max(block))  # the RMS of an AdamW update
            if isinstance(lr, Tensor):
                torch._foreach_add_(targets, torch._foreach_mul(deltas, -lr * scale))
            else:
                torch._foreach_add_(targets, deltas, alpha=-lr * scale)

    def _adamw(
        self,
        params: list[Tensor],
        grads: list[Tensor],
        states: list[dict[str, Tensor]],
        *,
        lr: float | Tensor,
        betas: tuple[float, float],
        eps: float,
    ) -> None:
        """torch.optim.AdamW's update for these parameters, each step of it one foreach op."""
        beta1, beta2 = betas
        steps = [s["step"] for s in states]  # host tensors: reading them waits for no GPU
        torch._foreach_add_(steps, 1)
        exp_avgs, exp_avg_sqs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        if isinstance(lr, Tensor):  # compiled: the bias corrections as tensors, no host read
            steps = [s.to(lr.device) for s in steps]  # the counts live on the host, lr with p
            denom = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_div_(denom, [(1.0 - beta2**s).sqrt() for s in steps])
            torch._foreach_add_(denom, eps)
            ratios = torch._foreach_div(exp_avgs, denom)
            torch._foreach_mul_(ratios, [-lr / (1.0 - beta1**s) for s in steps])
            torch._foreach_add_(params, ratios)
            return
        by_step: dict[float, list[int]] = {}  # parameters stepped alike share a bias correction
        for i, step in enumerate(torch.stack(steps).tolist()):
            by_step.setdefault(step, []).append(i)
        for step, index in by_step.items():
            bias1, bias2 = 1.0 - beta1**step, 1.0 - beta2**step
            denom = torch._foreach_sqrt([exp_avg_sqs[i] for i in index])
            torch._foreach_div_(denom, math.sqrt(bias2))
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(
                [params[i] for i in index],
                [exp_avgs[i] for i in index],
                denom,
                value=-lr / bias1,
            )
