"""Every file of this repository that the docs, the README or a source comment names exists.

A pointer to a file that moved or never landed (a `docs/schema/` no one writes, a module that became a
package) sends a reader nowhere. What counts as a pointer into the repository:
- a path starting with one of its top-level folders (`src/netsleuth/...`, `docs/x.md`, `bench/x.py`,
  `tests/...`, `packaging/...`, `bpf/x.bpf.c`); `bpf/x.py` may also mean src/netsleuth/bpf/x.py;
- a `.py`, `.js` or `.md` path whose first folder is a netsleuth subpackage (`diagnostics/snoop/records.py`,
  read from src/netsleuth), or one next to the file that names it (`rules/ring.py` in doctor/);
- a folder under those top-level ones, written with its trailing slash (`docs/schema/`);
- a Markdown file named alone (`FLEET-CONTRACT.md`): a file of that name is in the repository; by an
  absolute path (`/work/coord/...md`) it never is;
- a relative Markdown link (`[drops](drops.md)`).
Markdown's fenced code blocks are left out: they show output, and files a walk-through makes.
Kernel sources (`net/core/dev.c`, `include/uapi/...`), other projects' files (nftables' `src/proto.c`, a C
file is checked only under bpf/, bench/ or tests/), `#include <bpf/...>` and the placeholder NAME
(`bpf/NAME.h`) are not this repository's. `python -m tests.unit.test_doc_pointers` prints what is missing.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "netsleuth"
# A path of at least two parts ending in a file name, not inside a longer path, URL or `<include>`.
_PATH = re.compile(r"(?<![\w./~<:-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|c|h|js|css|toml|ya?ml|json|sh))(?![\w/])")
# A folder of the repository, written with its trailing slash: `docs/schema/`.
_FOLDER = re.compile(r"(?<![\w./~<:-])((?:src|docs|bench|tests|packaging|bpf)/(?:[\w.-]+/)*)(?![\w.])")
# A Markdown file named alone (`FLEET-CONTRACT.md`): some file of the repository has that name.
_BARE_MARKDOWN = re.compile(r"(?<![\w./~<:-])([\w-]+\.md)(?![\w/])")
# A Markdown file by absolute path (`/work/coord/FLEET-CONTRACT.md`): outside any checkout of the repository.
_ABSOLUTE_MARKDOWN = re.compile(r"(?<![\w.~:-])(/(?:[\w.-]+/)+[\w.-]+\.md)(?![\w/])")
_FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_MARKDOWN_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
_PLACEHOLDER = re.compile(r"(?<![A-Za-z])NAME(?![A-Za-z])").search
_TOP = ("src/", "docs/", "bench/", "tests/", "packaging/", "bpf/")
_C_UNDER = ("bpf/", "bench/", "tests/")
_UNTRACKED = {".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
_SCANNED = (".py", ".md", ".c", ".h", ".js")


def _tracked(*where: str) -> list[str]:
    """The repository's files under `where` (all of them without): git's list in a checkout, else (an
    unpacked source tree) every file but the ones a build or a run leaves."""
    if (REPO / ".git").exists():
        return subprocess.run(
            ["git", "ls-files", *where], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
    found = []
    for top in [REPO / name for name in where] or [REPO]:
        paths = top.rglob("*") if top.is_dir() else [top]
        found += [
            str(path.relative_to(REPO))
            for path in paths
            if path.is_file() and not _UNTRACKED.intersection(path.relative_to(REPO).parts)
        ]
    return found


def _scanned_files() -> list[Path]:
    listed = _tracked("docs", "README.md", "src/netsleuth", "bpf", "bench", "tests")
    return [
        REPO / name
        for name in listed
        if name.endswith(_SCANNED)
        and "/_generated/" not in name
        and "/vendor/" not in name
        and REPO / name != Path(__file__).resolve()  # its own examples
    ]


def _candidates(named: str, source: Path) -> list[Path] | None:
    """Where `named` (as written in `source`) may be, or None when it is not a pointer into the repository."""
    if _PLACEHOLDER(named):
        return None  # bpf/NAME.bpf.c
    subpackages = {path.name for path in PACKAGE.iterdir() if path.is_dir()}
    if named.startswith(_TOP):
        if named.endswith((".c", ".h")) and not named.startswith(_C_UNDER):
            return None
        places = [REPO / named, PACKAGE / named]
    elif named.endswith((".py", ".js", ".md")) and named.split("/")[0] in subpackages:
        places = [PACKAGE / named]
    elif named.endswith((".py", ".js", ".md")) and (source.parent / named.split("/")[0]).is_dir():
        places = []
    else:
        return None
    return [*places, source.parent / named]


def missing_pointers() -> Iterator[str]:
    markdown_names = {Path(name).name for name in _tracked() if name.endswith(".md")}
    for source in _scanned_files():
        text = source.read_text(errors="replace")
        if source.suffix == ".md":
            # Code blocks show files being made (adding-a-diagnostic.md's walk) and output: not pointers.
            text = _FENCED.sub(lambda block: "\n" * block.group(0).count("\n"), text)
        found = [
            (match.start(), match.group(1), _candidates(match.group(1), source))
            for match in _PATH.finditer(text)
        ]
        found += [
            (match.start(), match.group(1), [REPO / match.group(1)]) for match in _FOLDER.finditer(text)
        ]
        found += [
            (match.start(), match.group(1), [])
            for match in _BARE_MARKDOWN.finditer(text)
            if match.group(1) not in markdown_names
        ]
        found += [(match.start(), match.group(1), []) for match in _ABSOLUTE_MARKDOWN.finditer(text)]
        if source.suffix == ".md":
            for match in _MARKDOWN_LINK.finditer(text):
                target = match.group(1)
                if "://" not in target and not target.startswith("mailto:"):
                    found.append((match.start(), target, [source.parent / target]))
        for offset, named, places in found:
            if places is not None and not any(place.exists() for place in places):
                line = text.count("\n", 0, offset) + 1
                yield f"{source.relative_to(REPO)}:{line}: {named}"


def test_every_file_the_docs_and_comments_name_exists() -> None:
    missing = sorted(set(missing_pointers()))
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)


if __name__ == "__main__":
    for pointer in sorted(set(missing_pointers())):
        print(pointer)
