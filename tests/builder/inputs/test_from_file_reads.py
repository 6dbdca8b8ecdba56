"""from_file reads are typed and bounded, and may be confined to a root (issue 43, item 4).

Measured before: a FIFO named in a from_file column hung the build (in Beam's localfilesystem._path_open); for
/dev/zero the bad row said "is 0 bytes, but max_file_bytes is 67108864"; a 5 GB sparse file was read for its first
64 MiB before its size was known; and no setting kept ``../../etc/passwd`` or absolute paths out. Each read runs
in a child process with a time limit and a memory budget, so a hang fails instead of stalling the suite.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import yaml

from tests.builder.inputs.bounded import run_bounded
from tfrbeam.builder.config import config_to_dict, parse_config
from tfrbeam.builder.features.file_contents import read_files
from tfrbeam.errors import ConfigError

_SETUP = "from tfrbeam.builder.features.file_contents import read_files\n"
_READ = "read = read_files([{path!r}], {base!r}, {max_bytes}, image=False)[0]\nraise SystemExit(repr((read.size, " \
        "read.data is not None, read.problem)))"


def _read_bounded(path: str, base: str = "/", max_bytes: int | None = 64 << 20) -> tuple:
    outcome = run_bounded(_READ.format(path=path, base=base, max_bytes=max_bytes), setup=_SETUP, timeout=30)
    assert outcome.type == "SystemExit", outcome
    assert outcome.seconds < 10 and outcome.rss_growth < 32 << 20, outcome
    return eval(outcome.error)  # the repr of (size, has data, problem)


def test_a_fifo_is_refused_in_one_line_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "image.png"
    os.mkfifo(fifo)
    assert _read_bounded(str(fifo)) == (-1, False, f"{fifo} is a FIFO (named pipe), not a regular file; from_file "
                                                    "reads regular files only")


def test_a_link_to_dev_zero_is_named_a_character_device_not_a_0_byte_file(tmp_path):
    link = tmp_path / "zeros.bin"
    link.symlink_to("/dev/zero")
    assert _read_bounded(str(link)) == (-1, False, f"{link} is a character device, not a regular file; from_file "
                                                    "reads regular files only")


def test_a_directory_is_refused_and_a_header_read_is_typed_too(tmp_path):
    assert _read_bounded(str(tmp_path)) == (-1, False, f"{tmp_path} is a directory, not a regular file; from_file "
                                                        "reads regular files only")
    fifo = tmp_path / "header.png"
    os.mkfifo(fifo)
    outcome = run_bounded(f"read = read_files([{str(fifo)!r}], '/', None, image=True)[0]\n"
                          "raise SystemExit(read.problem)", setup=_SETUP, timeout=30)
    assert outcome.error == f"{fifo} is a FIFO (named pipe), not a regular file; from_file reads regular files only"


def test_a_sparse_5_gb_file_is_sized_without_reading_it(tmp_path):
    sparse = tmp_path / "huge.bin"
    with open(sparse, "wb") as handle:
        handle.truncate(5 << 30)
    assert _read_bounded(str(sparse)) == (5 << 30, False, None)  # the feature names size and limit (below)


def _tree(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "root"
    (root / "images").mkdir(parents=True)
    (root / "images" / "cat.png").write_bytes(b"cat")
    (root / "images" / "alias.png").symlink_to(root / "images" / "cat.png")  # a link that stays inside
    (tmp_path / "secret.txt").write_bytes(b"secret")
    (root / "images" / "out.png").symlink_to(tmp_path / "secret.txt")  # a link that leads out
    (root / "images" / "up").symlink_to(tmp_path)  # a directory link that leads out
    return root


def test_file_root_confines_paths_dotdot_absolute_and_symlinks_out(tmp_path):
    root = _tree(tmp_path)
    base = str(root / "images")
    paths = ["cat.png", "alias.png", "../images/cat.png", "../../secret.txt", str(tmp_path / "secret.txt"),
             "out.png", "up/secret.txt", "gs://bucket/cat.png"]
    reads = read_files(paths, base, 1 << 20, image=False, confine=str(root))
    assert [read.data for read in reads[:3]] == [b"cat"] * 3
    secret = str(tmp_path / "secret.txt")
    assert [read.data for read in reads[3:]] == [None] * 5
    assert [read.problem for read in reads[3:]] == [
        f"{secret} is outside file_root {root} (only files under it are read)",
        f"{secret} is outside file_root {root} (only files under it are read)",
        f"{base}/out.png leads outside file_root {root} through a symlink (to {secret})",
        f"{base}/up/secret.txt leads outside file_root {root} through a symlink (to {secret})",
        f"gs://bucket/cat.png is outside file_root {root} (only files under it are read)",
    ]


def test_an_object_store_root_confines_by_prefix():
    reads = read_files(["gs://bucket/data/../other/x.png", "gs://bucket/database/x.png", "/tmp/x.png"],
                       "gs://bucket/data", 1 << 20, image=False, confine="gs://bucket/data")
    assert [read.problem for read in reads] == [
        f"{path} is outside file_root gs://bucket/data (only files under it are read)"
        for path in ("gs://bucket/data/../other/x.png", "gs://bucket/database/x.png", "/tmp/x.png")]


def test_file_root_is_a_feature_key_of_from_file_inherited_by_image_facts_and_round_trips():
    raw = {"input": {"path": "labels.csv"}, "output": {"path": "out"},
           "features": {"image": {"source": "path", "from_file": True, "file_root": "pets", "image": ["height"]}}}
    config = parse_config(raw)
    assert [spec.file.file_root for spec in config.features] == ["pets", "pets"]
    assert parse_config(config_to_dict(config)) == config
    raw["features"] = {"label": {"type": "bytes", "file_root": "pets"}}
    with pytest.raises(ConfigError, match=r"features.label.file_root: is only used with from_file"):
        parse_config(raw)


def test_a_build_naming_a_fifo_and_a_path_out_of_file_root_fails_in_seconds_naming_both(tmp_path):
    root = _tree(tmp_path)
    os.mkfifo(root / "images" / "pipe.png")
    (root / "labels.csv").write_text("path,label\nimages/cat.png,cat\nimages/pipe.png,pipe\n../secret.txt,s\n")
    config = {"input": {"path": str(root / "labels.csv")},
              "features": {"image": {"source": "path", "from_file": True, "file_root": "."},
                           "label": {"type": "bytes"}},
              "output": {"path": str(tmp_path / "out"), "num_shards": 1},
              "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.9}}
    (root / "build.yaml").write_text(yaml.safe_dump(config))
    outcome = run_bounded(f"""
        import os
        os.chdir({str(root)!r})
        raise SystemExit(build_main([{str(root / "build.yaml")!r}, "--quiet"]))
    """, setup="from tfrbeam.cli.build import main as build_main", budget=2 << 30, timeout=120)
    assert (outcome.type, outcome.error) == ("SystemExit", "0"), outcome
    letters = [json.loads(line) for path in sorted((tmp_path / "out" / "_errors").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    assert sorted((entry["line"], entry["reason"]) for entry in letters) == [
        (3, f"feature 'image' (column 'path'): {root}/images/pipe.png is a FIFO (named pipe), not a regular file; "
            "from_file reads regular files only"),
        (4, f"feature 'image' (column 'path'): {tmp_path}/secret.txt is outside file_root {root} (only files under "
            "it are read)"),
    ]
