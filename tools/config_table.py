"""Print the README's configuration reference table from trainer/config.py's docstrings.

    .venv/bin/python tools/config_table.py   # paste over the table under "Configuration reference"
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.cli import CONFIG_FLAGS, field_docs  # noqa: E402
from trainer.config import JobConfig  # noqa: E402


def rows() -> list[str]:
    flags = {(section, key): flag for flag, (section, key) in CONFIG_FLAGS.items()}
    docs = field_docs()
    out = ["| key | default | flag | meaning |", "|---|---|---|---|"]
    cfg = JobConfig()
    for section in dataclasses.fields(JobConfig):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            default = json.dumps(getattr(getattr(cfg, section.name), f.name))
            if isinstance(getattr(getattr(cfg, section.name), f.name), bool):
                default = str(getattr(getattr(cfg, section.name), f.name))
            flag = flags.get((section.name, f.name))
            doc = docs[(section.name, f.name)].replace("%%", "%").replace("|", "\\|")
            out.append(f"| `{section.name}.{f.name}` | `{default}` | "
                       f"{f'`{flag}`' if flag else ''} | {doc} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
