"""Scan an image tree into a `Layout`: which files are train and val images, and of which class.

Three shapes are understood, tried in this order:

* the ILSVRC layout Kaggle ships: ``ILSVRC/Data/CLS-LOC/train/<wnid>/*.JPEG``, a flat
  ``ILSVRC/Data/CLS-LOC/val/*.JPEG`` labelled by ``LOC_val_solution.csv`` (``ImageId,PredictionString``;
  the first token of the prediction string is the wnid), names from ``LOC_synset_mapping.txt``
  (``<wnid> <names>`` per line);
* a split tree ``<root>/train/<class>/*`` with an optional ``<root>/val/<class>/*`` (the layout
  PyTorch's ImageNet scripts produce);
* a plain folder per class: ``<root>/<class>/*``, all of it train.

The class list is explicit and stable: it is the train class *folders* (``LOC_synset_mapping.txt``
when there is one), sorted, empty folders included — an empty class keeps its label and is reported
with an `EmptyClassesWarning`, so no later class is silently renumbered and two trees (or two splits,
or two slices of one tree) with the same folders always agree.

Only file names are read (no image is opened), so scanning 1.28 M files takes seconds.
"""

from __future__ import annotations

import csv
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from pinstorm.boards.safety import secrets

from .errors import InvalidPipelineInput, PipelineError

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".jpe", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
VAL_SOLUTION = "LOC_val_solution.csv"
SYNSET_MAPPING = "LOC_synset_mapping.txt"


log = secrets.logger(__name__)


class LayoutError(PipelineError, ValueError):
    """A folder that is not an image tree we understand, or whose label files contradict it."""


class EmptyClassesWarning(UserWarning):
    """Class folders (or mapping entries) without a single image: they keep their label, but no row has it."""


@dataclass
class Layout:
    """The images of a tree: `train` and `val` as (path, wnid) pairs, sorted by path.

    `classes` are the sorted class ids (wnids): every train class folder, empty ones included, or the
    wnids of ``LOC_synset_mapping.txt`` when it exists (val's when there is no train folder);
    `empty_classes` those without a train image. `names` maps each to a human name (the wnid itself
    when no mapping file exists).
    `unlabelled` lists val images the solution file does not mention; they are not in `val`.

    Attributes:
        root: The tree's folder.
        kind: ``"ilsvrc"``, ``"split-folders"`` or ``"folders"``.
        train: The training images' ``(path, wnid)`` pairs.
        val: The validation images' ``(path, wnid)`` pairs.
        classes: The sorted wnids.
        names: ``{wnid: human name}``.
        unlabelled: Val images the solution file does not mention.
        empty_classes: Classes without a train image.
    """

    root: Path
    kind: str  # "ilsvrc", "split-folders" or "folders"
    train: list[tuple[str, str]]
    val: list[tuple[str, str]]
    classes: list[str]
    names: dict[str, str]
    unlabelled: list[str] = field(default_factory=list)
    empty_classes: list[str] = field(default_factory=list)

    def items(self, split: str = "train") -> list[tuple[str, str]]:
        """The (path, wnid) pairs of one split, or a clear error when the split has none.

        Args:
            split: ``"train"`` or ``"val"``.

        Raises:
            LayoutError: The split has no labelled images.
        """
        if split not in ("train", "val"):
            raise InvalidPipelineInput(f"split must be 'train' or 'val', got {split!r}")
        items = self.train if split == "train" else self.val
        if not items:
            hint = ""
            if split == "val" and self.kind == "ilsvrc":
                hint = f" (is {VAL_SOLUTION} next to the ILSVRC folder?)"
            raise LayoutError(f"{self.root}: no labelled {split} images{hint}")
        return items

    def counts(self, split: str = "train") -> dict[str, int]:
        """Images per class of one split.

        Args:
            split: ``"train"`` or ``"val"``.

        Returns:
            ``{wnid: images}``, every class included.
        """
        counts = {wnid: 0 for wnid in self.classes}
        for _, wnid in (self.train if split == "train" else self.val):
            counts[wnid] = counts.get(wnid, 0) + 1
        return counts

    def __repr__(self) -> str:
        return (f"Layout({str(self.root)!r}, kind={self.kind!r}, train={len(self.train)}, val={len(self.val)}, "
                f"classes={len(self.classes)})")


def is_image_name(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES


class _LocalTree:
    """How the scan sees a local folder: `os.scandir`, and paths as the file system writes them."""

    @staticmethod
    def entries(folder):
        """(name, path, is a folder) of each entry of `folder` (symbolic links followed)."""
        with os.scandir(folder) as found:
            for entry in found:
                if not entry.name.startswith("."):
                    yield entry.name, entry.path, entry.is_dir(follow_symlinks=True)

    @staticmethod
    def is_dir(path) -> bool:
        return Path(path).is_dir()

    @staticmethod
    def is_file(path) -> bool:
        return Path(path).is_file()

    @staticmethod
    def shown(path) -> str:
        return str(path)

    @staticmethod
    def open_text(path, newline=None):
        return open(path, encoding="utf-8", newline=newline)


_LOCAL = _LocalTree()


class ListedTree:
    """A tree known from one listing (a bucket's, from fsspec's ``find``), scanned with the very rules of a
    local folder, with no local stand-in: its folders are `PurePosixPath`s below ``/``, its images' paths
    ``<url>/<relative path>``; `read(relative path)` gives the bytes of the label files the scan reads
    (``LOC_synset_mapping.txt``, ``LOC_val_solution.csv``), and nothing else is read.

    Args:
        url: The tree's URL: every image path (and message) starts with it.
        files: The relative paths (``a/b.JPEG``) of its files.
        folders: The relative paths of its folders (each file's parents are folders too).
        read: ``read(relative path) -> bytes`` for a label file.
    """

    def __init__(self, url: str, files, folders=(), read=None):
        self.url = url.rstrip("/")
        self._read = read
        self._children: dict[str, dict[str, bool]] = {"": {}}
        for relative, is_dir in [(f, True) for f in folders] + [(f, False) for f in files]:
            parts = relative.strip("/").split("/")
            for depth in range(len(parts)):
                parent, name = "/".join(parts[:depth]), parts[depth]
                child_is_dir = is_dir or depth < len(parts) - 1
                siblings = self._children.setdefault(parent, {})
                siblings[name] = siblings.get(name, False) or child_is_dir
                if child_is_dir:
                    self._children.setdefault("/".join(parts[:depth + 1]), {})

    @staticmethod
    def _relative(path) -> str:
        return str(path).strip("/")

    def entries(self, folder):
        relative = self._relative(folder)
        for name, is_dir in self._children.get(relative, {}).items():
            if not name.startswith("."):
                yield name, self.shown(f"{relative}/{name}" if relative else name), is_dir

    def is_dir(self, path) -> bool:
        return self._relative(path) in self._children

    def is_file(self, path) -> bool:
        parent, _, name = self._relative(path).rpartition("/")
        return self._children.get(parent, {}).get(name) is False

    def shown(self, path) -> str:
        relative = self._relative(path)
        return f"{self.url}/{relative}" if relative else self.url

    def open_text(self, path, newline=None):
        import io

        return io.StringIO(self._read(self._relative(path)).decode("utf-8"), newline=newline)


def _image_files(folder: Path, recursive: bool, tree=_LOCAL) -> list[str]:
    found = []
    for name, path, is_dir in tree.entries(folder):
        if is_dir:
            if recursive:
                found += _image_files(folder / name, recursive, tree)
        elif is_image_name(name):
            found.append(path)
    return found


def _subfolders(folder: Path, tree=_LOCAL) -> list[Path]:
    return sorted(folder / name for name, _, is_dir in tree.entries(folder) if is_dir)


def _class_tree(folder: Path, tree=_LOCAL) -> tuple[list[tuple[str, str]], list[str]]:
    """(path, class) for every image below each subfolder of `folder`, and every class folder's name."""
    items, folders = [], []
    for class_dir in _subfolders(folder, tree):
        folders.append(class_dir.name)
        items += [(path, class_dir.name) for path in _image_files(class_dir, recursive=True, tree=tree)]
    return sorted(items), folders


def _find_cls_loc(root: Path, tree=_LOCAL) -> Path | None:
    """The CLS-LOC folder when `root` is (or holds) an ILSVRC tree; else None."""
    candidates = [root / "ILSVRC" / "Data" / "CLS-LOC", root / "Data" / "CLS-LOC"]
    if root.name == "CLS-LOC":
        candidates.append(root)
    return next((c for c in candidates if tree.is_dir(c / "train")), None)


def _find_file(name: str, cls_loc: Path, root: Path, tree=_LOCAL) -> Path | None:
    """Label files sit next to the ILSVRC folder in Kaggle's download; accept a few other places too."""
    places = [root, cls_loc, *cls_loc.parents[:4]]
    for place in places:
        if tree.is_file(place / name):
            return place / name
    return None


def read_synset_mapping(path, tree=_LOCAL) -> dict[str, str]:
    """``<wnid> <names>`` per line -> {wnid: names}."""
    names = {}
    path_shown = tree.shown(path)
    with tree.open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line:
                continue
            wnid, _, text = line.partition(" ")
            if not wnid:
                raise LayoutError(f"{path_shown}:{number}: expected '<wnid> <names>', got {line!r}")
            names[wnid] = text.strip() or wnid
    return names


def read_val_solution(path, tree=_LOCAL) -> dict[str, str]:
    """``ImageId,PredictionString`` -> {image id: wnid (first token of the prediction)}."""
    labels = {}
    path_shown = tree.shown(path)
    with tree.open_text(path, newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"ImageId", "PredictionString"} <= set(reader.fieldnames):
            raise LayoutError(f"{path_shown}: expected columns ImageId,PredictionString, got {reader.fieldnames}")
        for number, row in enumerate(reader, start=2):
            tokens = (row["PredictionString"] or "").split()
            if not row["ImageId"] or not tokens:
                raise LayoutError(f"{path_shown}:{number}: empty ImageId or PredictionString")
            labels[row["ImageId"]] = tokens[0]
    return labels


def _scan_ilsvrc(root: Path, cls_loc: Path, tree=_LOCAL) -> Layout:
    train, folders = _class_tree(cls_loc / "train", tree)
    mapping_file = _find_file(SYNSET_MAPPING, cls_loc, root, tree)
    names = read_synset_mapping(mapping_file, tree) if mapping_file else {}
    val: list[tuple[str, str]] = []
    unlabelled: list[str] = []
    val_dir = cls_loc / "val"
    if tree.is_dir(val_dir):
        val_files = sorted(_image_files(val_dir, recursive=False, tree=tree))
        solution_file = _find_file(VAL_SOLUTION, cls_loc, root, tree)
        labels = read_val_solution(solution_file, tree) if solution_file else {}
        for path in val_files:
            wnid = labels.get(os.path.splitext(os.path.basename(path))[0])
            if wnid is None:
                unlabelled.append(path)
            else:
                val.append((path, wnid))
    return _finish(root, "ilsvrc", train, val, names, unlabelled, folders=folders, mapping=mapping_file, tree=tree)


def _finish(root, kind, train, val, names, unlabelled=(), *, folders=(), mapping=None, tree=_LOCAL) -> Layout:
    layout_root = Path(root) if tree is _LOCAL else tree.url
    root, mapping = tree.shown(root), (tree.shown(mapping) if mapping is not None else None)
    if mapping is not None and names:
        extra = sorted(set(folders) - set(names))
        if extra:
            raise LayoutError(f"{root}: class folders missing from {mapping}: "
                              f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
        classes = sorted(names)
    else:
        classes = sorted(set(folders)) or sorted({wnid for _, wnid in val})
    unknown = sorted({wnid for _, wnid in val} - set(classes))
    if (train or folders) and unknown:
        raise LayoutError(f"{root}: val images are labelled with classes that have no train folder: "
                          f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
    if not train and not val:
        raise LayoutError(f"{root}: no images found (looked for {', '.join(sorted(IMAGE_SUFFIXES))} files)")
    names = {wnid: names.get(wnid, wnid) for wnid in classes}
    filled = {w for _, w in train}  # once: per class it was O(classes x images), minutes at ImageNet-21k
    empty = [wnid for wnid in classes if wnid not in filled] if train or folders else []
    if empty:
        message = (f"{root}: {len(empty)} of {len(classes)} classes have no train image and keep their label: "
                   f"{', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}")
        warnings.warn(message, EmptyClassesWarning, stacklevel=3)
        log.warning(message)
    return Layout(layout_root, kind, train, val, classes, names, list(unlabelled), empty)


def scan(root) -> Layout:
    """Scan `root` (ILSVRC layout, ``train/``+``val/`` class folders, or one folder per class).

    Args:
        root: The folder to scan (``~`` is expanded).

    Returns:
        A `Layout`: the training and validation images with their wnids, and the classes' names.

    Raises:
        LayoutError: `root` is not a folder, or its mapping or label files are malformed.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise LayoutError(f"{root}: not a folder")
    return _scan(root, _LOCAL)


def scan_listed(tree: ListedTree) -> Layout:
    """`scan` of a tree known from a listing (`ListedTree`: a bucket's): the same rules, classes and order,
    the layout's root and every path the tree's URL and no file written anywhere.

    Args:
        tree: The listing.

    Returns:
        A `Layout` whose root is ``tree.url`` and whose paths are ``<url>/<relative path>``.
    """
    return _scan(PurePosixPath("/"), tree)


def _scan(root, tree) -> Layout:
    cls_loc = _find_cls_loc(root, tree)
    if cls_loc is not None:
        return _scan_ilsvrc(root, cls_loc, tree)
    subfolders = {p.name for p in _subfolders(root, tree)}
    split_names = {"train", "val", "validation"}
    if "train" in subfolders and subfolders <= split_names and _subfolders(root / "train", tree):
        val_name = "val" if "val" in subfolders else "validation" if "validation" in subfolders else None
        val = _class_tree(root / val_name, tree)[0] if val_name else []
        mapping_file = root / SYNSET_MAPPING
        names = read_synset_mapping(mapping_file, tree) if tree.is_file(mapping_file) else {}
        train, folders = _class_tree(root / "train", tree)
        return _finish(root, "split-folders", train, val, names, folders=folders,
                       mapping=mapping_file if names else None, tree=tree)
    mapping_file = root / SYNSET_MAPPING
    names = read_synset_mapping(mapping_file, tree) if tree.is_file(mapping_file) else {}
    train, folders = _class_tree(root, tree)
    return _finish(root, "folders", train, [], names, folders=folders, mapping=mapping_file if names else None,
                   tree=tree)
