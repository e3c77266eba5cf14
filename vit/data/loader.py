"""A training DataLoader that resumes mid-epoch: the order is a function of (seed, epoch), and the
number of batches already served is saved in checkpoints, so a resumed run continues with the
next batch instead of the start of the epoch. Torch only.

Lightning saves `state_dict()` of a train loader that has one into each checkpoint and calls
`load_state_dict()` on resume; it calls the sampler's `set_epoch` at the start of every epoch.
Under DDP each rank reads its own strided share of the same permutation. The sampler subclasses
DistributedSampler for that reason, so that Lightning does not wrap it in another one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def _rank_and_world() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class EpochSampler(DistributedSampler):
    """Indices in the order randperm(n, seed=(seed, epoch)), this rank's share; after a resume,
    the first pass over the resumed epoch skips the items already trained on.

    The order is drawn when the first index is pulled, not when iter() is called: Lightning
    creates the iterator before it calls set_epoch, so only then is the epoch known.
    """

    def __init__(self, num_items: int, *, seed: int = 0) -> None:
        # no super().__init__(): it would need a process group; the rank is read per epoch
        self.num_items, self.seed = num_items, seed
        self.epoch = 0
        self.resume: tuple[int, int] | None = None  # (epoch, items to skip) from a checkpoint
        self.skipped = 0  # items skipped at the start of the current pass
        self.taken = 0  # batches of the current pass counted as trained on

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> torch.Tensor:
        """This rank's full order for the current epoch (the same on every call)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        perm = torch.randperm(self.num_items, generator=g)
        rank, world = _rank_and_world()
        usable = (self.num_items // world) * world  # equal shares: every rank steps together
        return perm[:usable][rank::world]

    def __iter__(self) -> Iterator[int]:
        resume, self.resume = self.resume, None
        self.skipped = resume[1] if resume is not None and resume[0] == self.epoch else 0
        self.taken = 0
        yield from self.order()[self.skipped :].tolist()

    def __len__(self) -> int:
        return self.num_items // _rank_and_world()[1]


class ResumableDataLoader(DataLoader):
    """DataLoader over an EpochSampler that remembers how many batches of the epoch were trained on.

    The trainer prefetches a batch ahead, so batches *served* overcount; the training side calls
    `count_consumed()` once per batch it uses (the DataModule does, in on_after_batch_transfer).
    """

    def __init__(self, dataset: Dataset, *, batch_size: int, seed: int = 0, **kwargs: Any) -> None:
        self.epoch_sampler = EpochSampler(len(dataset), seed=seed)
        # its own generator, so that iterating never draws from the global RNG (worker seeds)
        generator = torch.Generator().manual_seed(seed)
        super().__init__(
            dataset,
            batch_size=batch_size,
            sampler=self.epoch_sampler,
            generator=generator,
            **kwargs,
        )

    @property
    def consumed(self) -> int:
        """Batches of the current epoch trained on, counting those skipped on resume."""
        return self.epoch_sampler.skipped // self.batch_size + self.epoch_sampler.taken

    def count_consumed(self) -> None:
        self.epoch_sampler.taken += 1

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch_sampler.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Skip, in the next pass over `epoch`, the batches already trained on (none if complete)."""
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        self.epoch_sampler.set_epoch(epoch)
        if consumed < len(self):
            self.epoch_sampler.resume = (epoch, consumed * self.batch_size)
