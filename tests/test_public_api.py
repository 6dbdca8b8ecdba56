"""The public API is what docs/api.md lists, module by module, and exactly each public module's ``__all__``."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

API_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"
PUBLIC_MODULES = ("tfrbeam", "tfrbeam.beam", "tfrbeam.dataset", "tfrbeam.builder", "tfrbeam.errors")
_SECTION = re.compile(r"^## `(?P<module>[\w.]+)`$")
_NAMES = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


def documented_api() -> dict[str, set[str]]:
    """Each ``## `module``` section's names: those in backticks before the colon of its bullet points."""
    api: dict[str, set[str]] = {}
    module, bullet = None, ""
    for line in [*API_PAGE.read_text().splitlines(), ""]:
        if module is not None and bullet and not line.startswith("  "):  # a bullet ends where no continuation follows
            api[module].update(_NAMES.findall(bullet.split(":", 1)[0]))
            bullet = ""
        section = _SECTION.match(line)
        if section:
            module = section["module"]
            api[module] = set()
        elif line.startswith("- "):
            bullet = line
        elif bullet:
            bullet += " " + line.strip()
    return api


def test_the_api_page_has_a_section_for_each_public_module_and_no_other():
    assert sorted(documented_api()) == sorted(PUBLIC_MODULES)


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_each_public_modules_all_is_what_the_api_page_lists(module_name):
    module = importlib.import_module(module_name)
    assert set(module.__all__) == documented_api()[module_name]
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_every_error_class_is_public():
    import tfrbeam.errors as errors

    classes = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == errors.__name__}
    assert classes == set(errors.__all__)
