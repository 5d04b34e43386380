"""What one log interval of the loop accumulates, and rank 0's per-step loss file."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch

from trainer.components.steps import Tally, counts_vector
from trainer.errors import OutputError

log = logging.getLogger(__name__)


class ForwardClock:
    """Seconds this rank spends in the step function (forward and loss): its own compute,
    with neither the data wait nor the gradients' all-reduce in it. DDP synchronises every
    step, so a slow rank's step time equals its peers' (they wait for it in the all-reduce);
    this is where it differs (docs/metrics.md, DDPTrainerStragglerRank). On CUDA the host
    returns before the kernels run, so it is timed by events on the current stream, read
    after the interval's sync."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host = 0.0
        self._started = 0.0
        self._events: list[torch.cuda.Event] = []

    def start(self) -> None:
        if self.cuda:
            self._record()
        else:
            self._started = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self._record()
        else:
            self.host += time.perf_counter() - self._started

    def _record(self) -> None:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        self._events.append(event)

    def seconds(self) -> float:
        """The total; on CUDA only after a sync of the stream (Interval.totals)."""
        pairs = zip(self._events[0::2], self._events[1::2], strict=True)
        return self.host + sum(float(a.elapsed_time(b)) for a, b in pairs) / 1000


class Interval:
    """What one log interval accumulates; tensors stay on the device until the flush.

    An interval may span epochs (fast epochs end many times a second): `epochs` says which
    epoch each step belongs to, and `epoch_from` where the current epoch's steps begin, so
    that an epoch's loss sums can be taken at its end without ending the interval."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.losses: list[torch.Tensor] = []
        self.epochs: list[int] = []
        """The epoch of each step in `losses`."""
        self.epoch_from = 0
        """Index in `losses` of the current epoch's first step in this interval."""
        # Per-step counts are kept as they come and summed with the interval's one sync.
        self.correct = Tally(device)
        self.count: list[torch.Tensor | int] = []
        """Items scored (the step's count: samples, or non-ignored tokens)."""
        self.samples = 0
        self.wait = 0.0
        self.forward = ForwardClock(device)
        self.step_times: list[float] = []
        self.grad_norm = torch.zeros((), dtype=torch.float64, device=device)
        """Largest pre-clip gradient norm of the interval (only when clipping)."""
        self.skipped = 0
        """fp16 steps the GradScaler skipped (inf/NaN gradients)."""

    def next(self) -> Interval:
        """The interval that follows this one (on the same device)."""
        return Interval(self.device)

    def mean_step(self) -> float:
        return sum(self.step_times) / len(self.step_times) if self.step_times else 0.0

    def epoch_losses(self) -> list[float]:
        """The current epoch's per-step losses in this interval, as Python numbers (a device
        sync when there are any), after which the next step starts a new epoch's part."""
        part = self.losses[self.epoch_from:]
        self.epoch_from = len(self.losses)
        return torch.stack(part).double().tolist() if part else []

    def totals(self) -> tuple[list[float], float, float, float]:
        """(per-step losses, correct, count, largest gradient norm) as Python numbers: the
        interval's one device sync."""
        values = torch.stack([*self.losses, self.correct.total(),
                              counts_vector(self.count, self.device).sum(), self.grad_norm])
        *losses, correct, count, grad_norm = values.double().tolist()
        return losses, correct, count, grad_norm


class StepLog:
    """``steps.jsonl``: one JSON line per optimizer step (recomputed steps appear again),
    opened at the first write (~70 us an interval when reopened each time). It belongs to one
    run: a fresh start moves the previous run's file aside at its first line (to
    ``steps.N.jsonl``, N one above the highest there: nothing is deleted, and a run that fails
    before its first step leaves it as it was), a resumed run appends."""

    def __init__(self, path: Path, fresh: bool = False) -> None:
        self.path = path
        self.fresh = fresh
        """Truncate at the first write (a fresh start) instead of appending (a resume)."""
        self._file: TextIO | None = None

    def append(self, last_step: int, epochs: list[int], losses: list[float]) -> None:
        """The losses of the steps up to `last_step` and the epoch of each: finite floats,
        whose repr is their JSON (~4x faster than json.dumps per line)."""
        first = last_step - len(losses) + 1
        text = "".join(f'{{"step": {first + i}, "epoch": {epoch}, "loss": {value!r}}}\n'
                       for i, (epoch, value) in enumerate(zip(epochs, losses, strict=True)))
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if self.fresh:
                    self._move_previous_aside()
                self._file = self.path.open("w" if self.fresh else "a", encoding="utf-8")
            self._file.write(text)
            self._file.flush()  # in the kernel's hands at once: a crash loses no line
        except OSError as exc:  # a full disk, a file that may not be moved or written
            self._abandon()
            log.warning("%s not written; its lines: %s", self.path.name, text.replace("\n", " "))
            where = self.path.parent
            raise OutputError(f"output.dir: {self.path.name} could not be written in {where} "
                              f"({exc.strerror}); what the run wrote before is kept",
                              f"free space there (df -h {where}), make it writable, or pass "
                              "another --output-dir; the lines are in the WARNING line above"
                              ) from None

    def _move_previous_aside(self) -> None:
        """``steps.jsonl`` -> ``steps.N.jsonl``: a fresh run, failed or not, never destroys the
        steps of the run before it (an empty file holds nothing to keep)."""
        stem, suffix = self.path.stem, self.path.suffix
        try:
            if self.path.stat().st_size == 0:
                return
        except FileNotFoundError:
            return
        numbered = re.compile(rf"{re.escape(stem)}\.([0-9]+){re.escape(suffix)}")  # not `²`
        taken = [int(m[1]) for p in self.path.parent.iterdir() if (m := numbered.fullmatch(p.name))]
        os.replace(self.path, self.path.with_name(f"{stem}.{max(taken, default=0) + 1}{suffix}"))

    def _abandon(self) -> None:
        """Close the file without the lines a failed write left in its buffer."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()  # its flush fails again, and the file is closed anyway
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def progress_bar(is_main: bool, total: int, initial: int) -> Any:
    if not (is_main and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)
