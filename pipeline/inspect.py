"""What a converted dataset holds, and a contact sheet to look at some of it.

The summary reads only the small columns (label, height, width), never the image bytes; the
contact sheet decodes a few dozen rows from a couple of row groups (row groups mix classes, so a
couple are already a varied sample).

Parts are opened with `verify.open_part` (checksummed, bounded, read without pre-buffering), never
with `pq.read_table` on a Python file handle: `read_table` pre-buffers (``pre_buffer=True``) on Arrow's IO
threads, and the last reference to those reads can be dropped on such a thread while the interpreter
finalizes; it then needs the GIL, is ended by ``pthread_exit`` inside a C++ destructor, and the
process aborts after its work is done (``terminate called without an active exception``, exit 134;
apache/arrow#34314, #39162).
"""

from __future__ import annotations

import math
import os
import random

from pinstorm.errors import PinstormError

from .images import decode_rgb
from .contracts import DatasetInfo
from .metadata import read_info
from .storage import locate
from .verify import CorruptPartError, check_parts, open_part, read_row_group


def inspect_dataset(url, *, sheet=None, samples: int = 36, seed: int = 0,
                    storage_options: dict | None = None) -> dict:
    """Summarise the dataset at `url`; also write a PNG contact sheet to `sheet` when given.

    Returns `dataset_info` plus ``image_kb_mean``, ``height``/``width`` (min, median, max),
    ``rows_per_row_group`` (min, max), ``rows_per_class`` (min, max) and ``sheet`` (path or None).
    """
    import numpy as np

    location = locate(url, storage_options)
    info = read_info(location)
    check_parts(location, info)
    info = info.with_changes(url=location.url)
    heights, widths = [], []
    for name in sorted(info.files):
        table = _small_columns(location, info, name)
        heights.append(table.column("height").to_numpy())
        widths.append(table.column("width").to_numpy())
    heights, widths = np.concatenate(heights), np.concatenate(widths)
    summary = info.to_dict()
    summary["image_kb_mean"] = round(info.bytes / max(1, info.rows) / 1024, 1)
    summary["height"] = [int(heights.min()), int(np.median(heights)), int(heights.max())]
    summary["width"] = [int(widths.min()), int(np.median(widths)), int(widths.max())]
    summary["rows_per_row_group"] = [min(info.row_group_rows), max(info.row_group_rows)]
    summary["rows_per_class"] = [min(info.class_rows), max(info.class_rows)] if info.class_rows else None
    summary["sheet"] = None
    if sheet is not None:
        summary["sheet"] = str(contact_sheet(location, info, sheet, samples=samples, seed=seed))
    return summary


def _small_columns(location, info: DatasetInfo, name: str):
    """height and width of every row of part `name` (no image bytes read)."""
    handle = open_part(location, info, name)
    try:
        return handle.read(columns=["height", "width"])
    except PinstormError:
        raise
    except Exception as error:
        raise CorruptPartError(f"{location.url}/{name}: cannot read the height and width columns: {error}") from None
    finally:
        handle.close()


def contact_sheet(location, info: DatasetInfo, path, *, samples: int = 36, seed: int = 0):
    """Write a grid of `samples` random rows (image, label, wnid, name) to the PNG `path`."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rng = random.Random(seed)
    groups = [(name, rg) for name in sorted(info.files) for rg in range(info.files[name]["row_groups"])]
    rng.shuffle(groups)
    rows = []
    for name, rg in groups:  # checksummed: a damaged row group is named, never drawn
        handle = open_part(location, info, name)
        try:
            table = read_row_group(handle, location, info, name, rg, columns=("image", "label", "wnid", "filename"))
        finally:
            handle.close()
        rows += table.to_pylist()
        if len(rows) >= samples:
            break
    rows = rng.sample(rows, min(samples, len(rows)))
    cols = max(1, math.ceil(math.sqrt(len(rows))))
    lines = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(lines, cols, figsize=(cols * 1.9, lines * 2.1), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, row in zip(axes.flat, rows):
        ax.imshow(decode_rgb(row["image"]))
        name = info.names.get(row["wnid"], row["wnid"]).split(",")[0][:22]
        ax.set_title(f"{row['label']}: {row['wnid']}\n{name}", fontsize=7)
    fig.suptitle(f"{info.rows} images, {info.num_classes} classes ({info.split or ''})", fontsize=9)
    fig.tight_layout()
    path = os.fspath(path)
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def format_summary(summary: dict) -> str:
    """The summary as a few readable lines (what `pinstorm inspect` prints)."""
    mb = summary["bytes"] / 2**20
    lines = [
        f"dataset     {summary['url']}",
        f"rows        {summary['rows']} ({summary.get('split', '?')}), {summary['skipped']} skipped and "
        f"{summary['reencoded']} re-encoded at conversion"
        + (f" ({summary['resized']} downscaled to max_side)" if summary.get("resized") else ""),
        f"classes     {summary['num_classes']} ({', '.join(summary['classes'][:5])}"
        f"{', ...' if summary['num_classes'] > 5 else ''}); rows per class {summary['rows_per_class'][0]}"
        f"-{summary['rows_per_class'][1]}",
        f"row groups  {summary['row_groups']} in {summary['partitions']} part file(s), "
        f"{summary['rows_per_row_group'][0]}-{summary['rows_per_row_group'][1]} rows each",
        f"size        {mb:.1f} MB, {summary['image_kb_mean']} KB per image",
        f"images      height {summary['height'][0]}/{summary['height'][1]}/{summary['height'][2]}, "
        f"width {summary['width'][0]}/{summary['width'][1]}/{summary['width'][2]} (min/median/max)",
    ]
    if summary.get("sheet"):
        lines.append(f"sheet       {summary['sheet']}")
    return "\n".join(lines)
