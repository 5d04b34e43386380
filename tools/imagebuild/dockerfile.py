"""A small reader of the repository's Dockerfile: instructions grouped by build stage.

No Docker engine is available to the tests, so they read the Dockerfile itself: the wheel
test runs the stage's own build command, the other tests check what the image will be.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str  # the rest, continuation lines joined

    def exec_form(self) -> list[str]:
        """The JSON array of ENTRYPOINT/CMD/SHELL."""
        value: list[str] = json.loads(self.args)
        return value

    def words(self) -> list[str]:
        return shlex.split(self.args)


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        return self._pairs("ENV")

    def labels(self) -> dict[str, str]:
        return self._pairs("LABEL")

    def _pairs(self, keyword: str) -> dict[str, str]:
        """The KEY=VALUE words of every `keyword` instruction, a later key winning."""
        values: dict[str, str] = {}
        for instruction in self.all(keyword):
            for word in instruction.words():
                key, _, value = word.partition("=")
                values[key] = value
        return values


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def instructions(text: str) -> list[Instruction]:
    result: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped by Docker
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append(Instruction(keyword.upper(), " ".join(args.split())))
    return result


def parse(path: Path = DOCKERFILE) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in instructions(path.read_text()):
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            if instruction.keyword == "ARG":
                key, _, value = instruction.args.partition("=")
                global_args[key] = value
        else:
            stages[-1].instructions.append(instruction)
    return Dockerfile(global_args, stages)


def resolve(value: str, args: dict[str, str]) -> str:
    for key, arg in args.items():
        value = value.replace("${" + key + "}", arg).replace("$" + key, arg)
    return value
