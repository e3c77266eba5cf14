"""Attention extraction, rollout (hand-computed), head fusion, discard ratio, gradient rollout pairing."""

from __future__ import annotations

import re

import pytest
import torch

from tests.helpers import REPO, TINY, forward_sums, sum_tol
from vit.maps.capture import attention_maps, fuse_heads, query_map
from vit.maps.rollout import discard_lowest, grad_rollout, roll_out, rollout, rollout_map
from vit.model.vision_transformer import VisionTransformer

F32 = torch.float32


@pytest.mark.parametrize("kernel", ["explicit", "fused"])
@pytest.mark.parametrize(("img_size", "patch_size"), [(32, 2), (32, 4), (32, 8), (48, 4), (48, 8)])
def test_extraction_shapes_rows_and_logits(kernel: str, img_size: int, patch_size: int) -> None:
    torch.manual_seed(0)
    cfg = {**TINY, "img_size": img_size, "patch_size": patch_size, "kernel": kernel}
    model = VisionTransformer(**cfg).eval()
    x = torch.randn(3, 3, img_size, img_size)
    with torch.inference_mode():
        logits, maps = attention_maps(model, x)
        expected = model(x)
    n = 1 + (img_size // patch_size) ** 2
    # the explicit path against the kernel's, the last block's CLS row alone: every sum's order
    tol = sum_tol(F32, forward_sums(model), max(1.0, expected.abs().max()))
    torch.testing.assert_close(logits, expected, rtol=0, atol=tol)
    assert len(maps) == TINY["depth"]
    for w in maps:
        assert w.shape == (3, TINY["num_heads"], n, n)
        assert torch.all(w >= 0)
        ones = torch.ones(3, TINY["num_heads"], n)
        torch.testing.assert_close(w.sum(-1), ones, rtol=0, atol=sum_tol(F32, 2 * n))  # softmax


def test_extraction_refuses_a_model_without_it() -> None:
    message = (
        "Linear has no forward_with_attention(); pass a vit.model.VisionTransformer "
        "(vit.io.load.load_model reads one from a checkpoint)."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        attention_maps(torch.nn.Linear(2, 2), torch.randn(1, 2))


def test_rollout_two_layer_hand_computed() -> None:
    # W1 + I = [[1.5, .5], [.2, 1.8]] -> rows / 2 = [[.75, .25], [.1, .9]]
    # W2 + I = [[2, 0], [.6, 1.4]]    -> rows / 2 = [[1, 0], [.3, .7]]
    # joint = A2 @ A1 = [[.75, .25], [.3*.75 + .7*.1, .3*.25 + .7*.9]] = [[.75, .25], [.295, .705]]
    w1 = torch.tensor([[0.5, 0.5], [0.2, 0.8]])[None, None]  # (B=1, H=1, 2, 2)
    w2 = torch.tensor([[1.0, 0.0], [0.6, 0.4]])[None, None]
    joint = rollout([w1, w2])
    # float32 decimals: per layer the identity, a row sum of 2 and a product of 2, values <= 1
    tol = sum_tol(F32, 2 * 3)
    torch.testing.assert_close(
        joint[0], torch.tensor([[0.75, 0.25], [0.295, 0.705]]), rtol=0, atol=tol
    )
    one_layer = rollout([w1, w2], start_layer=1)[0]
    torch.testing.assert_close(one_layer, torch.tensor([[1.0, 0], [0.3, 0.7]]), rtol=0, atol=tol)


def test_rollout_discard_spares_the_prefix_tokens_hand_computed() -> None:
    # CLS + 2 patches, ratio 0.5: of the 4 patch-to-patch weights the lowest two (.3, .2) go
    # W' + I = [[1.2, .3, .5], [.1, 1.6, 0], [.4, .4, 1]], rows / (2, 1.7, 1.8)
    w = torch.tensor([[0.2, 0.3, 0.5], [0.1, 0.6, 0.3], [0.4, 0.4, 0.2]])[None, None]
    expected = torch.tensor([[0.6, 0.15, 0.25], [1 / 17, 16 / 17, 0], [2 / 9, 2 / 9, 5 / 9]])
    tol = sum_tol(F32, 2 * 3)  # float32 decimals: the identity, a row sum of 3, the division
    rolled = rollout([w], discard_ratio=0.5)[0]  # one prefix by default
    torch.testing.assert_close(rolled, expected, rtol=0, atol=tol)
    # no prefix (mean pooling): all 4 weights are candidates, .1 and .3 go
    # W' + I = [[1, .9], [0, 1.7]], rows / (1.9, 1.7)
    w = torch.tensor([[0.1, 0.9], [0.3, 0.7]])[None, None]
    joint = rollout([w], discard_ratio=0.5, num_prefix_tokens=0)
    expected = torch.tensor([[1 / 1.9, 0.9 / 1.9], [0.0, 1.0]])
    torch.testing.assert_close(joint[0], expected, rtol=0, atol=tol)
    # the map: mean over the query rows, (1 / 3.8, 2.8 / 3.8), scaled to max 1
    m = rollout_map([w], grid=(1, 2), num_prefix_tokens=0, discard_ratio=0.5)
    # and a mean of 2 rows and the division by the largest: two roundings more
    torch.testing.assert_close(
        m, torch.tensor([[[1 / 2.8, 1.0]]]), rtol=0, atol=tol + sum_tol(F32, 2)
    )


@pytest.mark.parametrize("ratio", [0.0, 0.5], ids=["keep_all", "discard_half"])
def test_rollout_of_an_empty_batch_is_empty(ratio: float) -> None:
    assert rollout([torch.rand(0, 2, 5, 5)], discard_ratio=ratio).shape == (0, 5, 5)


@pytest.mark.parametrize(
    ("dtype", "device"), [(torch.bfloat16, "cpu"), (torch.float32, "meta")], ids=["bf16", "meta"]
)
def test_roll_out_keeps_the_maps_dtype_and_device(dtype: torch.dtype, device: str) -> None:
    # the meta device stands in for an accelerator: the identity must be made where the maps are
    layers = [torch.rand(2, 5, 5, dtype=dtype, device=device) for _ in range(2)]
    joint = roll_out(layers)
    assert joint.dtype == dtype and joint.device.type == device and joint.shape == (2, 5, 5)


def test_rollout_rows_sum_to_one_and_batches_are_independent() -> None:
    torch.manual_seed(0)
    maps = [torch.randn(4, 3, 17, 17).softmax(-1) for _ in range(3)]
    joint = rollout(maps, discard_ratio=0.5)
    # 3 layers of a row sum and a product of 17 terms each, then this sum of 17: values <= 1
    k = 3 * 2 * 17 + 17
    torch.testing.assert_close(joint.sum(-1), torch.ones(4, 17), rtol=0, atol=sum_tol(F32, k))
    alone = rollout([m[2:3] for m in maps], discard_ratio=0.5)
    # one sample: the batched products may take another kernel
    torch.testing.assert_close(joint[2:3], alone, rtol=0, atol=sum_tol(F32, 3 * 2 * 17))
    assert rollout_map(maps, grid=(4, 4)).shape == (4, 4, 4)
    # the largest divided by itself: exactly 1
    assert torch.equal(rollout_map(maps, grid=(4, 4)).flatten(1).amax(1), torch.ones(4))


def test_head_fusion_modes() -> None:
    w = torch.tensor([[[[0.2, 0.8], [0.5, 0.5]], [[0.6, 0.4], [0.1, 0.9]]]])  # (1, 2 heads, 2, 2)
    mean = torch.tensor([[[0.4, 0.6], [0.3, 0.7]]])  # float32 decimals: a sum and a halving
    torch.testing.assert_close(fuse_heads(w), mean, rtol=0, atol=sum_tol(F32, 2))
    assert torch.equal(fuse_heads(w, "mean"), fuse_heads(w))
    assert torch.equal(fuse_heads(w, "max"), torch.tensor([[[0.6, 0.8], [0.5, 0.9]]]))  # picked
    assert torch.equal(fuse_heads(w, "min"), torch.tensor([[[0.2, 0.4], [0.1, 0.5]]]))
    with pytest.raises(ValueError, match="head_fusion='median'"):
        fuse_heads(w, "median")  # type: ignore[arg-type]
    # rollout fuses the heads as asked: max gives the rollout of the max-fused map
    for mode in ("max", "min"):
        fused = rollout([fuse_heads(w, mode)[:, None]])
        assert torch.equal(rollout([w], head_fusion=mode), fused)  # the same ops, a 1-head mean
        assert not torch.allclose(rollout([w]), fused)


def test_discard_ratio_never_touches_cls_entries() -> None:
    torch.manual_seed(0)
    a = torch.rand(2, 5, 5) + 1.0
    a[:, 0, :] = 0.01  # the CLS row and column hold the smallest weights of all
    a[:, :, 0] = 0.01
    out = discard_lowest(a, 0.5)
    assert torch.equal(out[:, 0, :], a[:, 0, :]) and torch.equal(out[:, :, 0], a[:, :, 0])
    assert ((out[:, 1:, 1:] == 0).flatten(1).sum(1) == 8).all()  # half of the 16 patch entries
    kept = out[:, 1:, 1:][out[:, 1:, 1:] > 0].reshape(2, 8)
    dropped = a[:, 1:, 1:][out[:, 1:, 1:] == 0].reshape(2, 8)
    assert (kept.amin(1) >= dropped.amax(1)).all()  # the lowest were the ones dropped
    one = discard_lowest(a, 1 / 16)  # a ratio that drops exactly one patch entry
    zeroed = (one[:, 1:, 1:] == 0).flatten(1)
    assert (zeroed.sum(1) == 1).all()
    assert torch.equal(zeroed.int().argmax(1), a[:, 1:, 1:].flatten(1).argmin(1))  # the lowest
    with pytest.raises(ValueError, match="discard_ratio=1.0"):
        discard_lowest(a, 1.0)


def test_start_layer_bounds() -> None:
    maps = [torch.rand(1, 1, 3, 3).softmax(-1)] * 2
    with pytest.raises(ValueError, match="start_layer=2"):
        rollout(maps, start_layer=2)


def test_query_map_takes_a_non_square_grid_and_names_a_wrong_one() -> None:
    w = torch.rand(1, 2, 7, 7)  # (B, H, CLS + 6 patches, same)
    assert torch.equal(query_map(w, grid=(2, 3)), w[:, :, 0, 1:].reshape(1, 2, 2, 3))
    message = "weights have 6 patch keys, grid (3, 4) needs 12."
    with pytest.raises(ValueError, match=re.escape(message)):
        query_map(w, grid=(3, 4))
    # a mean-pooled model's maps read with the CLS default: the message names the fix
    with pytest.raises(
        ValueError, match=re.escape("pass the model's own (model.num_prefix_tokens")
    ):
        query_map(torch.rand(1, 2, 6, 6), grid=(2, 3))


def test_query_map_for_cls_and_for_mean_pooling() -> None:
    w = torch.arange(2 * 5 * 5, dtype=torch.float).reshape(2, 5, 5)
    assert torch.equal(query_map(w, grid=(2, 2)), w[:, 0, 1:].reshape(2, 2, 2))
    no_cls = torch.arange(2 * 4 * 4, dtype=torch.float).reshape(2, 4, 4)
    assert torch.equal(
        query_map(no_cls, grid=(2, 2), num_prefix_tokens=0), no_cls.mean(dim=1).reshape(2, 2, 2)
    )


def test_mean_pool_model_maps() -> None:
    model = VisionTransformer(**{**TINY, "class_token": False, "global_pool": "avg"}).eval()
    _, maps = attention_maps(model, torch.randn(2, 3, 32, 32))
    assert maps[0].shape == (2, 2, 16, 16)
    assert rollout_map(maps, grid=(4, 4), num_prefix_tokens=0).shape == (2, 4, 4)


def test_grad_rollout_pairs_each_layer_with_its_own_gradient() -> None:
    """With layer 1's attention output zeroed, its weights cannot affect the logits: its gradient
    is zero, so the right answer is layer 0's grad-weighted map alone. Pairing layer 0's weights
    with layer 1's (zero) gradient, or the reverse, gives a different map."""
    torch.manual_seed(0)
    model = VisionTransformer(**TINY).eval()
    with torch.no_grad():
        model.blocks[1].attn.proj.weight.zero_()
    x = torch.randn(2, 3, 32, 32)
    logits, cam_map = grad_rollout(model, x, target=3)

    x_req = x.clone()
    logits_ref, maps = model.forward_with_attention(x_req)
    grads = torch.autograd.grad(logits_ref[:, 3].sum(), maps)
    assert grads[1].abs().max() == 0 and grads[0].abs().max() > 0
    cam0 = (maps[0] * grads[0].clamp(min=0)).mean(1).detach()
    expected = query_map(roll_out([cam0]), grid=(4, 4))
    expected = expected / expected.flatten(1).amax(1)[:, None, None]
    # the same forward and backward; layer 1's zero map rolls out to I, and I @ joint is exact
    assert torch.equal(cam_map, expected)
    assert torch.equal(logits, logits_ref.detach())
    # it also works when called under inference_mode (it enables gradients itself)
    with torch.inference_mode():
        _, again = grad_rollout(model, x, target=3)
    assert torch.equal(again, cam_map)  # the same computation again


def test_grad_rollout_defaults_to_each_images_predicted_class() -> None:
    torch.manual_seed(0)
    model = VisionTransformer(**TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    logits, default = grad_rollout(model, x)
    predicted = logits.argmax(-1)
    assert predicted[0] != predicted[1]  # so one class for the whole batch would be wrong
    _, by_class = grad_rollout(model, x, target=predicted)
    assert torch.equal(default, by_class)  # the same targets: the same computation
    _, other = grad_rollout(model, x, target=(predicted + 1) % TINY["num_classes"])
    assert not torch.allclose(other, default, atol=1e-3)  # the target is used when given


def test_attention_maps_are_plain_tensors_unless_grad_is_asked() -> None:
    """What a user draws (plt.imshow(heat[0]), .numpy()) must not need a .detach() first; the
    graph is kept only when asked for, as gradient rollout asks."""
    torch.manual_seed(0)
    model = VisionTransformer(**TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    logits, maps = attention_maps(model, x)
    assert not logits.requires_grad and not any(w.requires_grad for w in maps)
    assert rollout_map(maps, grid=(4, 4))[0].numpy().shape == (4, 4)
    logits, maps = attention_maps(model, x, grad=True)
    assert logits.requires_grad and all(w.requires_grad for w in maps)
    assert torch.autograd.grad(logits[:, 0].sum(), maps[0])[0].shape == maps[0].shape


def readme_attention_snippet() -> str:
    """The Python block of the README's section "Look inside: attention maps"."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Look inside: attention maps", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("kind", ["cls", "mean_pooled", "shipped"])
def test_the_readmes_attention_snippet_runs(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's calls, as written, on a CLS model, a mean-pooled one (no CLS token: its
    rollout is read from the patch rows' mean) and the shipped weights (mean-pooled too)."""
    import vit

    if kind != "shipped":  # the README's load_model, given a small model of its 8x8 grid
        torch.manual_seed(0)
        pooling = {"cls": {}, "mean_pooled": {"class_token": False, "global_pool": "avg"}}[kind]
        small = VisionTransformer(**{**TINY, "patch_size": 4, **pooling}).eval()
        monkeypatch.setattr(vit, "load_model", lambda *args, **kwargs: (small, {}))
    images = torch.randn(2, 3, 32, 32)
    scope = {"images": images}
    exec(readme_attention_snippet(), scope)  # the README as written, not a copy of it
    model, heat, cam = scope["model"], scope["heat"], scope["cam"]
    assert model.num_prefix_tokens == (1 if kind == "cls" else 0)
    maps = attention_maps(model, images)[1]
    expected = rollout_map(maps, grid=(8, 8), num_prefix_tokens=model.num_prefix_tokens)
    assert torch.equal(heat, expected)  # the same calls on the same maps
    assert heat.numpy().shape == (2, 8, 8)  # plain tensors: ready to draw
    assert cam.shape == (2, 8, 8)
