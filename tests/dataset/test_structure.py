"""The training reader's structure: an epoch and a pass get their state handed to them, never reach into a Dataset.

``epoch.py`` and ``passes.py`` sit below ``pipeline.py`` (which builds on them): they must not import it
and must not read or write a private (``_name``) attribute of any object but their own ``self``.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import tfrbeam.dataset

DATASET = pathlib.Path(tfrbeam.dataset.__file__).parent
BELOW_PIPELINE = ("epoch.py", "passes.py")


def _private_reaches(source: str) -> list[str]:
    """Every ``x._name`` in the source whose ``x`` is not plain ``self``, as 'line: source'."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        private = node.attr.startswith("_") and not (node.attr.startswith("__") and node.attr.endswith("__"))
        on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
        if private and not on_self:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def _imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("module", BELOW_PIPELINE)
def test_epoch_and_pass_code_touch_no_private_attribute_of_another_object(module):
    assert _private_reaches((DATASET / module).read_text()) == []


@pytest.mark.parametrize("module", BELOW_PIPELINE)
def test_epoch_and_pass_code_never_import_the_pipeline(module):
    assert "tfrbeam.dataset.pipeline" not in _imported_modules(DATASET / module)


def test_the_check_sees_a_private_reach():
    """The AST check itself: ``other._x`` is caught, ``self._x`` and ``type(x).__name__`` are not."""
    source = "def f(self, other):\n    self._mine = other._theirs\n    return type(other).__name__\n"
    assert _private_reaches(source) == ["2: other._theirs"]
