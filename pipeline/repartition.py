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

from .layout import Layout, is_image_name, scan
from pinstorm.progress import progress_bar
from pinstorm.boards import secrets

log = secrets.logger(__name__)

CATEGORIES_PIN = "categories"


def repartition(root, board, zip: bool = True, parallel: int | None = None, *, progress: bool | None = None):
    """Pin each train category of the tree at `root` (a folder or a `Layout`) to `board`; return the categories.

    Pins: one per non-empty category, named by its wnid, holding its image files (a zip when
    `zip=True`), with the human name as description; then ``categories`` (every class of the layout,
    empty ones with 0 images, so labels stay the layout's), a DataFrame of ``id``, ``name``, ``images``,
    written last so a reader never sees a categories list whose pins are not all there.
    `parallel` categories are pinned at once (threads; default 4). Returns the categories DataFrame.
    Validation images are not pinned: convert them straight from the layout (``split="val"``).
    """
    from pinstorm import boards
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

    def pin_one(wnid: str) -> None:
        boards.pin(by_class[wnid], name=wnid, board=board, zip=zip, description=layout.names.get(wnid, wnid),
                   metadata={"wnid": wnid, "name": layout.names.get(wnid, wnid), "images": len(by_class[wnid])})

    # One batch: the board's indexes are published once, after the last category, so a category costs
    # the same on a board of 21,841 as on one of 10 (docs/boards.md, "ImageNet-sized boards").
    with boards.batch(board):
        with progress_bar("repartition", len(filled), unit="categories", enabled=progress) as advance, \
                ThreadPoolExecutor(max_workers=parallel or 4) as pool:
            for future in [pool.submit(pin_one, wnid) for wnid in filled]:
                future.result()
                advance(1)
    categories = pd.DataFrame({"id": classes, "name": [layout.names.get(w, w) for w in classes],
                               "images": [len(by_class[w]) for w in classes]})
    # after the batch: a reader never sees a categories list whose pins are not all listed
    boards.pin(categories, name=CATEGORIES_PIN, board=board,
               description=f"{len(classes)} categories of {layout.root}, one pin each")
    return categories


def imagenet_partition(partition: int, partitions: int, board, parallel=None, *, extract: bool = True) -> dict:
    """Fetch categories `partition` of `partitions` (0-based) from `board` and return a data map.

    The categories pin is sorted by id and cut into `partitions` contiguous, near-equal slices.
    Returns ``{"image": [paths], "category": [wnid per image], "categories": [wnids of this slice],
    "classes": [every wnid on the board], "names": {wnid: name}}``. `convert` labels by `classes`
    (the whole list), so slices converted by different workers agree on labels.
    `parallel` is passed to `boards.pin_get_many` (threads by default).
    """
    from pinstorm import boards
    if not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be a positive integer, got {partitions!r}")
    if not isinstance(partition, int) or not 0 <= partition < partitions:
        raise ValueError(f"partition must be in [0, {partitions}) (0-based), got {partition!r}")
    table = boards.pin_get(CATEGORIES_PIN, board=board)
    if not hasattr(table, "columns") or not {"id", "name"} <= set(table.columns):
        raise ValueError(f"pin {CATEGORIES_PIN!r} on board {board!r} is not a categories table "
                         "(id, name, images); was the board made by repartition()?")
    table = table.sort_values("id").reset_index(drop=True)
    classes = [str(c) for c in table["id"]]
    if partitions > len(classes):
        raise ValueError(f"{partitions} partitions of {len(classes)} categories would leave some empty")
    start, stop = partition * len(classes) // partitions, (partition + 1) * len(classes) // partitions
    mine = classes[start:stop]
    counts = dict(zip(classes, table["images"])) if "images" in table.columns else {}
    wanted = [wnid for wnid in mine if counts.get(wnid, 1) > 0]   # empty categories have no pin
    fetched = boards.pin_get_many(wanted, board=board, parallel=parallel, extract=extract)
    image, category = [], []
    for wnid in wanted:
        paths = fetched[wnid]
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        files = sorted(p for p in map(os.fspath, paths) if is_image_name(os.path.basename(p)))
        image += files
        category += [wnid] * len(files)
    names = {str(i): str(n) for i, n in zip(table["id"], table["name"])}
    return {"image": image, "category": category, "categories": mine, "classes": classes, "names": names}

