"""Publishing keeps every file of the user's, and the output folder's mode and owner (issue 43, items 7, 8, 9).

Each test snapshots the output's parent directory (every path with its kind, mode, owner and a hash of its
content) before and after a build, and checks that only the dataset's own files changed: the files the old
manifest or the new one lists (shards, their indexes, the manifest, the old dataset's statistics) and the
directories holding them. Where keeping a file is impossible, the build refuses before it changes anything and
names the file.
"""

from __future__ import annotations

import csv
import hashlib
import os
import pathlib
import re
import shutil
import stat
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from tfrbeam.builder import run
from tfrbeam.errors import ManifestError, OutputExistsError, OutputNotWritableError
from tfrbeam.layout.manifest import read_manifest, verify_dataset

ROWS = 60
REFUSALS = (OutputExistsError, OutputNotWritableError, ManifestError)  # each one line naming the path, nothing changed
Snapshot = dict[str, tuple[Any, ...]]


def write_rows(directory: pathlib.Path) -> pathlib.Path:
    rows = directory / "rows.csv"
    with open(rows, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "score"])
        for i in range(ROWS):
            writer.writerow([i, i * 0.5])
    return rows


def config(rows: pathlib.Path, output: pathlib.Path, splits: tuple[str, ...], seed: int = 1,
           **output_keys: Any) -> dict[str, Any]:
    """A one-shard-per-split CSV build of ``rows`` into ``output``."""
    return {"input": {"format": "csv", "path": str(rows)}, "splits": {name: 1 / len(splits) for name in splits},
            "shuffle": {"seed": seed}, "output": {"path": str(output), "num_shards": 1, **output_keys}}


def build(rows: pathlib.Path, output: pathlib.Path, splits: tuple[str, ...], overwrite: bool = True, seed: int = 1,
          **output_keys: Any) -> None:
    run(config(rows, output, splits, seed, **output_keys), overwrite=overwrite, progress=False)


def snapshot(parent: pathlib.Path) -> Snapshot:
    """Every path under ``parent``: (kind, mode, uid, gid, content hash or link target); the parent itself as ".."."""
    found: Snapshot = {}
    for directory, dirs, files in os.walk(parent):
        for name in [*dirs, *files]:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, parent)] = _entry(path)
    found[".."] = _entry(str(parent))
    return found


def _entry(path: str) -> tuple[Any, ...]:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        kind, content = "link", os.readlink(path)
    elif stat.S_ISDIR(info.st_mode):
        kind, content = "dir", None
    elif stat.S_ISREG(info.st_mode):
        kind, content = "file", hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
    else:
        kind, content = "other", None
    return kind, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid, content


def own_files(manifest: dict | None, with_stats: bool) -> set[str]:
    """The files a dataset's manifest makes its own, relative to the dataset directory (written out here, not taken
    from the library, so a wrong rule there cannot pass)."""
    if manifest is None:
        return set()
    own = {"tfrbeam_dataset.json", *(("stats.json", "stats.html") if with_stats else ())}
    for split, entry in manifest["splits"].items():
        for shard in entry["shards"]:
            directory, name = os.path.split(shard["path"])
            own |= {shard["path"], f"{directory}/.tfrbeam-index/{name}.index", f"{directory}/.tfrbeam-index/{name}.idx",
                    f"{directory}/.tfrbeam-index/{name}.offsets", f"dali/{split}/{name}.idx"}
    own |= set((manifest.get("bad_records") or {}).get("files") or ())
    return own


def assert_only_the_dataset_changed(before: Snapshot, after: Snapshot, output_name: str, old: dict | None,
                                    new: dict | None) -> None:
    """Only the old and the new dataset's own files (and the folders holding them) differ; every folder kept keeps its
    mode and owner."""
    own = {f"{output_name}/{relative}" for relative in own_files(old, True) | own_files(new, False)}
    for path in sorted(before.keys() | after.keys()):
        was, now = before.get(path), after.get(path)
        if was == now or path in own:
            continue
        assert path.startswith(output_name + "/") or path == output_name, f"{path} changed outside the output"
        if was is not None and now is not None:
            raise AssertionError(f"{path} changed: {was} -> {now}")
        entry = was or now
        assert entry is not None and entry[0] == "dir", f"{path} {'vanished' if now is None else 'appeared'}: {entry}"
        assert any(item.startswith(path + "/") for item in own), f"the folder {path} came or went, holding none of the dataset's"


def plant(root: pathlib.Path, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)


@pytest.fixture()
def rows(tmp_path) -> pathlib.Path:
    return write_rows(tmp_path)


def _manifest(output: pathlib.Path) -> dict | None:
    return read_manifest(str(output)).to_dict() if (output / "tfrbeam_dataset.json").is_file() else None


# ------------------------------------------------------------------ item 7: a folder of user files, no dataset


def test_overwrite_into_a_folder_of_user_files_keeps_every_one(rows, tmp_path):
    """Item 7: a folder that is no dataset, with train/ of its own: --overwrite keeps every file, train/ merged."""
    output = tmp_path / "out" / "ds"
    mine = {"train/mydata.csv": b"a,b\n1,2\n", "train/notes.md": b"notes", "dali/my.idx": b"0 1\n",
            ".tfrbeam-notes": b"dot", "test/x/deep.txt": b"deep", "README": b"readme"}
    plant(output, mine)
    before = snapshot(tmp_path / "out")
    build(rows, output, ("train", "eval"))
    assert {relative: (output / relative).read_bytes() for relative in mine} == mine
    assert_only_the_dataset_changed(before, snapshot(tmp_path / "out"), "ds", None, _manifest(output))


@pytest.mark.parametrize("name", ["stats.json", "stats.html"])
def test_a_users_statistics_file_in_a_folder_that_is_no_dataset_is_refused_and_named(rows, tmp_path, name):
    """Item 7: stats.json and stats.html are names of the dataset's own (tfrbeam stats writes them, a replace drops
    them), so a user's file of that name cannot be kept in a dataset: refused before anything changes, named."""
    output = tmp_path / "out" / "ds"
    plant(output, {name: b"{}", "train/notes.md": b"notes"})
    before = snapshot(tmp_path / "out")
    with pytest.raises(OutputExistsError, match=re.escape(str(output / name))):
        build(rows, output, ("train", "eval"))
    assert snapshot(tmp_path / "out") == before


@pytest.mark.parametrize("name", ["stats.json", "stats.html"])
def test_a_users_folder_named_like_the_statistics_in_a_dataset_is_refused_and_named(rows, tmp_path, name):
    """A dataset's statistics are files: a folder of that name in a dataset (found by the property test below, holding
    a file the replace deleted) is the user's, and the new dataset needs the name: refused before anything changes."""
    output = tmp_path / "out" / "ds"
    build(rows, output, ("train", "eval"), overwrite=False)
    plant(output, {f"{name}/train": b"mine"})
    before = snapshot(tmp_path / "out")
    with pytest.raises(OutputExistsError, match=re.escape(str(output / name))):
        build(rows, output, ("train", "eval"))
    assert snapshot(tmp_path / "out") == before


# ------------------------------------------------------------------ item 8: new split names over user folders


def test_a_replace_with_new_split_names_keeps_the_users_folder_of_that_name(rows, tmp_path):
    """Item 8: a train/eval dataset replaced by a train/test one, the user's test/ folder beside it: kept, merged."""
    output = tmp_path / "out" / "ds"
    build(rows, output, ("train", "eval"), overwrite=False)
    old = _manifest(output)
    mine = {"test/my_notes.txt": b"mine", "eval/notes.md": b"kept though eval goes", "train/NOTES.md": b"train notes"}
    plant(output, mine)
    os.chmod(output / "test", 0o750)
    before = snapshot(tmp_path / "out")
    build(rows, output, ("train", "test"))
    assert {relative: (output / relative).read_bytes() for relative in mine} == mine
    assert_only_the_dataset_changed(before, snapshot(tmp_path / "out"), "ds", old, _manifest(output))
    assert verify_dataset(str(output)) != []  # the user's files in split folders are reported as unlisted, not lost


@pytest.mark.parametrize(("old_splits", "planted", "named"), [
    (None, {"train": b"a file where the split folder goes"}, "train"),
    (("train", "eval"), {"test": b"a file where the split folder goes"}, "test"),
    (None, {"train/train-00000-of-00001.tfrecord": b"not ours"}, "train/train-00000-of-00001.tfrecord"),
    (("train", "eval"), {"test/test-00000-of-00001.tfrecord": b"a shard's exact name"}, "test/test-00000-of-00001.tfrecord"),
    (None, {"tfrbeam_dataset.json": b"{\"a TFDS\": \"dataset_info\"}"}, "tfrbeam_dataset.json"),
    (None, {"tfrbeam_dataset.json/inside": b"a folder where the manifest goes"}, "tfrbeam_dataset.json"),
])
def test_a_user_file_that_cannot_be_kept_is_refused_before_anything_changes(rows, tmp_path, old_splits, planted, named):
    """Where keeping a file is impossible (a file where a split folder goes, a shard's exact name, the manifest's
    name): refused in one line naming it, before the old dataset or any file is touched."""
    output = tmp_path / "out" / "ds"
    if old_splits is not None:
        build(rows, output, old_splits, overwrite=False)
    plant(output, planted)
    before = snapshot(tmp_path / "out")
    with pytest.raises(REFUSALS) as raised:
        build(rows, output, ("train", "test"))
    assert str(output / named) in str(raised.value) and "\n" not in str(raised.value)
    assert snapshot(tmp_path / "out") == before


def test_a_damaged_manifest_is_not_guessed_at(rows, tmp_path):
    """An unreadable tfrbeam_dataset.json may be anyone's (TFDS writes one too): --overwrite refuses, naming it, rather
    than guess which files beside it were a dataset's."""
    output = tmp_path / "out" / "ds"
    build(rows, output, ("train", "eval"), overwrite=False)
    (output / "tfrbeam_dataset.json").write_text("{ truncated")
    before = snapshot(tmp_path / "out")
    with pytest.raises(OutputExistsError, match=r"tfrbeam_dataset\.json"):
        build(rows, output, ("train", "eval"))
    assert snapshot(tmp_path / "out") == before


# ------------------------------------------------------------------ item 9: the folder's mode and owner


@pytest.mark.parametrize("mode", [0o700, 0o1777, 0o2770, 0o750])
@pytest.mark.parametrize("overwrite", [True, False])
def test_a_publish_keeps_the_output_folders_mode(rows, tmp_path, mode, overwrite):
    """Item 9: a replace and a same-config rebuild keep the output folder's mode, setgid and sticky bits included,
    and a kept split folder's mode too."""
    output = tmp_path / "out" / "ds"
    build(rows, output, ("train", "eval"), overwrite=False)
    os.chmod(output, mode)
    os.chmod(output / "train", 0o711)
    old = _manifest(output)
    before = snapshot(tmp_path / "out")
    build(rows, output, ("train", "eval"), overwrite=overwrite, seed=7 if overwrite else 1)
    assert stat.S_IMODE(os.stat(output).st_mode) == mode
    assert stat.S_IMODE(os.stat(output / "train").st_mode) == 0o711
    assert_only_the_dataset_changed(before, snapshot(tmp_path / "out"), "ds", old, _manifest(output))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user takes root")
def test_a_publish_keeps_the_output_folders_owner_and_group(rows, tmp_path):
    """Item 9: the output folder and kept split folders keep their owner and group; in a setgid folder the new
    dataset's folders and files get its group, as the kernel gives them to anything created there."""
    output = tmp_path / "out" / "ds"
    build(rows, output, ("train", "eval"), overwrite=False)
    os.chown(output, 65534, 65534)
    os.chmod(output, 0o2770)
    os.chown(output / "train", 65534, 0)
    build(rows, output, ("train", "test"))
    info = os.stat(output)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (65534, 65534, 0o2770)
    assert (os.stat(output / "train").st_uid, os.stat(output / "train").st_gid) == (65534, 0)
    test_dir = os.stat(output / "test")
    assert test_dir.st_gid == 65534 and test_dir.st_mode & stat.S_ISGID
    assert os.stat(output / "tfrbeam_dataset.json").st_gid == 65534


# ------------------------------------------------------------------ the property: random user trees


_NAMES = ("train", "test", "eval", "stats.json", "stats.html", "tfrbeam_dataset.json", "tfrbeam_dataset.json.bak",
          ".tfrbeam_dataset.json", "dali", "_errors", ".tfrbeam-index", ".tfrbeam-notes", "notes.md",
          "train-00000-of-00001.tfrecord", "eval-00000-of-00002.tfrecord", "my.idx")
_SPLIT_SETS = (("train", "eval"), ("train", "test"), ("test",), ("eval", "test"))
_BUILT: dict[tuple[str, ...], pathlib.Path] = {}


def _old_dataset(base: pathlib.Path, rows: pathlib.Path, splits: tuple[str, ...]) -> pathlib.Path:
    """One built dataset per split set, copied into each example (a build per example would be slow)."""
    if splits not in _BUILT:
        built = base / "built" / "-".join(splits)
        build(rows, built, splits, overwrite=False)
        _BUILT[splits] = built
    return _BUILT[splits]


_trees = st.lists(
    st.tuples(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3), st.sampled_from(["file", "dir", "link"]),
              st.booleans()),
    min_size=1, max_size=6,
)


@settings(max_examples=16)
@given(old_splits=st.one_of(st.none(), st.sampled_from(_SPLIT_SETS)), new_splits=st.sampled_from(_SPLIT_SETS),
       tree=_trees, dali=st.booleans())
def test_every_user_path_survives_an_overwrite_or_the_build_refuses_naming_one(tmp_path_factory, old_splits, new_splits,
                                                                               tree, dali):
    base = tmp_path_factory.getbasetemp() / "publish-property"
    base.mkdir(exist_ok=True)
    rows = base / "rows.csv" if (base / "rows.csv").exists() else write_rows(base)
    parent = pathlib.Path(tmp_path_factory.mktemp("example"))
    output = parent / "ds"
    output.mkdir()
    if old_splits is not None:
        shutil.copytree(_old_dataset(base, rows, old_splits), output, dirs_exist_ok=True, symlinks=True)
    planted = _plant_tree(parent, output, tree)
    old = _manifest(output)
    before = snapshot(parent)
    try:
        build(rows, output, new_splits, dali_index=dali)
    except REFUSALS as error:
        assert snapshot(parent) == before, "a refused build changed something"
        named = {str(path) for item in planted for path in (item, *item.parents) if parent in path.parents}
        assert any(path in str(error) for path in named), (error, planted)
        return
    assert_only_the_dataset_changed(before, snapshot(parent), "ds", old, _manifest(output))


def _plant_tree(parent: pathlib.Path, output: pathlib.Path, tree: list[tuple[list[str], str, bool]]) -> list[pathlib.Path]:
    """Plant files, folders and symlinks of the user's in the output (or beside it); returns what was planted."""
    planted = []
    for parts, kind, inside in tree:
        path = (output if inside else parent).joinpath(*parts)
        if any(ancestor.is_symlink() or ancestor.is_file() for ancestor in path.parents if parent in ancestor.parents):
            continue
        if os.path.lexists(path):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "file":
            path.write_bytes(("/".join(parts)).encode())
        elif kind == "dir":
            path.mkdir()
        else:
            path.symlink_to("/etc")
        planted.append(path)
    return planted
