"""What of an output is the user's, and how a publish keeps it: every path, and every kept folder's mode and owner.

A dataset owns, by name, only what its readable manifest makes its own (docs/commit.md, "What happens to
your files"): the manifest, the files it lists (shards, their read indexes, DALI indexes, dead letters, its
``schema.pbtxt``) and ``stats.json``/``stats.html``. Without a manifest nothing there is a dataset's. Everything else in the old
output is the user's and moves unchanged to the same path in the new dataset directory; a folder of the
user's where the new dataset has a folder of that name (a ``test/`` kept beside a new split ``test``) is
merged. Folders keep their mode (setgid and sticky bits included) and owner. Where a path of the user's
cannot be kept (a file where a new folder or file must go, a manifest that is no readable
manifest) the publish refuses before it changes anything, naming the path.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import posixpath
import stat
from collections.abc import Iterable

from tfrbeam.base import fileops
from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.filesystem import BEAM_FILES
from tfrbeam.errors import ManifestError, OutputExistsError, OutputNotWritableError
from tfrbeam.layout.manifest import dataset_files, find_manifest, read_manifest
from tfrbeam.layout.manifest_schema import Manifest
from tfrbeam.layout.names import MANIFEST_NAME, STATS_HTML, STATS_JSON

__all__ = ["DatasetNames", "KeepPlan", "carry_over", "check_folder_owner", "keep_folder_attributes", "keep_plan",
           "old_dataset_names", "refuse_conflicts"]

_LOG = logging.getLogger(__name__)

# A dataset's by name even before they exist: tfrbeam stats writes them into it, and a replace drops them.
RESERVED_FILES = (MANIFEST_NAME, STATS_JSON, STATS_HTML)


@dataclasses.dataclass(frozen=True)
class DatasetNames:
    """Relative paths a dataset owns in its directory: its files and the folders that hold them."""

    files: frozenset[str]
    folders: frozenset[str]

    @classmethod
    def of_manifest(cls, manifest: Manifest, manifest_name: str = MANIFEST_NAME) -> DatasetNames:
        """What a manifest named ``manifest_name`` makes its dataset's: the reserved names, that name, every listed file
        (TFDS's too), every split folder."""
        return cls.of({*RESERVED_FILES, manifest_name, *dataset_files(manifest)}, manifest.split_names)

    @classmethod
    def of_tree(cls, root: str) -> DatasetNames:
        """A new dataset as assembled on disk (local): every file and folder under ``root``, and the reserved names."""
        files, folders = set(RESERVED_FILES), set()
        for directory, subdirs, names in os.walk(root):
            relative = _relative(root, directory)
            if relative:
                folders.add(relative)
            for name in names + [name for name in subdirs if os.path.islink(os.path.join(directory, name))]:
                files.add(posixpath.join(relative, name) if relative else name)
        return cls.of(files, folders)

    @classmethod
    def of(cls, files: Iterable[str], folders: Iterable[str]) -> DatasetNames:
        """``files`` and ``folders``, with every folder holding one of them."""
        files = frozenset(files)
        return cls(files, frozenset({*folders, *(parent for path in files for parent in _parents(path))}))


NOTHING = DatasetNames(frozenset(), frozenset())


def _parents(relative: str) -> list[str]:
    parts = relative.split("/")[:-1]
    return ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]


def _relative(root: str, path: str) -> str:
    relative = os.path.relpath(path, root)
    return "" if relative == "." else relative.replace(os.sep, "/")


def _users_at_reserved_name(relative: str, path: str) -> bool:
    """A folder or link named stats.json/stats.html: a dataset's stats are files, so that one is the user's."""
    return relative in (STATS_JSON, STATS_HTML) and not stat.S_ISREG(os.lstat(path).st_mode)


def _is_folder(path: str) -> bool:
    """A real directory (a symlink to one is a file of the user's: never followed)."""
    return not os.path.islink(path) and os.path.isdir(path)


def old_dataset_names(root: str) -> DatasetNames:
    """What the dataset at ``root`` owns: nothing without a manifest; a manifest that cannot be read is refused.

    An unreadable manifest may be a damaged dataset's or another tool's (TFDS writes a ``dataset_info.json``,
    the name our manifest had before): which files beside it were a dataset's would be a guess, so
    ``OutputExistsError`` names it.
    """
    path = find_manifest(root, BEAM_FILES)
    if path is None:
        return NOTHING
    manifest, problem = None, "a symbolic link"
    try:
        if fs.is_remote(path) or not os.path.islink(path):
            manifest, problem = read_manifest(root, BEAM_FILES), "gone while it was read"
    except (ManifestError, OSError) as error:
        problem = (str(error).splitlines() or [type(error).__name__])[0][:300]
    if manifest is None:
        raise OutputExistsError(
            f"{path} is not a readable tfrbeam manifest ({problem}); "
            "tfrbeam does not guess which files beside it are a dataset's: move it away (or remove a damaged "
            "dataset by hand) and rerun; nothing was changed"
        )
    return DatasetNames.of_manifest(manifest, posixpath.basename(path))


@dataclasses.dataclass(frozen=True)
class KeepPlan:
    """The user's entries of an old output: those that move whole to the new dataset, and those that cannot."""

    moves: tuple[str, ...]
    conflicts: tuple[str, ...]


def keep_plan(old_root: str, old: DatasetNames, new: DatasetNames) -> KeepPlan:
    """Which of the user's entries in the local ``old_root`` move (files, links and whole folders), which cannot.

    A folder the old dataset uses, or one the new dataset has too, is gone into and its entries
    planned one by one; any other entry of the user's moves whole, unless the new dataset has a file
    or a folder of that path (a conflict: it cannot be kept there).
    """
    moves: list[str] = []
    conflicts: list[str] = []

    def visit(relative: str, blocked: bool) -> None:
        for name in sorted(os.listdir(os.path.join(old_root, relative))):
            child = f"{relative}/{name}" if relative else name
            if child in old.files and not _users_at_reserved_name(child, os.path.join(old_root, child)):
                continue
            if _is_folder(os.path.join(old_root, child)) and (child in old.folders or child in new.folders):
                visit(child, blocked or child in new.files)
            elif blocked or child in new.files or child in new.folders:
                conflicts.append(child)
            else:
                moves.append(child)

    if _is_folder(old_root):
        visit("", False)
    return KeepPlan(tuple(moves), tuple(conflicts))


def refuse_conflicts(output_root: str, plan: KeepPlan) -> None:
    """``OutputExistsError`` naming the user's paths that the new dataset cannot leave where they are."""
    if not plan.conflicts:
        return
    named = ", ".join(os.path.join(output_root, relative) for relative in plan.conflicts[:3])
    more = f" and {len(plan.conflicts) - 3} more" if len(plan.conflicts) > 3 else ""
    raise OutputExistsError(
        f"{named}{more}: not the old dataset's, and the new dataset needs that path (a split folder, a shard, the "
        "manifest, or stats.json/stats.html, which tfrbeam stats writes), so it cannot be kept there; move it away "
        "and rerun; nothing was changed"
    )


def carry_over(old_dir: str, output_root: str) -> None:
    """After the exchange: move the user's entries from the replaced directory into the new dataset, same paths.

    The publish refused conflicts before the exchange; one that arose since (a file put into the new
    dataset meanwhile) is kept beside it as ``NAME.previous``, with a warning, never dropped.
    """
    if not _is_folder(old_dir):
        return
    try:
        old = old_dataset_names(old_dir)
    except OutputExistsError:  # checked before the exchange; unreadable now, so every entry is kept
        old = NOTHING
    plan = keep_plan(old_dir, old, DatasetNames.of_tree(output_root))
    for relative in plan.conflicts:
        destination = _free_name(os.path.join(output_root, relative) + ".previous")
        _LOG.warning("kept your %s as %s: the new dataset has that path", os.path.join(output_root, relative), destination)
        _move(old_dir, output_root, relative, destination)
    for relative in plan.moves:
        _move(old_dir, output_root, relative, os.path.join(output_root, relative))


def _free_name(path: str) -> str:
    candidate, number = path, 1
    while os.path.lexists(candidate):
        number += 1
        candidate = f"{path}{number}"
    return candidate


def _move(old_dir: str, output_root: str, relative: str, destination: str) -> None:
    """Rename one entry across, first making its missing parent folders with the old ones' mode and owner."""
    for parent in _parents(relative):
        folder = os.path.join(output_root, parent)
        if not os.path.lexists(folder):
            fileops.makedirs(folder)
            _keep_identity(folder, os.lstat(os.path.join(old_dir, parent)))
    fs.rename_local(os.path.join(old_dir, relative), destination)


# ------------------------------------------------------------------------------ folders' mode and owner


def keep_folder_attributes(old_root: str, new_root: str, new: DatasetNames) -> None:
    """Before the exchange: each folder of the new dataset takes the mode and owner of the old output's folder of the
    same path; in a setgid folder, new folders and files take its group (and new folders its setgid bit), as the
    kernel gives them to anything created there. Refuses (naming the folder) an owner this process cannot give."""
    for relative in ["", *sorted(new.folders)]:  # parents first
        path = os.path.join(new_root, relative)
        if not _is_folder(path):
            continue
        old = os.path.join(old_root, relative)
        if _is_folder(old):
            _keep_identity(path, os.lstat(old))
        elif relative:
            _inherit_group(path, os.lstat(os.path.dirname(path.rstrip(os.sep))), folder=True)
    for relative in sorted(new.files):
        path = os.path.join(new_root, relative)
        if os.path.lexists(path) and not os.path.islink(path):
            _inherit_group(path, os.lstat(os.path.dirname(path)), folder=False)


def _keep_identity(path: str, source: os.stat_result) -> None:
    """Give ``path`` the owner, group and mode bits of ``source`` (owner first: a chown may clear setgid)."""
    found = os.lstat(path)
    if (found.st_uid, found.st_gid) != (source.st_uid, source.st_gid):
        _chown(path, source.st_uid, source.st_gid)
    mode = stat.S_IMODE(source.st_mode)
    if stat.S_IMODE(os.lstat(path).st_mode) != mode:
        fileops.mutating("chmod", path, lambda: os.chmod(path, mode))


def _inherit_group(path: str, parent: os.stat_result, folder: bool) -> None:
    if not parent.st_mode & stat.S_ISGID:
        return
    if os.lstat(path).st_gid != parent.st_gid:
        _chown(path, -1, parent.st_gid)
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if folder and not mode & stat.S_ISGID:
        fileops.mutating("chmod", path, lambda: os.chmod(path, mode | stat.S_ISGID))


def _chown(path: str, uid: int, gid: int) -> None:
    try:
        fileops.mutating("chown", path, lambda: os.chown(path, uid, gid, follow_symlinks=False))
    except PermissionError as error:
        if error.errno != errno.EPERM:  # not allowed to give that owner; EACCES and the like are file errors
            raise
        raise OutputNotWritableError(
            f"{path}: the folder it replaces belongs to uid {uid} gid {gid}, and this process (uid {os.geteuid()}) "
            "cannot give the new one that owner and group, which a publish keeps: run the build as that user (or "
            "root), or choose another output.path; nothing was published"
        ) from error


def check_folder_owner(output_root: str, shown: str) -> None:
    """Before a build runs: refuse an output folder whose owner or group this process could not give its new folder."""
    if fs.is_remote(output_root) or not _is_folder(output_root) or os.geteuid() == 0:
        return
    info = os.lstat(output_root)
    groups = {os.getegid(), *os.getgroups()}
    if info.st_uid != os.geteuid() or info.st_gid not in groups:
        raise OutputNotWritableError(
            f"output.path {shown}: the folder belongs to uid {info.st_uid} gid {info.st_gid}, and a publish gives the "
            f"new dataset's folder the same owner and group, which this process (uid {os.geteuid()}) cannot: run "
            "the build as that user (or root), or choose another output.path"
        )
