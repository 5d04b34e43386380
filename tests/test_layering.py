"""The trainer package's imports run one way: down the layers below, with no circle.

Every module's imports are read from its source (``ast``: module-level, function-level and
``TYPE_CHECKING`` imports alike, since each is a dependency a reader must follow), so a new
upward arrow or a circle fails here with the offending edge, before anyone reviews it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "trainer"

LAYERS: tuple[tuple[str, ...], ...] = (
    # lowest first: a module may import its own layer's modules and the layers before it
    ("trainer", "trainer.errors"),
    ("trainer.config", "trainer.plugins", "trainer.config_yaml", "trainer.config_load"),
    # stacks: DataLoader workers (trainer.data) register the hang watchdog's stack dump
    ("trainer.usercode", "trainer.placement", "trainer.stacks"),
    ("trainer.components", "trainer.data", "trainer.sampling", "trainer.metrics",
     "trainer.jobs"),
    ("trainer.distributed",),
    ("trainer.loop",),
    ("trainer.build",),  # the composition root
    ("trainer.ranks", "trainer.export"),
    ("trainer.api", "trainer.cli", "trainer.__main__"),
)
"""Each entry names a module or a package (all modules under it); the most specific wins."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path) -> set[str]:
    """The trainer modules `name` imports (``from pkg import mod`` names the module; ``from
    mod import f`` names `mod`)."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = base[:len(base) - node.level + 1] if node.level else []
            source = ".".join(parent + ([node.module] if node.module else []))
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES
                       else source for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t.split(".")[0] == "trainer" and t != name)
    return found


GRAPH = {name: imported(name, path) for name, path in MODULES.items()}


def layer(name: str) -> int:
    """The index of the most specific LAYERS entry that holds `name`."""
    best, depth = -1, -1
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            if (name == entry or name.startswith(entry + ".")) and entry.count(".") > depth:
                best, depth = index, entry.count(".")
    return best


def test_the_import_reader_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    source = tmp_path / "trainer" / "loop" / "example.py"
    source.parent.mkdir(parents=True)
    source.write_text("def f():\n    from trainer.ranks import runner\n"
                      "from ..build import Workload\nfrom . import state\n")
    found = imported("trainer.loop.example", source)
    assert found == {"trainer.ranks.runner", "trainer.build", "trainer.loop.state"}


def test_every_trainer_module_has_a_layer() -> None:
    unplaced = [name for name in MODULES if layer(name) < 0]
    assert not unplaced, f"modules in no LAYERS entry: {unplaced}"
    assert len(MODULES) > 50, sorted(MODULES)  # the walk found the package


def test_no_module_imports_a_module_of_a_higher_layer() -> None:
    upward = [f"{src} (layer {layer(src)}) -> {dst} (layer {layer(dst)})"
              for src, targets in sorted(GRAPH.items()) for dst in sorted(targets)
              if layer(dst) > layer(src)]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected component of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between trainer's sub-packages and top-level modules (trainer.x)."""
    def top(name: str) -> str:
        return ".".join(name.split(".")[:2])
    out: dict[str, set[str]] = {}
    for src, targets in graph.items():
        out.setdefault(top(src), set()).update(top(t) for t in targets if top(t) != top(src))
    return out


@pytest.mark.parametrize("level", ["modules", "packages"])
def test_the_imports_have_no_circle(level: str) -> None:
    graph = GRAPH if level == "modules" else packages(GRAPH)
    circles = cycles(graph)
    assert not circles, "circles:\n" + "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a])
                                          if b in c) for c in circles)


def test_the_circle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
