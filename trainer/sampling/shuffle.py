"""``DistributedShuffleSampler``: torch's ``DistributedSampler`` without the full index list."""

from __future__ import annotations

from collections.abc import Sized

from trainer.sampling.permutation import IntArray, Permutation, epoch_permutation
from trainer.sampling.stream import StridedSampler
from trainer.sampling.world import dataset_size


class DistributedShuffleSampler(StridedSampler):
    """A drop-in for ``torch.utils.data.distributed.DistributedSampler`` that scales to 10^9.

    ``dataset`` is any ``Sized`` (``range(10**9)`` works) or an int size. ``num_replicas`` and
    ``rank`` default to torch.distributed's group when it is initialised, else to 1 and 0.

    Order: position ``p`` of epoch ``e`` holds ``perm_{seed,e}(p)``, a bijection of
    ``range(n)`` evaluated on the fly (a Feistel cipher; ``torch.randperm`` seeded like torch
    below 2^16 samples, so small datasets get torch's exact order). Rank ``r`` of ``R`` takes
    positions ``r, r+R, r+2R, ...``, padded or truncated exactly as torch does
    (``drop_last``), so the indices equal torch's sampler's whenever the order does.

    Resume: ``state_dict(consumed)`` -> ``{"seed", "epoch", "position", "num_samples" (=
    len(dataset)), "shuffle", "num_replicas"}``; ``load_state_dict`` on any world size ``R'``
    continues at ``position``: the remaining positions ``[position, n)`` are split
    ``position + r, position + r + R', ...``, so across the old and the new ranks every real
    position of the epoch is trained exactly once. Padding on resume repeats the first
    remaining positions (``position, position + 1, ...``) to make the ``n - position``
    remaining positions a multiple of ``R'``; ``drop_last=True`` drops the last
    ``(n - position) % R'`` instead, as torch drops its tail.

    Note on names: torch's per-rank attribute ``num_samples`` (this rank's count) keeps its
    meaning here; the *state dict's* ``"num_samples"`` is ``len(dataset)``.
    """

    required_identity = ("seed", "num_samples")

    def __init__(
        self,
        dataset: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(num_replicas, rank, drop_last)
        self.dataset_size = dataset_size(dataset)
        self.shuffle = shuffle
        self.seed = seed
        self._perm: Permutation | None = None
        self._perm_epoch = -1

    def _stream_size(self) -> int:
        return self.dataset_size

    def _identity(self) -> dict[str, int]:
        return {"seed": self.seed, "num_samples": self.dataset_size, "shuffle": int(self.shuffle)}

    def permutation(self) -> Permutation:
        """The current epoch's order of ``range(len(dataset))`` (built once per epoch, O(1)
        memory above 2^16 samples)."""
        if self._perm is None or self._perm_epoch != self.epoch:
            self._perm = epoch_permutation(self.dataset_size, self.seed, self.epoch, self.shuffle)
            self._perm_epoch = self.epoch
        return self._perm

    def _lookup(self, positions: IntArray) -> IntArray:
        return self.permutation()(positions)
