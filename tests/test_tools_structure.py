"""tools/ is release and cluster code: it never runs on test code, and its Go build cache
survives a rename of a module's folder."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_module_under_tools_imports_the_tests() -> None:
    files = sorted((REPO / "tools").rglob("*.py"))
    offending = [f"{path.relative_to(REPO)} imports {name}" for path in files
                 for name in sorted(imports(path)) if name.split(".")[0] == "tests"]
    assert len(files) > 20, files  # the walk found tools/cluster and tools/imagebuild
    assert not offending, "\n".join(offending)


def test_a_renamed_module_folder_keeps_its_binaries_cache_folder(tmp_path: Path) -> None:
    from tools.cluster import builds

    group = next(g for g in builds.GROUPS if g.name == "localpath")
    moved = tmp_path / "any-other-name"
    shutil.copytree(group.module, moved)
    renamed = builds.Group(group.name, moved, group.packages, group.static, group.tags)
    # `echo version` stands in for `go version`: the key hashes its output like any other.
    assert builds.cache_folder(renamed, "echo", "-s -w") == \
        builds.cache_folder(group, "echo", "-s -w")
    assert renamed.ldflags(builds.Versions.read()) == group.ldflags(builds.Versions.read())


def test_every_module_folder_is_built_by_one_group() -> None:
    from tools.cluster import builds

    folders = {p.parent for p in (REPO / "tools" / "cluster").glob("*/go.mod")}
    assert folders == {g.module for g in builds.GROUPS if g.module.name != "cluster"}
    assert len({g.name for g in builds.GROUPS}) == len(builds.GROUPS)
