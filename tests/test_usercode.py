"""Which errors are the user's: the frame named in their one line, and the cause the launcher
reports among the ranks' failures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.utils.data import DataLoader, Dataset

from trainer import plugins
from trainer.distributed.agreement import Collective
from trainer.errors import USER_CODE_EXIT
from trainer.ranks.launcher import exit_code_of
from trainer.usercode import describe, user_frame

HERE = str(Path(__file__).resolve())


class _Broken(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        raise KeyError(f"no sample {i}")


def test_a_dataset_error_in_a_loader_worker_names_the_users_file_and_line() -> None:
    loader = DataLoader(_Broken(), batch_size=2, num_workers=1)
    batches = iter(loader)
    with pytest.raises(KeyError) as caught:
        next(batches)
    # Stopped here: the traceback keeps the iterator alive, and its finalizer, run by a later
    # test's garbage collection, joined the forked worker for minutes (a CI hang).
    batches._shutdown_workers()  # type: ignore[attr-defined]
    frame = user_frame(caught.value)
    assert frame is not None and frame.filename == HERE and frame.name == "__getitem__"
    assert describe(caught.value, frame).startswith("user code raised KeyError: 'no sample 0'")


def test_an_error_raised_by_this_package_is_not_the_users() -> None:
    with pytest.raises(plugins.PluginError) as caught:
        plugins.load("nosuchpkg.models:Net", "model.name")
    assert user_frame(caught.value) is None


def test_a_runtime_error_of_the_users_model_inside_ddps_forward_is_not_a_lost_rank() -> None:
    def forward() -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"), \
            Collective("the gradient all-reduce", 60):
        forward()


def _failures(*codes: int) -> ChildFailedError:
    failures = {rank: ProcessFailure(rank, 1000 + rank, code, "/nonexistent/error.json")
                for rank, code in enumerate(codes)}
    return ChildFailedError("trainer", failures)


def test_the_launcher_reports_the_rank_whose_user_code_raised_not_the_one_that_saw_it() -> None:
    assert exit_code_of(_failures(4, USER_CODE_EXIT)) == USER_CODE_EXIT
    assert exit_code_of(_failures(4, 4)) == 4


def test_a_callable_missing_a_package_is_told_to_install_it_not_to_fix_its_code() -> None:
    # examples/mytask's transformers classifier after `make run` alone: no transformers
    def tiny_bert(num_classes: int) -> None:
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers")

    with pytest.raises(plugins.PluginError) as caught:
        plugins.call(tiny_bert, {"num_classes": 2}, "model.name 'mytask.text:tiny_bert'",
                     "fix the model callable or model.options")
    assert "raised ModuleNotFoundError: No module named 'transformers'" in caught.value.problem
    assert caught.value.fix.startswith("install 'transformers' where the ranks run")
