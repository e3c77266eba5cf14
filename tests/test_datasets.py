"""vit.data.datasets: the in-memory uint8 dataset and the collate function of its batches."""

from __future__ import annotations

import pickle

import pytest
import torch

from vit.data.datasets import TensorImageDataset, collate_batch


def test_collate_batch_passes_batches_and_collates_samples() -> None:
    data = TensorImageDataset(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.arange(4))
    batch = data.__getitems__([3, 1])
    assert collate_batch(batch) is batch and batch[1].tolist() == [3, 1]
    images, labels = collate_batch([data[0], data[2]])
    assert images.shape == (2, 3, 2, 2) and labels.tolist() == [0, 2]
    assert pickle.loads(pickle.dumps(collate_batch)) is collate_batch
    with pytest.raises(ValueError, match=r"images must be uint8 \(N, C, H, W\), got torch.float32"):
        TensorImageDataset(torch.zeros(4, 3, 2, 2), torch.arange(4))
