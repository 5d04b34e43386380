"""A stand-in rank process: builds the metrics sink like the trainer does and logs.

Run as ``python fake_rank.py SPEC_JSON``; SPEC has ``rank``, ``local_rank``, ``world_size``,
``local_world_size``, ``port``, ``logs`` (a list of key->value mappings) and optionally
``hold`` (a file path: stay alive, serving/writing, until it exists). Prints ``ready``
after logging, or ``error: ...`` and exits 2 on a TrainerError, like the CLI.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from trainer.config import MetricsConfig
from trainer.errors import TrainerError
from trainer.metrics import RunInfo, build_metrics


def main() -> int:
    spec = json.loads(sys.argv[1])
    info = RunInfo(
        rank=spec["rank"],
        local_rank=spec["local_rank"],
        world_size=spec["world_size"],
        local_world_size=spec["local_world_size"],
        backend="gloo",
        strategy="ddp",
        model="mlp",
        dataset="digits",
        device="cpu",
        version="test",
    )
    try:
        sink = build_metrics(MetricsConfig(port=spec["port"], bind_address="127.0.0.1"), info)
    except TrainerError as err:
        print(f"error: {err}", flush=True)
        return 2
    for step, metrics in enumerate(spec["logs"], start=1):
        sink.log(metrics, step)
    print("ready", flush=True)
    hold = spec.get("hold")
    if hold:
        deadline = time.monotonic() + 60
        while not Path(hold).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
