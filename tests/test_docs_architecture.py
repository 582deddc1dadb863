"""docs/architecture.md's layer table matches the tree of ezflow/.

Every folder of the package is a row (or part of one), every folder the table names
exists, the private layers come in the order the import-direction test enforces, and
every module a row names exists in that row's folders (as ``_x.py`` or as a package
``_x/``).
"""

from __future__ import annotations

import re
from pathlib import Path

from test_public_api import LAYERS, PACKAGE

PAGE = Path(__file__).parent.parent / "docs" / "architecture.md"


def _rows() -> list[tuple[list[str], str]]:
    """(folders, what lives there) of each row of the table under "## Layers"."""
    text = PAGE.read_text()
    section = text[text.index("## Layers") :]
    section = section[: section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`ezflow/"):
            rows.append((re.findall(r"`(ezflow/[\w/]*)`", cells[1]), cells[2]))
    return rows


def _tree_folders() -> set[str]:
    return {
        f"ezflow/{path.name}/"
        for path in PACKAGE.iterdir()
        if path.is_dir() and (path / "__init__.py").exists()
    }


def test_every_folder_of_the_package_is_in_the_table() -> None:
    named = {folder for folders, _ in _rows() for folder in folders}
    assert _tree_folders() <= named, f"not in the layer table: {_tree_folders() - named}"
    for folder in named:
        assert (PACKAGE.parent / folder).is_dir(), f"the layer table names {folder}"


def test_the_private_layers_are_in_import_order() -> None:
    order = [
        folder.removeprefix("ezflow/").strip("/")
        for folders, _ in _rows()
        for folder in folders
        if folder.startswith("ezflow/_")
    ]
    assert order == LAYERS


def test_every_module_a_row_names_exists() -> None:
    checked = 0
    for folders, text in _rows():
        for module in re.findall(r"`([\w/]+\.py)`", text):
            where = [PACKAGE.parent / folder / module for folder in ["", *folders]]
            found = any(path.exists() or path.with_suffix("").is_dir() for path in where)
            assert found, f"docs/architecture.md names {module} in {folders}: not there"
            checked += 1
    assert checked >= 50
