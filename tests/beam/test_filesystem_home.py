"""``tfrbeam.beam.filesystem`` is the one home of Apache Beam ``FileSystems`` calls: no other module of tfrbeam uses it.

Checked on the syntax tree: an attribute of ``FileSystems`` (``FileSystems.open``,
``beam.io.filesystems.FileSystems.match``) or an import of ``apache_beam.io.filesystems`` anywhere
but in ``tfrbeam/beam/filesystem.py`` fails, so each file operation keeps one meaning and the
fault-injection tests can wrap every one of them in one place.
"""

from __future__ import annotations

import ast
import pathlib

import tfrbeam

PACKAGE = pathlib.Path(tfrbeam.__file__).parent
HOME = "tfrbeam/beam/filesystem.py"

def filesystems_uses(source: str) -> list[str]:
    """Every use of Beam's FileSystems in ``source``, as 'line: code'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            owner = node.value
            named = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else None
            if named == "FileSystems":
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module == "apache_beam.io.filesystems":
            found.append(f"{node.lineno}: from {node.module} import {', '.join(alias.name for alias in node.names)}")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {alias.name}" for alias in node.names if alias.name == "apache_beam.io.filesystems"]
    return found


def _offenders() -> dict[str, list[str]]:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        uses = filesystems_uses(path.read_text())
        if name != HOME and uses:
            offenders[name] = uses
    return offenders


def test_no_module_but_the_home_calls_beam_filesystems():
    offenders = _offenders()
    assert offenders == {}, f"route these through {HOME} (add a function there): {offenders}"


def test_the_home_itself_is_where_the_calls_are():
    assert filesystems_uses((PACKAGE.parent / HOME).read_text())


def test_the_check_sees_every_spelling_and_ignores_prose():
    source = (
        '"""Files are read through Beam\'s FileSystems."""\n'
        "import apache_beam as beam\n"
        "from apache_beam.io.filesystems import FileSystems\n"
        "FileSystems.open('x')\n"
        "beam.io.filesystems.FileSystems.match(['y'])\n"
    )
    assert filesystems_uses(source) == [
        "3: from apache_beam.io.filesystems import FileSystems",
        "4: FileSystems.open",
        "5: beam.io.filesystems.FileSystems.match",
    ]
