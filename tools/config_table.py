"""The configuration table of docs/configuration.md, made from trainer/config.py's docstrings.

    .venv/bin/python tools/config_table.py           # print it
    .venv/bin/python tools/config_table.py --write   # replace the table in docs/configuration.md

tests/test_readme.py fails when the page's table is stale.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "configuration.md"
sys.path.insert(0, str(REPO))

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


def write(page: Path = PAGE) -> None:
    text = page.read_text()
    start = text.index(rows()[0])
    end = text.index("\n\n", start)
    page.write_text(text[:start] + "\n".join(rows()) + text[end:])


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print("\n".join(rows()))
