"""Property: whatever is done to a real dataset's manifest, shards or the files beside them, every reading tool
either refuses in one line or gives exactly the manifest's data, and nothing outside the dataset changes.

The tools: ``verify``, ``stats``, ``export``, ``inspect`` and ``cat`` through the CLI's ``main(argv)``
in-process, and ``open_dataset``. A refusal is exit 1 or 2 with no traceback (one stderr line;
``verify`` prints its FAIL lines on stdout), or for ``open_dataset`` a ``TfrbeamError`` of one
line (a listed shard that is gone included). Success must give the
manifest's numbers, and the manifest's numbers must be the files':
each split's ``num_examples`` (stats, export rows, records read) is the count of records really
in the shards it lists, and ``verify`` passes only an intact dataset. The sandbox around the
dataset (with an outside directory that symlinks point into) is snapshotted before and after.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pathlib
import shutil
import signal
import tempfile
from typing import Any

import pyarrow.parquet as pq
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from tests.integration.sandbox import changed_outside, cut_at_record, record_offsets, snapshot
from tfrbeam.cli.main import main as cli_main
from tfrbeam.dataset import open_dataset
from tfrbeam.errors import TfrbeamError

HOSTILE_VALUES = [None, "abc", "", -5, -1, 0, 1, 2**40, 2**63, 1.5, float("inf"), True, [], [-1], [2**40], {}, {"a": 1},
                  "/etc/hostname", "../outside/precious.txt", "train/../../outside/x", "a\\b", "nul\x00", "x" * 300,
                  "train", "eval/eval-00000-of-00001.tfrecord", "Example", "gzip", "tfrbeam-dataset/1"]
SHARD_DAMAGE = ["truncate", "cut at a record", "flip a byte", "symlink outside", "symlink to another shard", "delete",
                "empty"]
BESIDE = ["none", "index dir symlinked out", "stats temp symlinked out", "stats.json symlinked out",
          "garbage read index", "extra shard", "export output symlinked out"]


def _key_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path (dict keys and list indexes) of a JSON value, in a stable order."""
    paths = []
    if isinstance(value, dict):
        for key in value:
            paths.append(prefix + (key,))
            paths += _key_paths(value[key], prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value[:3]):
            paths.append(prefix + (index,))
            paths += _key_paths(item, prefix + (index,))
    return paths


def _mutate_manifest(manifest: dict, data: st.DataObject) -> None:
    paths = _key_paths(manifest)
    path = paths[data.draw(st.integers(0, len(paths) - 1), label="key")]
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    action = data.draw(st.sampled_from(["delete", "set", "rename"]), label="action")
    if action == "delete":
        del parent[path[-1]]
    elif action == "set":
        parent[path[-1]] = data.draw(st.sampled_from(HOSTILE_VALUES), label="value")
    elif isinstance(parent, dict):
        parent[data.draw(st.sampled_from(["../victim", "/abs", ".hidden", "lake", "eval"]), label="name")] = (
            parent.pop(path[-1]))
    else:
        parent.reverse()


def _damage_shard(dataset: pathlib.Path, outside: pathlib.Path, data: st.DataObject) -> None:
    shards = sorted(dataset.glob("*/*.tfrecord"))
    shard = shards[data.draw(st.integers(0, len(shards) - 1), label="shard")]
    how = data.draw(st.sampled_from(SHARD_DAMAGE), label="damage")
    size = shard.stat().st_size
    if how == "truncate":
        with open(shard, "r+b") as handle:
            handle.truncate(data.draw(st.integers(0, size - 1), label="length"))
    elif how == "cut at a record":
        cut_at_record(shard, data.draw(st.integers(0, len(record_offsets(shard)) - 1), label="records"))
    elif how == "flip a byte":
        position = data.draw(st.integers(0, size - 1), label="position")
        with open(shard, "r+b") as handle:
            handle.seek(position)
            byte = handle.read(1)[0]
            handle.seek(position)
            handle.write(bytes([byte ^ (1 << data.draw(st.integers(0, 7), label="bit"))]))
    elif how == "symlink outside":
        shard.unlink()
        shard.symlink_to(outside / "copy.tfrecord")
    elif how == "symlink to another shard":
        other = shards[(shards.index(shard) + 1) % len(shards)]
        shard.unlink()
        shard.symlink_to(other)
    elif how == "delete":
        shard.unlink()
    else:
        shard.write_bytes(b"")


def _plant_beside(sandbox: pathlib.Path, dataset: pathlib.Path, outside: pathlib.Path, how: str) -> None:
    if how == "index dir symlinked out":
        shutil.rmtree(dataset / "train" / ".tfrbeam-index")
        (dataset / "train" / ".tfrbeam-index").symlink_to(outside, target_is_directory=True)
    elif how == "stats temp symlinked out":
        (dataset / ".stats.json.tmp").symlink_to(outside / "precious.txt")
    elif how == "stats.json symlinked out":
        (dataset / "stats.json").symlink_to(outside / "precious.txt")
    elif how == "garbage read index":
        for index in (dataset / "eval" / ".tfrbeam-index").iterdir():
            index.write_bytes(b"not an index")
    elif how == "extra shard":
        shutil.copy2(dataset / "eval" / "eval-00000-of-00001.tfrecord", dataset / "eval" / "eval-00001-of-00002.tfrecord")
    elif how == "export output symlinked out":
        (sandbox / "out").mkdir()
        (sandbox / "out" / "train").symlink_to(outside, target_is_directory=True)


def _true_counts(pristine: pathlib.Path) -> dict[str, int]:
    """Records in each pristine shard, by manifest path."""
    return {str(path.relative_to(pristine)): len(record_offsets(path)) for path in sorted(pristine.glob("*/*.tfrecord"))}


def _manifest(dataset: pathlib.Path) -> Any:
    with contextlib.suppress(ValueError, OSError, RecursionError):
        return json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return None


def _consistent_counts(manifest: Any, dataset: pathlib.Path, pristine: pathlib.Path, truth: dict[str, int],
                       only: str | None = None) -> dict:
    """{split: examples} as the manifest says (of split ``only``, else all), asserted to be what its (untouched) shards
    really hold."""
    counts = {}
    for name, split in manifest["splits"].items():
        if only is not None and name != only:
            continue
        listed = [shard["path"] for shard in split["shards"]]
        for path in listed:  # a tool that succeeded read these: they must be the build's own, untouched
            assert (dataset / path).read_bytes() == (pristine / path).read_bytes(), path
        assert split["num_examples"] == sum(truth[path] for path in listed), (name, split["num_examples"])
        counts[name] = split["num_examples"]
    return counts


TOOL_SECONDS = int(os.environ.get("MUTATION_TOOL_SECONDS", "60"))  # a tool that hangs on bad input fails too


@contextlib.contextmanager
def _time_limit(what: list[str]):
    def expire(signum, frame):
        raise TimeoutError(f"{what} ran more than {TOOL_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TOOL_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    with _time_limit(argv):
        code = cli_main(argv)
    captured = capsys.readouterr()
    assert code in (0, 1, 2), (argv, code, captured)
    assert "Traceback" not in captured.out + captured.err, (argv, captured)
    if code and argv[0] != "verify":
        assert len(captured.err.strip().splitlines()) == 1, (argv, captured.err)
    return code, captured.out, captured.err


def _run_every_tool(capsys, sandbox: pathlib.Path, dataset: pathlib.Path, pristine: pathlib.Path,
                    truth: dict[str, int]) -> None:
    manifest = _manifest(dataset)
    code, out, _ = _cli(capsys, ["verify", str(dataset)])
    if code == 0:
        _consistent_counts(manifest, dataset, pristine, truth)
    else:
        assert "FAIL" in out
    code, _, _ = _cli(capsys, ["stats", str(dataset)])
    if code == 0:
        counts = _consistent_counts(manifest, dataset, pristine, truth)
        stats = json.loads((dataset / "stats.json").read_text())
        assert {name: split["num_examples"] for name, split in stats["splits"].items()} == counts
    code, _, _ = _cli(capsys, ["export", str(dataset), str(sandbox / "out"), "--overwrite"])
    if code == 0:
        counts = _consistent_counts(manifest, dataset, pristine, truth)
        rows = {name: sum(pq.read_metadata(path).num_rows for path in (sandbox / "out" / name).glob("*.parquet"))
                for name in counts}
        assert rows == counts
    for command in (["inspect"], ["cat", "--limit", "3"]):
        for shard in sorted(str(path) for path in dataset.glob("*/*.tfrecord") if path.exists()):
            _cli(capsys, command + [shard])
    for split, raw in itertools.product(("train", "eval"), (False, True)):  # raw: counted even with no features
        try:
            with _time_limit(["open_dataset", split]):
                read = sum(batch.num_rows for batch in open_dataset(str(dataset), split=split, output="arrow",
                                                                      batch_size=4096, raw=raw))
        except TfrbeamError as error:  # a listed shard that is gone is MissingShardError, one line naming it
            assert "\n" not in str(error).strip(), str(error)
            continue
        counts = _consistent_counts(manifest, dataset, pristine, truth, only=split)
        assert read == counts[split] or (not raw and not manifest.get("features")), (split, raw, read)


# MUTATIONS=200 runs more examples; no shrink phase: shrinking a failure here takes many minutes.
@settings(max_examples=int(os.environ.get("MUTATIONS", "25")), deadline=None,
          phases=[Phase.explicit, Phase.reuse, Phase.generate],
          # capsys is read out after every command
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_tool_refuses_in_one_line_or_gives_the_manifests_data(demo_dataset, capsys, data):
    with tempfile.TemporaryDirectory(prefix="mutation-") as temp:
        sandbox = pathlib.Path(temp)
        dataset = sandbox / "ds"
        shutil.copytree(demo_dataset, dataset, copy_function=shutil.copy2, symlinks=True)
        outside = sandbox / "outside"
        outside.mkdir()
        (outside / "precious.txt").write_text("the user's file")
        shutil.copy2(dataset / "train" / "train-00000-of-00004.tfrecord", outside / "copy.tfrecord")
        truth = _true_counts(demo_dataset)
        target = data.draw(st.sampled_from(["manifest", "shard", "both", "beside"]), label="target")
        if target in ("manifest", "both"):
            manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
            for _ in range(data.draw(st.integers(1, 2), label="manifest edits")):
                _mutate_manifest(manifest, data)
            (dataset / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
        if target in ("shard", "both"):
            _damage_shard(dataset, outside, data)
        _plant_beside(sandbox, dataset, outside, data.draw(st.sampled_from(BESIDE), label="beside")
                      if target == "beside" else "none")
        before = snapshot(sandbox)
        _run_every_tool(capsys, sandbox, dataset, demo_dataset, truth)
        assert changed_outside(before, snapshot(sandbox), ("ds", "out")) == {}
