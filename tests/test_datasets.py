"""vit.data.datasets: the in-memory uint8 dataset and the collate function of its batches."""

from __future__ import annotations

import pickle
import re

import pytest
import torch

from vit.data.augment import TrainAugment
from vit.data.datasets import (
    AugmentedDataset,
    IndexDataset,
    TensorImageDataset,
    batch_seed,
    collate_batch,
)


def test_collate_batch_passes_batches_and_collates_samples() -> None:
    data = TensorImageDataset(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.arange(4))
    batch = data.__getitems__([3, 1])
    assert collate_batch(batch) is batch and batch[1].tolist() == [3, 1]
    images, labels = collate_batch([data[0], data[2]])
    assert images.shape == (2, 3, 2, 2) and labels.tolist() == [0, 2]
    assert pickle.loads(pickle.dumps(collate_batch)) is collate_batch
    with pytest.raises(ValueError, match=r"images must be uint8 \(N, C, H, W\), got torch.float32"):
        TensorImageDataset(torch.zeros(4, 3, 2, 2), torch.arange(4))


def test_collate_batch_passes_only_an_images_and_labels_pair() -> None:
    images, labels = torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.arange(2)
    # two samples that are 1-D tensors are stacked, as default_collate does
    pair = (torch.tensor([1, 2]), torch.tensor([3, 4]))
    assert torch.equal(collate_batch(pair), torch.tensor([[1, 2], [3, 4]]))
    # a triple is three samples to default_collate, which cannot stack their shapes
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        collate_batch((images, labels, labels.float()))


def test_tensor_image_dataset_gathers_any_batch_and_checks_labels() -> None:
    data = TensorImageDataset(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.arange(4))
    images, labels = data.__getitems__([])  # an empty batch is empty, not an error
    assert images.shape == (0, 3, 2, 2) and labels.shape == (0,)
    message = "labels must be shaped (4,) like the images, got (3,)."
    with pytest.raises(ValueError, match=re.escape(message)):
        TensorImageDataset(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.arange(3))


def test_index_dataset_item_is_its_batch_of_one_and_batches_stay_int64() -> None:
    data = IndexDataset(5)
    for i in range(5):
        item = data[i]
        assert item.dtype == torch.long and item.dim() == 0
        assert torch.equal(item, data.__getitems__([i])[0])
    assert torch.equal(data.__getitems__([4, 0, 2]), torch.tensor([4, 0, 2]))
    # even an empty batch is an int64 index tensor, which collate_batch passes through
    empty = data.__getitems__([])
    assert empty.dtype == torch.long and collate_batch(empty) is empty


def test_augmented_dataset_item_is_its_batch_of_one() -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(1, 256, (4, 3, 8, 8), dtype=torch.uint8, generator=g)
    data = AugmentedDataset(TensorImageDataset(images, torch.arange(4)), TrainAugment(), seed=3)
    for i in range(4):
        image, label = data[i]
        batch_images, batch_labels = data.__getitems__([i])
        assert torch.equal(image, batch_images[0]) and int(label) == i == int(batch_labels[0])


def test_batch_seed_is_a_recorded_63_bit_hash_of_the_batch_and_seed() -> None:
    # recorded from this code: a batch must draw alike in any process, machine or Python version
    assert batch_seed([3, 1, 4], 0) == 2338638295757447973
    assert batch_seed([3, 1, 4], 1) == 3388506653488169669
    seeds = [batch_seed([i, i + 1], 7) for i in range(200)]
    # torch.Generator.manual_seed takes them, and they use the whole 63-bit range
    assert all(0 <= s < 2**63 for s in seeds) and max(seeds) >= 2**62
