"""evaluate_loader: counts, top-k and test-time flip, with a model whose answers are known."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from vit.train.evaluation import evaluate_loader


class LeftOrRight(nn.Module):
    """Logit 0: mean of the left column; logit 1: mean of the right one. Mirroring swaps them."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))  # so that evaluate_loader finds a device

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([x[..., 0].mean((1, 2)), x[..., -1].mean((1, 2))], dim=1)


def _batches() -> list[tuple[Tensor, Tensor]]:
    images = torch.zeros(6, 3, 4, 4, dtype=torch.uint8)
    images[..., -1] = 200  # bright right column: the plain model answers 1 for every image
    return [
        (images[:4], torch.ones(4, dtype=torch.long)),
        (images[4:], torch.ones(2, dtype=torch.long)),
    ]


def test_plain_scores_match_the_model() -> None:
    result = evaluate_loader(
        LeftOrRight(), _batches(), preprocess=lambda x: x.float(), classes=["left", "right"]
    )
    assert result["num_images"] == 6 and result["top1"] == 1.0
    assert result["confusion_matrix"] == [[0, 0], [0, 6]]
    assert result["per_class"] == {"left": 0.0, "right": 1.0}


def test_flip_averages_the_mirror_image() -> None:
    # mirrored, the two logits tie and argmax takes class 0: every answer flips to wrong
    result = evaluate_loader(
        LeftOrRight(),
        _batches(),
        preprocess=lambda x: x.float(),
        classes=["left", "right"],
        flip=True,
    )
    assert result["top1"] == 0.0 and result["confusion_matrix"] == [[0, 0], [6, 0]]


def test_an_empty_loader_is_an_error() -> None:
    with pytest.raises(ValueError, match="yielded no images"):
        evaluate_loader(LeftOrRight(), [], preprocess=lambda x: x.float(), classes=["a", "b"])
