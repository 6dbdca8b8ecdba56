"""Applies each known mutation of the library to a scratch copy of the repository and checks a test kills it.

Every mutation here once passed the whole suite (issue 15). For each one this copies the tracked
and new files into a temporary directory, replaces exactly one snippet of library code, runs the
tests that should catch it and fails unless they do. The working tree is never touched.

    python .ci/mutants.py            # all of them
    python .ci/mutants.py --list     # their names
    python .ci/mutants.py utf16-name-order shuffle-files-ignored
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation(
        "dead-letters-first-batch-only",
        "tfrbeam/builder/pipeline/graph.py",
        "rows = sorted((row for batch in batches for row in batch)",
        "rows = sorted((row for batch in list(batches)[:1] for row in batch)",
        ("tests/builder/test_bad_rows_across_batches.py::test_dead_letters_hold_every_bad_row_of_every_batch",),
    ),
    Mutation(
        "shuffle-files-ignored",
        "tfrbeam/dataset/pipeline.py",
        "if not self.options.shuffle_files:",
        "if True:",
        ("tests/dataset/test_file_order.py",),
    ),
    Mutation(
        "utf16-name-order",
        "tfrbeam/codec/encode.py",
        'columns.sort(key=lambda column: column.name.encode("utf-8"))',
        'columns.sort(key=lambda column: column.name.encode("utf-16-be"))',
        ("tests/codec/test_encode.py",),
    ),
    Mutation(
        "max-bad-fraction-at-limit-fails",
        "tfrbeam/builder/pipeline/commit.py",
        "return bad > 0 and bad > limit * rows_read",
        "return bad > 0 and bad >= limit * rows_read",
        ("tests/builder/test_bad_rows_across_batches.py",),
    ),
    Mutation(
        "shard-remainder-to-last-shard",
        "tfrbeam/builder/shuffle/balance.py",
        "        return -(-shard * self.num_examples // self.num_shards)\n\n"
        "    def shard_of(self, ranks: np.ndarray) -> np.ndarray:\n"
        "        return (np.asarray(ranks, dtype=np.int64) * self.num_shards) // max(self.num_examples, 1)",
        "        return self.num_examples if shard >= self.num_shards else shard * (self.num_examples // self.num_shards)\n\n"
        "    def shard_of(self, ranks: np.ndarray) -> np.ndarray:\n"
        "        return np.minimum(np.asarray(ranks, dtype=np.int64) // max(self.num_examples // self.num_shards, 1),"
        " self.num_shards - 1)",
        ("tests/builder/shuffle/test_balance.py",),
    ),
    Mutation(
        "sink-remainder-to-last-slice",
        "tfrbeam/beam/sink.py",
        "take = base + (1 if step < extra else 0)",
        "take = base + (extra if step == min(count, shards) - 1 else 0)",
        ("tests/beam/test_shard_slices.py",),
    ),
    Mutation(
        "facade-returns-the-module",
        "tfrbeam/__init__.py",
        "value = getattr(importlib.import_module(module), name)",
        "value = importlib.import_module(module)",
        ("tests/test_package.py",),
    ),
    Mutation(
        "crc-mask-constant",
        "tfrbeam/tfrecord/records.py",
        "_MASK_DELTA = 0xA282EAD8",
        "_MASK_DELTA = 0xA282EAD9",
        ("tests/tfrecord/test_records.py::test_the_mask_is_the_formats_rotation_plus_its_constant",
         "tests/tfrecord/test_records.py::test_crc_vectors_match_tensorflow"),
    ),
    Mutation(
        "truncated-stream-ends-cleanly",
        "tfrbeam/tfrecord/records.py",
        "            if not self._decoder.eof:\n                raise TruncatedRecordError(",
        "            if False:\n                raise TruncatedRecordError(",
        ("tests/tfrecord/test_records.py::test_a_compressed_stream_cut_anywhere_before_its_trailer_raises_truncated_stream",),
    ),
)


def _copy_repository(destination: pathlib.Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        relative = raw.decode()
        source = REPO / relative
        if source.is_file():
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _apply(root: pathlib.Path, mutation: Mutation) -> None:
    path = root / mutation.path
    text = path.read_text(encoding="utf-8")
    matches = text.count(mutation.old)
    if matches != 1:
        raise SystemExit(f"{mutation.name}: the snippet occurs {matches} times in {mutation.path}; update .ci/mutants.py")
    path.write_text(text.replace(mutation.old, mutation.new), encoding="utf-8")


def run(mutation: Mutation) -> bool:
    """True when the tests fail on the mutated copy (the mutant is killed)."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutation.name}-") as scratch:
        root = pathlib.Path(scratch)
        _copy_repository(root)
        _apply(root, mutation)
        # pytest.ini puts the copy's root first on sys.path, so the copy's tfrbeam is the one imported.
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *mutation.tests],
                              cwd=root, capture_output=True, text=True)
        imported = subprocess.run([sys.executable, "-c", "import tfrbeam; print(tfrbeam.__file__)"], cwd=root,
                                  capture_output=True, text=True, env={"PYTHONPATH": str(root)}).stdout.strip()
        if not imported.startswith(str(root)):
            raise SystemExit(f"{mutation.name}: the copy imports tfrbeam from {imported}, not from the copy")
        if done.returncode in (4, 5):
            raise SystemExit(f"{mutation.name}: pytest could not run the tests ({done.returncode}):\n{done.stdout[-2000:]}")
        killed = done.returncode != 0
        failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
        print(f"{'killed  ' if killed else 'SURVIVED'} {mutation.name:34} {failed[0][:160] if failed else ''}", flush=True)
        return killed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutations' names and exit")
    args = parser.parse_args(argv)
    if args.list:
        for mutation in MUTATIONS:
            print(f"{mutation.name:34} {mutation.path}")
        return 0
    known = {mutation.name: mutation for mutation in MUTATIONS}
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        parser.error(f"unknown mutations: {', '.join(unknown)} (see --list)")
    chosen = [known[name] for name in args.names] if args.names else list(MUTATIONS)
    survivors = [mutation.name for mutation in chosen if not run(mutation)]
    if survivors:
        print(f"{len(survivors)} mutant(s) survived: {', '.join(survivors)}", file=sys.stderr)
        return 1
    print(f"all {len(chosen)} mutants killed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
