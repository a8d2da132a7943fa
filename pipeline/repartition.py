"""One pin per ImageNet category, so each worker fetches only the categories it converts.

`repartition` stores every class folder of a tree as its own pin (named by its wnid, zipped by
default: one object per category is far cheaper to move than 1,300 small files) plus a
``categories`` pin: a DataFrame with ``id`` (wnid), ``name`` and ``images``.
`imagenet_partition(p, n, board)` fetches categories p of n through the board's cache, in
parallel, and returns the data map `convert` takes. This is the scheme of RStudio's "ImageNet with
R and pins" (2020), where 16 workers each fetched 1/16 of the categories from a GCS board.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from .contracts import DataMap
from .errors import InvalidPipelineInput
from .layout import Layout, is_image_name, scan
from pinstorm.progress import progress_bar
from pinstorm.boards.safety import secrets
from pinstorm import boards

log = secrets.logger(__name__)

CATEGORIES_PIN = "categories"
# Categories pinned at once by default, measured on 2 cores (docs/pipeline.md, "One pin per category"):
# into a local folder the work is zipping and hashing under the GIL, and one thread was 1.9x faster
# than four (16 s against 31 s at 1,000 categories); since each pin is no longer read back, two threads
# were no clearer win than one (4.1-6.2 s against 4.7-5.7 s for 1,000 x 40 JPEGs, for 1.5x the CPU:
# bench/bench_repartition.py); into a bucket each pin waits on requests, and
# eight threads were the fastest of 1, 2, 4 and 8 (moto S3, 100 categories of 40 JPEGs).
PARALLEL = {"folder": 1}
REMOTE_PARALLEL = 8


def repartition(root, board, zip: bool = True, parallel: int | None = None, *, progress: bool | None = None):
    """Pin each train category of the tree at `root` (a folder or a `Layout`) to `board`; return the categories.

    Pins: one per non-empty category, named by its wnid, holding its image files (a zip when
    `zip=True`), with the human name as description; then ``categories`` (every class of the layout,
    empty ones with 0 images, so labels stay the layout's), a DataFrame of ``id``, ``name``, ``images``,
    written last so a reader never sees a categories list whose pins are not all there.
    `parallel` categories are pinned at once (threads; default `PARALLEL`: 1 into a local folder, 8 into
    a bucket). Returns the categories DataFrame.
    Validation images are not pinned: convert them straight from the layout (``split="val"``).

    Args:
        root: The tree: a folder (`scan`ned) or a `Layout`.
        board: A registered board's name or a writable `Board`.
        zip: Pin each category's images as one zip archive (else as separate files).
        parallel: Categories pinned at once (None: 1 into a local folder, 8 into a bucket; measured).
        progress: Show a progress bar (None: where one can be seen).

    Returns:
        The ``categories`` DataFrame (``id``, ``name``, ``images``), as pinned.
    """

    import pandas as pd

    layout = root if isinstance(root, Layout) else scan(root)
    items = layout.items("train")
    by_class: dict[str, list[str]] = {wnid: [] for wnid in layout.classes}
    for path, wnid in items:
        by_class.setdefault(wnid, []).append(path)
    # Every class of the layout is listed, empty ones included (with 0 images, and no pin): labels are
    # indexes into this list, so dropping one would renumber every later class.
    classes = sorted(by_class)
    filled = [wnid for wnid in classes if by_class[wnid]]

    target = boards.resolve_board(board)  # one Board object: the batch below is per object

    def pin_one(wnid: str) -> None:
        # `store`, not `pin`: `pin` reads each version back, which unpacks every zip into the cache
        # again (on a bucket board, downloads it first): 3/4 of the time at 1,000 categories
        target.store(by_class[wnid], name=wnid, zip=zip, description=layout.names.get(wnid, wnid),
                     metadata={"wnid": wnid, "name": layout.names.get(wnid, wnid), "images": len(by_class[wnid])})

    # One batch: the board's indexes are published once, after the last category, so a category costs
    # the same on a board of 21,841 as on one of 10 (docs/boards.md, "ImageNet-sized boards").
    with target.batch():
        with progress_bar("repartition", len(filled), unit="categories", enabled=progress) as advance, \
                ThreadPoolExecutor(max_workers=parallel or default_parallel(target)) as pool:
            for future in [pool.submit(pin_one, wnid) for wnid in filled]:
                future.result()
                advance(1)
    categories = pd.DataFrame({"id": classes, "name": [layout.names.get(w, w) for w in classes],
                               "images": [len(by_class[w]) for w in classes]})
    # after the batch: a reader never sees a categories list whose pins are not all listed
    target.store(categories, name=CATEGORIES_PIN,
                 description=f"{len(classes)} categories of {layout.root}, one pin each")
    return categories


def default_parallel(board) -> int:
    """Threads `repartition` pins with when not told: by the kind of board (see `PARALLEL`)."""

    return PARALLEL.get(boards.resolve_board(board).kind, REMOTE_PARALLEL)


def imagenet_partition(partition: int, partitions: int, board, parallel=None, *, extract: bool = True) -> DataMap:
    """Fetch categories `partition` of `partitions` (0-based) from `board` and return a data map.

    The categories pin is sorted by id and cut into `partitions` contiguous, near-equal slices.
    Returns ``{"image": [paths], "category": [wnid per image], "categories": [wnids of this slice],
    "classes": [every wnid on the board], "names": {wnid: name}}``. `convert` labels by `classes`
    (the whole list), so slices converted by different workers agree on labels.
    `parallel` is passed to `boards.pin_get_many` (threads by default).

    Args:
        partition: This slice's index, from 0.
        partitions: How many slices the categories are cut into.
        board: A registered board's name or a `Board` holding `repartition`'s pins.
        parallel: As `pin_get_many`'s (None: threads).
        extract: Unpack the categories' zip archives (the data map then lists the images).

    Returns:
        The data map (a frozen `DataMap`, also read by key as above), ready for `convert`.
    """
    classes, mine, wanted, names = category_slice(partition, partitions, board)
    fetched = boards.pin_get_many(wanted, board=board, parallel=parallel, extract=extract)
    image, category = [], []
    for wnid in wanted:
        files = category_files(fetched[wnid])
        image += files
        category += [wnid] * len(files)
    return DataMap(image=image, category=category, categories=mine, classes=classes, names=names)


def category_slice(partition: int, partitions: int, board) -> tuple[list[str], list[str], list[str], dict[str, str]]:
    """(every wnid, this slice's wnids, those of them with a pin, {wnid: name}): `imagenet_partition`'s cut
    of the categories pin, without fetching a category (`convert(board://..., spark=)` fetches them on
    the executors).

    Args:
        partition: This slice's index, from 0.
        partitions: How many slices the categories are cut into.
        board: A registered board's name, a spec or a `Board` holding `repartition`'s pins.
    """
    if not isinstance(partitions, int) or partitions < 1:
        raise InvalidPipelineInput(f"partitions must be a positive integer, got {partitions!r}")
    if not isinstance(partition, int) or not 0 <= partition < partitions:
        raise InvalidPipelineInput(f"partition must be in [0, {partitions}) (0-based), got {partition!r}")
    table = boards.pin_get(CATEGORIES_PIN, board=board)
    if not hasattr(table, "columns") or not {"id", "name"} <= set(table.columns):
        raise InvalidPipelineInput(f"pin {CATEGORIES_PIN!r} on board {board!r} is not a categories table "
                                   "(id, name, images); was the board made by repartition()?")
    table = table.sort_values("id").reset_index(drop=True)
    classes = [str(c) for c in table["id"]]
    if partitions > len(classes):
        raise InvalidPipelineInput(f"{partitions} partitions of {len(classes)} categories would leave some empty")
    start, stop = partition * len(classes) // partitions, (partition + 1) * len(classes) // partitions
    mine = classes[start:stop]
    counts = dict(zip(classes, table["images"])) if "images" in table.columns else {}
    wanted = [wnid for wnid in mine if counts.get(wnid, 1) > 0]   # empty categories have no pin
    names = {str(i): str(n) for i, n in zip(table["id"], table["name"])}
    return classes, mine, wanted, names


def category_files(fetched) -> list[str]:
    """The image files of one fetched category pin (what `pin_get` returned), sorted, as `imagenet_partition`
    lists them."""
    paths = [fetched] if isinstance(fetched, (str, os.PathLike)) else fetched
    return sorted(p for p in map(os.fspath, paths) if is_image_name(os.path.basename(p)))
