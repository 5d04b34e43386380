"""The sharding, padding and resume logic shared by the samplers.

Every sampler here describes one *global stream* per epoch: position ``p`` holds dataset index
``lookup(p)``. Rank ``r`` of ``R`` takes positions ``start + r, start + r + R, ...`` exactly as
torch's ``DistributedSampler`` does with ``indices[rank:total_size:num_replicas]``. Because of
this striding, after ``s`` steps of ``B`` samples on every rank the ranks together have consumed
exactly the contiguous positions ``[start, start + s*B*R)``: one integer describes the progress
of the whole world, which is why a checkpoint taken on ``R`` ranks resumes on any other ``R'``,
and why the global batch ``s`` is the same set of positions for every ``R`` with ``B*R`` fixed.

Padding (``drop_last=False``) and dropping (``drop_last=True``) are torch's, applied to the
*remaining* part ``[start, n)`` of the epoch: with ``m = n - start`` real positions left, each
rank yields ``ceil(m / R)`` indices (``m // R`` with ``drop_last``), and the ``ceil(m/R)*R - m``
padding positions repeat the first remaining positions (``start, start + 1, ...``, wrapping if
needed). With ``start = 0`` this is torch's padding exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from trainer.sampling.permutation import IntArray
from trainer.sampling.world import check_chunk, resolve_world

DEFAULT_CHUNK = 65536
"""Indices computed per numpy step: ~2-5 ms and ~2 MiB of temporaries at 6 Feistel rounds."""

_FIRST_CHUNK = 256
"""The first chunk of an epoch is small so the first index arrives in well under 10 ms."""


class StridedSampler(Sampler[int]):
    """Base class: rank-strided view of a global stream, with padding, resume and chunking.

    Subclasses set :attr:`wrap_padding` and implement :meth:`_stream_size`, :meth:`_lookup`
    and :meth:`_identity`.
    """

    required_identity: tuple[str, ...] = ("num_samples",)
    """Identity fields a loaded state must carry; the others are checked when present."""

    wrap_padding = True
    """Padding positions repeat the first remaining ones (torch). A sampler whose stream is
    infinite (weighted draws) sets False and looks padding positions up like any other."""

    def __init__(self, num_replicas: int | None, rank: int | None, drop_last: bool) -> None:
        self.num_replicas, self.rank = resolve_world(num_replicas, rank)
        self.drop_last = drop_last
        self.epoch = 0
        self._start = 0
        # (epoch, position) from load_state_dict, kept until that epoch's iteration completes.
        self._resume: tuple[int, int] | None = None
        # What the current iteration has handed out, for state_dict() without `consumed`:
        # indices of finished chunks, plus the list iterator of the chunk being consumed.
        self._yielded_before = 0
        self._current: tuple[int, Iterator[int]] | None = None

    # -- hooks -----------------------------------------------------------------------------
    def _stream_size(self) -> int:
        """Real positions in one epoch (``len(dataset)`` for the shuffle sampler)."""
        raise NotImplementedError

    def _lookup(self, positions: IntArray) -> IntArray:
        """Dataset indices at global ``positions`` of the current epoch."""
        raise NotImplementedError

    def _identity(self) -> dict[str, int]:
        """State fields that must match between a checkpoint and this sampler."""
        raise NotImplementedError

    # -- size --------------------------------------------------------------------------------
    @property
    def start_position(self) -> int:
        """The global position this epoch's iteration starts at (0, or a loaded position)."""
        return self._start

    @property
    def num_samples(self) -> int:
        """Indices this rank yields in the current (possibly resumed) epoch; as torch's."""
        remaining = self._stream_size() - self._start
        if self.drop_last:
            return remaining // self.num_replicas
        return math.ceil(remaining / self.num_replicas)

    @property
    def total_size(self) -> int:
        """Positions the whole world consumes this epoch (``num_samples * num_replicas``)."""
        return self.num_samples * self.num_replicas

    def __len__(self) -> int:
        return self.num_samples

    # -- epochs and resume -----------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; starts at position 0 unless a loaded state is for this epoch."""
        self.epoch = epoch
        self._yielded_before, self._current = 0, None
        if self._resume is not None and self._resume[0] == epoch:
            self._start = self._resume[1]
        else:
            self._start = 0

    @property
    def yielded(self) -> int:
        """Indices this rank's current iteration has handed out (``__iter__``: exactly;
        ``iter_chunks``: whole chunks)."""
        if self._current is None:
            return self._yielded_before
        size, it = self._current
        remaining: int = it.__length_hint__()  # type: ignore[attr-defined]
        return self._yielded_before + size - remaining

    def state_dict(self, consumed: int | None = None) -> dict[str, int]:
        """The resumable state after ``consumed`` global positions of this epoch were trained.

        ``consumed`` counts from the start of the epoch (not from :attr:`start_position`), e.g.
        ``start_position + steps_done * batch_size * num_replicas``. Without it, the state is
        what the iterator has yielded on this rank: ``start_position + yielded x
        num_replicas``, which assumes the ranks advance in lockstep (as DDP forces them to)
        and that everything yielded was trained — pass ``consumed`` when a DataLoader
        prefetches ahead of training (the trainer does). Values past the real end (padding)
        are clamped; once every position this iteration yields is consumed, the state says
        ``position == num_samples`` (the epoch is complete, a ``drop_last`` tail included).
        """
        size = self._stream_size()
        if consumed is None:
            consumed = self._start + self.yielded * self.num_replicas
        if consumed < self._start:
            raise ValueError(
                f"consumed={consumed} is before this epoch's start position {self._start} "
                "(fix: count consumed from the start of the epoch: start_position + "
                "steps_done * batch_size * num_replicas)"
            )
        end = min(self._start + self.total_size, size)
        position = size if consumed >= end else consumed
        state = dict(self._identity())
        state.update(epoch=self.epoch, position=position, num_replicas=self.num_replicas)
        return state

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from :meth:`state_dict` output, possibly saved on another world size.

        Sets :attr:`epoch` to the saved epoch and :attr:`start_position` to the saved position;
        a later :meth:`set_epoch` with the same epoch keeps it, any other epoch starts at 0.
        Raises ValueError when the dataset size, seed or other identity fields differ.
        """
        for key in ("epoch", "position", *self.required_identity):
            if key not in state:
                raise ValueError(
                    f"sampler state lacks {key!r} (fix: pass the dict from state_dict())"
                )
        for key, mine in self._identity().items():
            if key in state and int(state[key]) != mine:
                raise ValueError(
                    f"sampler state has {key}={state[key]} but this sampler has {key}={mine} "
                    "(fix: resume with the same dataset, split and seed as the checkpoint, "
                    "or start a fresh run without it)"
                )
        position = int(state["position"])
        if not 0 <= position <= self._stream_size():
            raise ValueError(
                f"sampler state position {position} is outside [0, {self._stream_size()}] "
                "(fix: the checkpoint is corrupt or from another dataset; start fresh)"
            )
        self._resume = (int(state["epoch"]), position)
        self.set_epoch(int(state["epoch"]))

    # -- iteration ------------------------------------------------------------------------------
    def _positions(self, first: int, count: int) -> IntArray:
        """Global positions of this rank's stream entries ``first .. first + count - 1``."""
        offsets = (np.arange(first, first + count, dtype=np.int64) * self.num_replicas) + self.rank
        positions = offsets + self._start
        if self.wrap_padding:
            size = self._stream_size()
            padded = positions >= size
            if padded.any():
                # torch pads with the head of the (remaining) order, repeating it if needed.
                positions[padded] = self._start + offsets[padded] % (size - self._start)
        return positions

    def iter_chunks(self, chunk: int = DEFAULT_CHUNK) -> Iterator[IntArray]:
        """This rank's indices as int64 arrays of at most ``chunk``, in :meth:`__iter__` order."""
        check_chunk(chunk)
        total = self.num_samples
        first = 0
        step = min(chunk, _FIRST_CHUNK)
        self._yielded_before, self._current = 0, None
        while first < total:
            count = min(step, total - first)
            values = self._lookup(self._positions(first, count))
            self._yielded_before = first + count
            yield values
            first += count
            step = min(chunk, step * 2)
        if self._resume is not None and self._resume[0] == self.epoch:
            self._resume = None  # the resumed epoch is done; set_epoch(same) starts at 0 again

    def __iter__(self) -> Iterator[int]:
        done = 0
        for chunk in self.iter_chunks():
            values: list[int] = chunk.tolist()
            # state_dict() reads the position inside the chunk from the list iterator, so
            # counting costs nothing per index.
            it = iter(values)
            self._yielded_before, self._current = done, (len(values), it)
            yield from it
            done += len(values)
        self._yielded_before, self._current = done, None
