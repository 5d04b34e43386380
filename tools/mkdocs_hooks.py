"""mkdocs hooks (mkdocs.yml `hooks:`): the site is the repository's own Markdown, one source.

README.md becomes the home page and the chart's, the manifests' and the example's READMEs
pages of their own, unchanged on disk. Links are written for GitHub (relative to the file that
holds them); here each one is resolved in the repository: one to a page of the site becomes a
link to that page (mkdocs then checks its anchor), one to any other file of the repository a
link to that file on GitHub, and one to a file that does not exist an error, so `mkdocs build
--strict` (make docs) fails on it.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
# repository path -> page of the site (docs/*.md keep their names, minus "docs/")
PAGES = {
    "README.md": "index.md",
    "charts/ddp-trainer/README.md": "chart.md",
    "k8s/README.md": "k8s.md",
    "examples/mytask/README.md": "example.md",
}
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
log = logging.getLogger("mkdocs.hooks.ddp_trainer")


def site_page(repo_path: str) -> str | None:
    if repo_path in PAGES:
        return PAGES[repo_path]
    if repo_path.startswith("docs/") and repo_path.endswith(".md"):
        return repo_path.removeprefix("docs/")
    return None


def repo_path_of(page: str) -> str:
    return next((repo for repo, site in PAGES.items() if site == page), f"docs/{page}")


def on_files(files: Files, config: Any) -> Files:
    for repo_path, page in PAGES.items():
        files.append(File.generated(config, page, abs_src_path=str(REPO / repo_path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    here = posixpath.dirname(repo_path_of(page.file.src_uri))
    repo_url = config["repo_url"].rstrip("/")

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(here, path))
        if resolved.startswith("..") or not (REPO / resolved).exists():
            log.warning("%s links to %s, which is not a file of the repository",
                        repo_path_of(page.file.src_uri), target)
            return match.group(0)
        page_of_target = site_page(resolved)
        if page_of_target is not None:
            new = posixpath.relpath(page_of_target, posixpath.dirname(page.file.src_uri) or ".")
        else:
            kind = "tree" if (REPO / resolved).is_dir() else "blob"
            new = f"{repo_url}/{kind}/main/{resolved}"
        return f"{match.group(1)}{new}{'#' + anchor if anchor else ''}{match.group(3)}"

    return LINK.sub(rewrite, markdown)
