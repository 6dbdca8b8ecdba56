"""Every ```python and ```sh block of README.md runs, in order, in a scratch directory holding the demo data.

README.md is read when the tests run, so the tour is checked as it is written today. Blocks run
in the state the install block leaves (see ``readme_workdir``): the demo data generated and
``configs/demo.yaml`` built into ``out/demo``. Python blocks run as scripts of their own; sh blocks
run with bash -e -o pipefail; both in the same directory, so later blocks see what earlier ones wrote.

Blocks that are not run, each marked by an HTML comment on the line before its fence:
- ``<!-- ci:install -->`` and ``<!-- ci:test -->``: .ci/run runs them itself (the test block runs
  this suite; the install block makes a virtualenv);
- ``<!-- readme-test: skip (REASON) -->``: only for a block that needs Dataflow or cloud credentials,
  e.g. ``<!-- readme-test: skip (needs Dataflow credentials) -->``.
Any other block must run and exit 0. Blocks meant as text (synopses, output) use ```text.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
RUN_LANGUAGES = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
SKIP_MARKER = re.compile(r"^<!--\s*readme-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->$")
CI_MARKER = re.compile(r"^<!--\s*ci:(install|test)\s*-->$")
CREDENTIAL_WORDS = ("dataflow", "credential", "gcp", "gcs", "s3", "cloud")
BLOCK_TIMEOUT_SECONDS = 600
_FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marker: str | None  # the HTML comment on the line before the fence, if any

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES

    def skip_reason(self) -> str | None:
        """Why the block is not run (a documented marker), or None."""
        if self.marker is None:
            return None
        if CI_MARKER.match(self.marker):
            return f"{self.marker}: run by .ci/run"
        match = SKIP_MARKER.match(self.marker)
        if match:
            reason = match.group("reason")
            if not any(word in reason.lower() for word in CREDENTIAL_WORDS):
                raise ValueError(f"README.md:{self.line}: a readme-test skip is only for blocks that need Dataflow or "
                                 f"cloud credentials, not {reason!r}")
            return reason
        return None


def readme_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, with their language and the marker comment before them."""
    blocks = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index].strip()) if lines[index].startswith("```") else None
        if fence is None:
            index += 1
            continue
        start = index
        previous = next((lines[i].strip() for i in range(start - 1, -1, -1) if lines[i].strip()), "")
        end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() == "```"), None)
        if end is None:
            raise ValueError(f"README.md:{start + 1}: a code block is never closed")
        marker = previous if previous.startswith("<!--") else None
        blocks.append(Block(start + 1, fence.group(1).lower(), "\n".join(lines[start + 1:end]) + "\n", marker))
        index = end + 1
    return blocks


def run_block(block: Block, directory: pathlib.Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
                   "PATH": os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ.get("PATH", "")])}
    if RUN_LANGUAGES[block.language] == "python":
        command = [sys.executable, "-"]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-s"]
    return subprocess.run(command, input=block.code, cwd=directory, env=environment, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_SECONDS)


def failures_of(blocks: list[Block], directory: pathlib.Path, rounds: int = 2) -> list[str]:
    """One line per block that exits non-zero: where it is, its first line, and the last line it printed.

    The tour is run twice: a reader who runs it again must not hit errors the first run set up
    (an output that now exists, say).
    """
    failures = []
    for round_number in range(1, rounds + 1):
        for block in blocks:
            if not block.runs or block.skip_reason() is not None:
                continue
            result = run_block(block, directory)
            if result.returncode != 0:
                said = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
                first = block.code.strip().splitlines()[0] if block.code.strip() else ""
                again = " on the second run of the tour" if round_number > 1 else ""
                failures.append(f"README.md:{block.line} ({block.language}, exit {result.returncode}{again}) "
                                f"{first!r}: {said[-1] if said else 'no output'}")
    return failures


@pytest.fixture(scope="module")
def readme_workdir(tmp_path_factory) -> pathlib.Path:
    """A scratch directory in the state the install block leaves: demo data, configs/, and out/demo built."""
    directory = tmp_path_factory.mktemp("readme")
    for name in ("configs", "pipelines", "benchmarks", "setup.py"):
        os.symlink(REPO_ROOT / name, directory / name)
    setup = Block(0, "sh", "tfrbeam demo-data demo_data\ntfrbeam build configs/demo.yaml --quiet\n", None)
    result = run_block(setup, directory)
    assert result.returncode == 0, result.stderr
    return directory


def test_every_readme_code_block_runs(readme_workdir):
    blocks = readme_blocks((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    assert any(block.runs for block in blocks), "README.md has no python or sh blocks"
    failures = failures_of(blocks, readme_workdir)
    assert not failures, f"{len(failures)} README block(s) fail:\n" + "\n".join(failures)


def test_blocks_markers_and_failures_are_found(tmp_path):
    text = "\n".join([
        "intro", "<!-- ci:test -->", "```sh", "exit 3", "```",
        "<!-- readme-test: skip (needs Dataflow credentials) -->", "", "```sh", "tfrbeam build x --runner DataflowRunner", "```",
        "```python", "print('ok')", "```",
        "```sh", "echo broken >&2; false", "```",
        "```yaml", "a: 1", "```",
        "```text", "tfrbeam build CONFIG.yaml [options]", "```",
    ])
    blocks = readme_blocks(text)
    assert [(block.line, block.language, block.runs) for block in blocks] == [
        (3, "sh", True), (8, "sh", True), (11, "python", True), (14, "sh", True), (17, "yaml", False), (20, "text", False)]
    assert blocks[0].skip_reason() == "<!-- ci:test -->: run by .ci/run"
    assert blocks[1].skip_reason() == "needs Dataflow credentials"
    assert failures_of(blocks, tmp_path, rounds=1) == ["README.md:14 (sh, exit 1) 'echo broken >&2; false': broken"]
    once = readme_blocks("```sh\ntest ! -e made\ntouch made\n```\n")
    assert failures_of(once, tmp_path) == ["README.md:1 (sh, exit 1 on the second run of the tour) 'test ! -e made': no output"]
    with pytest.raises(ValueError, match="only for blocks that need Dataflow or cloud credentials"):
        readme_blocks("<!-- readme-test: skip (too slow) -->\n```sh\ntrue\n```\n")[0].skip_reason()
    with pytest.raises(ValueError, match="never closed"):
        readme_blocks("```sh\ntrue\n")


_COMMENT_COMMAND = re.compile(r"(?:tfrbeam|python -m) [^#]*")


def config_comment_commands(text: str) -> list[str]:
    """The shell commands a config's leading comment tells a reader to run (`# ... tfrbeam ...`)."""
    commands = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        commands += [command.strip() for command in _COMMENT_COMMAND.findall(line[1:]) if command.strip()]
    return commands


def test_config_comment_commands_are_found():
    text = "# A build.\n#   tfrbeam demo-data d && tfrbeam build c.yaml   # or: python -m x.y c.yaml\ninput: {}\n# tfrbeam no\n"
    assert config_comment_commands(text) == ["tfrbeam demo-data d && tfrbeam build c.yaml", "python -m x.y c.yaml"]


def test_every_command_in_a_config_comment_runs(tmp_path):
    """configs/*.yaml tell a reader how to run them in their first lines; those commands must work as written."""
    for name in ("configs", "pipelines"):
        os.symlink(REPO_ROOT / name, tmp_path / name)
    commands = [command for path in sorted((REPO_ROOT / "configs").glob("*.yaml"))
                for command in config_comment_commands(path.read_text(encoding="utf-8"))]
    assert len(commands) >= 5, commands
    blocks = [Block(index, "sh", command + " --quiet\n" if " build " in command else command + "\n", None)
              for index, command in enumerate(commands)]
    failures = failures_of(blocks, tmp_path, rounds=1)
    assert not failures, "\n".join(failures)
