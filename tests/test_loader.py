"""ResumableDataLoader: order is a function of (seed, epoch); a restored loader serves the rest."""

from __future__ import annotations

import torch

from vit.data.datasets import TensorImageDataset, collate_batch
from vit.data.loader import EpochSampler, ResumableDataLoader


def _data(n: int = 40) -> TensorImageDataset:
    return TensorImageDataset(torch.zeros(n, 3, 2, 2, dtype=torch.uint8), torch.arange(n))


def _labels(loader, limit: int | None = None) -> list[list[int]]:
    """Labels of the batches a training loop takes (and counts as trained on), up to `limit`."""
    out = []
    for _, labels in loader:  # fetching is not training: a prefetched batch is not counted
        if limit is not None and len(out) == limit:
            break
        loader.count_consumed()
        out.append(labels.tolist())
    return out


def test_order_depends_on_seed_and_epoch_only() -> None:
    a, b, c = EpochSampler(50, seed=1), EpochSampler(50, seed=1), EpochSampler(50, seed=2)
    assert list(a) == list(b) != list(c)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(a) == list(range(50))
    a.set_epoch(0)
    assert list(a) == first


def test_restored_loader_continues_with_the_next_batch() -> None:
    loader = ResumableDataLoader(
        _data(), batch_size=8, seed=3, drop_last=True, collate_fn=collate_batch
    )
    loader.epoch_sampler.set_epoch(2)
    full = _labels(loader)
    assert len(full) == 5 and sorted(sum(full, [])) == list(range(40))

    _labels(loader, limit=2)  # a crash after two batches...
    state = loader.state_dict()
    assert state == {"epoch": 2, "consumed": 2}

    fresh = ResumableDataLoader(
        _data(), batch_size=8, seed=3, drop_last=True, collate_fn=collate_batch
    )
    fresh.load_state_dict(state)
    assert _labels(fresh) == full[2:]  # ...resumes at batch 3, not at the start of the epoch
    assert fresh.state_dict() == {"epoch": 2, "consumed": 5}
    fresh.epoch_sampler.set_epoch(3)
    assert len(_labels(fresh)) == 5  # the next epoch is whole again


def test_state_of_a_finished_epoch_does_not_skip_the_next() -> None:
    loader = ResumableDataLoader(_data(), batch_size=8, seed=0, collate_fn=collate_batch)
    loader.load_state_dict({"epoch": 0, "consumed": 5})
    loader.epoch_sampler.set_epoch(1)
    assert len(_labels(loader)) == 5
