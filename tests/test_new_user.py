"""A new user's day one: ``pip install .`` of this source tree into a fresh virtualenv, then the README's "To use" block,
as written, from an empty directory. The build must succeed there and write the dataset.

The virtualenv sees this test environment's packages through a ``.pth`` line (so nothing is downloaded and the
install takes seconds), but not its editable tfrbeam: tfrbeam itself is built and installed from a copy of the
source tree, and the test checks that the ``tfrbeam`` run is that installed copy.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

from tests.test_readme import REPO_ROOT, readme_blocks

NEW_USER_MARKER = "<!-- new-user -->"
_SOURCE_FILES = ("setup.py", "MANIFEST.in", "README.md", "pyproject.toml")


def to_use_block() -> str:
    """The README's "To use" block: the sh block after the ``<!-- new-user -->`` marker, exactly as written."""
    blocks = [block for block in readme_blocks((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
              if block.marker == NEW_USER_MARKER]
    assert len(blocks) == 1 and blocks[0].language == "sh", [block.line for block in blocks]
    return blocks[0].code


def install_line() -> str:
    """The README's install command, ``pip install .`` (its first line, comment dropped)."""
    blocks = readme_blocks((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    to_use = next(index for index, block in enumerate(blocks) if block.marker == NEW_USER_MARKER)
    line = blocks[to_use - 1].code.splitlines()[0].split("#")[0].strip()
    assert line == "pip install .", line
    return line


def source_tree_copy(directory: pathlib.Path) -> pathlib.Path:
    """The files ``pip install .`` builds from, copied (a build in the checkout would leave build/ there)."""
    directory.mkdir()
    for name in _SOURCE_FILES:
        shutil.copy(REPO_ROOT / name, directory / name)
    shutil.copytree(REPO_ROOT / "tfrbeam", directory / "tfrbeam", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return directory


def fresh_virtualenv(directory: pathlib.Path) -> pathlib.Path:
    """A new virtualenv whose site-packages also lists this environment's (its packages, not its editable tfrbeam)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=120)
    python = directory / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # A path line adds the directory to sys.path after the venv's own; .pth files in it (the editable
    # install's finder) are not run, so `import tfrbeam` finds only what pip installs here.
    pathlib.Path(site, "test-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_pip_install_then_the_readme_to_use_block_builds_from_an_empty_directory(tmp_path):
    source = source_tree_copy(pathlib.Path(tmp_path, "clone"))
    python = fresh_virtualenv(tmp_path / "venv")
    install = subprocess.run([str(python), "-m", *install_line().split()], cwd=source, capture_output=True,
                             text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    bin_dir = python.parent
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment.update(PATH=os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"]), VIRTUAL_ENV=str(bin_dir.parent))
    where = subprocess.run([str(bin_dir / "tfrbeam"), "--version"], capture_output=True, text=True, env=environment)
    found = subprocess.run([str(python), "-c", "import tfrbeam; print(tfrbeam.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, env=environment).stdout
    assert where.returncode == 0 and found.startswith(str(tmp_path / "venv")), found  # the installed copy, not the checkout

    empty = tmp_path / "day_one"
    empty.mkdir()
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", to_use_block()], cwd=empty, env=environment,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = json.loads((empty / "out" / "demo" / "tfrbeam_dataset.json").read_text())
    assert manifest["rows_read"] == 3000
    assert sum(split["num_examples"] for split in manifest["splits"].values()) == 3000 - manifest["bad_records"]["count"]
    assert "apitools" not in result.stderr and "Traceback" not in result.stderr
