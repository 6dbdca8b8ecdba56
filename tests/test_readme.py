"""Every ```python and ```sh block of README.md and docs/*.md runs, in order, in a scratch directory holding the demo data.

README.md and docs/*.md are read when the tests run, so the tour and the pages are checked as they
are written today. Blocks run in the state the install block leaves (see ``installed_template``):
the demo data generated and ``configs/demo.yaml`` built into ``out/demo``. Python blocks run as
scripts of their own; sh blocks run with bash -e -o pipefail; both in the same directory, so later
blocks see what earlier ones wrote. The README is one tour, run twice. Each docs page runs in a
scratch directory of its own, one test per block (``test_docs_code_block_runs[reader.md:92]``):
the page's earlier blocks run first, then the block itself twice (an example a reader runs again
must not fail on what its first run left).

Blocks that are not run, each marked by an HTML comment on the line before its fence:
- ``<!-- ci:install -->`` and ``<!-- ci:test -->``: .ci/run runs them itself (the test block runs
  this suite; the install block makes a virtualenv);
- ``<!-- readme-test: skip (REASON) -->``: only for a block that needs Dataflow or cloud credentials,
  e.g. ``<!-- readme-test: skip (needs Dataflow credentials) -->``.
Any other block must run and exit 0. Blocks meant as text (synopses, output) use ```text.
``<!-- new-user -->`` marks the README's "To use" block, which runs here too and which
tests/test_new_user.py also runs from an empty directory in a fresh virtualenv after ``pip install .``.

Every relative link of README.md and docs/*.md must name a file that exists, and a ``#anchor`` a
heading of that file (GitHub's slugs).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS_DIR = REPO_ROOT / "docs"
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
    source: str = "README.md"  # the file the block is in, as failures name it

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
                raise ValueError(f"{self.source}:{self.line}: a readme-test skip is only for blocks that need Dataflow or "
                                 f"cloud credentials, not {reason!r}")
            return reason
        return None


def readme_blocks(text: str, source: str = "README.md") -> list[Block]:
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
            raise ValueError(f"{source}:{start + 1}: a code block is never closed")
        marker = previous if previous.startswith("<!--") else None
        blocks.append(Block(start + 1, fence.group(1).lower(), "\n".join(lines[start + 1:end]) + "\n", marker, source))
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
                tour = " of the tour" if block.source == "README.md" else ""
                again = f" on the second run{tour}" if round_number > 1 else ""
                failures.append(f"{block.source}:{block.line} ({block.language}, exit {result.returncode}{again}) "
                                f"{first!r}: {said[-1] if said else 'no output'}")
    return failures


@pytest.fixture(scope="module")
def installed_template(tmp_path_factory) -> pathlib.Path:
    """A directory in the state the install block leaves: demo data, configs/, and out/demo built; copied, never run in."""
    directory = tmp_path_factory.mktemp("installed")
    for name in ("configs", "pipelines", "benchmarks", "setup.py"):
        os.symlink(REPO_ROOT / name, directory / name)
    setup = Block(0, "sh", "tfrbeam demo-data demo_data\ntfrbeam build configs/demo.yaml --quiet\n", None)
    result = run_block(setup, directory)
    assert result.returncode == 0, result.stderr
    return directory


def installed_copy(template: pathlib.Path, directory: pathlib.Path) -> pathlib.Path:
    """A fresh scratch directory in the template's state (symlinks kept, mtimes kept, so read indexes stay current)."""
    shutil.copytree(template, directory, symlinks=True)
    return directory


@pytest.fixture(scope="module")
def readme_workdir(installed_template, tmp_path_factory) -> pathlib.Path:
    """A scratch directory in the state the install block leaves, for the README's tour."""
    return installed_copy(installed_template, tmp_path_factory.mktemp("readme") / "tour")


def test_every_readme_code_block_runs(readme_workdir):
    blocks = readme_blocks((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    assert any(block.runs for block in blocks), "README.md has no python or sh blocks"
    failures = failures_of(blocks, readme_workdir)
    assert not failures, f"{len(failures)} README block(s) fail:\n" + "\n".join(failures)


def docs_pages() -> list[pathlib.Path]:
    """The docs pages whose blocks are tests: every docs/*.md."""
    return sorted(DOCS_DIR.glob("*.md"))


def page_blocks(page: pathlib.Path) -> list[Block]:
    """A docs page's code blocks, named by their path from the repository root."""
    return readme_blocks(page.read_text(encoding="utf-8"), f"docs/{page.name}")


def docs_block_params() -> list:
    """One pytest parameter per python or sh block of every docs page: (page name, index of the block in the page)."""
    return [pytest.param(page.name, index, id=f"{page.name}:{block.line}")
            for page in docs_pages() for index, block in enumerate(page_blocks(page)) if block.runs]


@dataclasses.dataclass
class PageRun:
    directory: pathlib.Path
    blocks_run: int = 0  # blocks [0, blocks_run) of the page have run once in ``directory``


@pytest.fixture(scope="module")
def docs_runs(installed_template, tmp_path_factory) -> Callable[[str], PageRun]:
    """Per docs page, its scratch directory and how far its blocks have run; made on first use of the page."""
    runs: dict[str, PageRun] = {}
    root = tmp_path_factory.mktemp("docs")

    def run_of(page_name: str) -> PageRun:
        if page_name not in runs:
            runs[page_name] = PageRun(installed_copy(installed_template, root / pathlib.Path(page_name).stem))
        return runs[page_name]
    return run_of


@pytest.mark.parametrize(("page_name", "index"), docs_block_params())
def test_docs_code_block_runs(page_name, index, docs_runs):
    blocks = page_blocks(DOCS_DIR / page_name)
    block = blocks[index]
    reason = block.skip_reason()
    if reason is not None:
        pytest.skip(f"{block.source}:{block.line}: {reason}")
    run = docs_runs(page_name)
    earlier = [earlier for earlier in blocks[run.blocks_run:index] if earlier.runs and earlier.skip_reason() is None]
    failed_before = failures_of(earlier, run.directory, rounds=1)
    run.blocks_run = max(run.blocks_run, index + 1)
    assert not failed_before, "an earlier block of the page fails, so this one cannot run as a reader would:\n" + \
        "\n".join(failed_before)
    failures = failures_of([block], run.directory, rounds=2)
    assert not failures, "\n".join(failures)


def test_docs_pages_have_blocks_to_run():
    """The pages with examples are found (a fence the parser missed would silently test nothing)."""
    ids = [param.id for param in docs_block_params()]
    pages = {identifier.split(":")[0] for identifier in ids}
    assert {"beam-io.md", "reader.md", "sequences.md", "stats-export.md"} <= pages, ids


def test_a_broken_docs_block_fails(installed_template, tmp_path):
    """A docs block that breaks fails its test, named by page and line; one whose earlier block broke says so."""
    page = "# A page\n\n```sh\ntfrbeam verify out/demo\n```\n\n```python\nraise SystemExit('broken example')\n```\n"
    blocks = readme_blocks(page, "docs/broken.md")
    directory = installed_copy(installed_template, tmp_path / "page")
    assert failures_of(blocks[:1], directory) == []
    assert failures_of(blocks, directory, rounds=1) == [
        "docs/broken.md:7 (python, exit 1) \"raise SystemExit('broken example')\": broken example"]


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown text's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    inside_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside_fence = not inside_fence
        elif not inside_fence and re.match(r"^#{1,6} ", line):
            heading = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", heading).replace(" ", "-"))
    return anchors


def broken_links(path: pathlib.Path) -> list[str]:
    """Relative links of a Markdown file (outside code blocks) to a missing file or a missing heading anchor."""
    text = path.read_text(encoding="utf-8")
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    broken = []
    for target in _LINK.findall(prose):
        if _EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{path.name}: {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{path.name}: {target}: no heading with that anchor")
    return broken


def test_heading_anchors_and_broken_links_are_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# The columnar fast path — Arrow ↔ Example\n## `stats.json`\n```sh\n# not a heading\n```\n"
                    "[ok](#statsjson) [ok](page.md#the-columnar-fast-path--arrow--example) [web](https://x.org/#y)\n"
                    "[gone](other.md) [no anchor](#nothing)\n```text\n[in code](missing.md)\n```\n", encoding="utf-8")
    assert heading_anchors(page.read_text(encoding="utf-8")) == {"the-columnar-fast-path--arrow--example", "statsjson"}
    assert broken_links(page) == ["page.md: other.md: no such file", "page.md: #nothing: no heading with that anchor"]


def test_every_relative_link_resolves():
    """README.md and every docs page link only to files and headings that exist (the reference moved into docs/)."""
    broken = [line for path in [REPO_ROOT / "README.md", *docs_pages()] for line in broken_links(path)]
    assert not broken, "\n".join(broken)


def test_readme_links_every_docs_page():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    index = (DOCS_DIR / "README.md").read_text(encoding="utf-8")
    pages = [page.name for page in docs_pages() if page.name != "README.md"]
    assert [page for page in pages if f"(docs/{page})" not in readme] == []
    assert [page for page in pages if f"({page})" not in index] == []


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


_REPO_PATH = re.compile(r"(?<![\w./-])((?:tfrbeam|tests|benchmarks|pipelines|configs|\.ci)/[\w./*-]*[\w*])")


def repo_paths_named(text: str) -> set[str]:
    """Paths of this repository a page names (``tfrbeam/...``, ``tests/...``), globs and output paths left out."""
    return {path for path in _REPO_PATH.findall(text) if "*" not in path and not path.startswith("tests/data/")}


def test_repo_paths_are_found_in_text():
    text = "see `tfrbeam/codec/decode.py`, tests/builder/pipeline/test_graph.py and out/demo; not tfrbeam/x/*.py"
    assert repo_paths_named(text) == {"tfrbeam/codec/decode.py", "tests/builder/pipeline/test_graph.py"}


def test_every_module_and_test_path_the_docs_name_exists():
    """A restructure that moves a module or a test must move its mentions too."""
    missing = []
    for page in [REPO_ROOT / "README.md", *sorted(DOCS_DIR.glob("*.md"))]:
        for path in sorted(repo_paths_named(page.read_text())):
            if not (REPO_ROOT / path.rstrip(".")).exists():
                missing.append(f"{page.relative_to(REPO_ROOT)}: {path}")
    assert missing == []
