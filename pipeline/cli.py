"""`pinstorm repartition`, `pinstorm fetch`, `pinstorm convert` and `pinstorm inspect`: the pipeline commands."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import click

from ..boards.display import escape, escape_lines
from .repartition import PROCESS_MIN_IMAGES, REMOTE_PARALLEL
from .storage import is_board_url, parse_board_url

# Class names, image paths and skip reasons come from image folders and boards anyone may write: they
# are printed through `boards.display.escape` (the one rule: no control character reaches the terminal).

POSITIVE = click.IntRange(min=1)
POSITIVE_FLOAT = click.FloatRange(min=0, min_open=True)


def _partition(value: str) -> tuple[int, int]:
    try:
        index, count = (int(v) for v in value.split("/"))
    except ValueError:
        raise click.BadParameter(f"expected I/N such as 0/4, got {value!r}", param_hint="--partition") from None
    if count < 1 or not 0 <= index < count:
        raise click.BadParameter(f"I/N needs 0 <= I < N (slices are 0-based), got {value!r}",
                                 param_hint="--partition")
    return index, count


def _storage_options(pairs: tuple[str, ...]) -> dict:
    """``--storage-option KEY=VALUE`` pairs as fsspec storage options: ``true``/``false`` become booleans,
    ``-`` in a KEY ``_``, and a dotted KEY nests (``client_kwargs.region_name=eu-west-1``). No value is
    ever echoed: a pair without ``=`` may be a secret typed in the wrong place."""
    options: dict = {}
    for number, pair in enumerate(pairs, start=1):
        key, sep, value = pair.partition("=")
        keys = [part.strip().replace("-", "_") for part in key.split(".")]
        if not sep or not all(keys):
            raise click.BadParameter(f"expected KEY=VALUE (such as endpoint_url=http://127.0.0.1:9000); "
                                     f"the {number}. one is not (its text is not shown: it may be a secret)",
                                     param_hint="--storage-option")
        place = options
        for part in keys[:-1]:
            place = place.setdefault(part, {})
            if not isinstance(place, dict):
                raise click.BadParameter(f"{'.'.join(keys)}: {part} is given both a value and sub-keys",
                                         param_hint="--storage-option")
        if isinstance(place.get(keys[-1]), dict):
            raise click.BadParameter(f"{'.'.join(keys)} is given both a value and sub-keys",
                                     param_hint="--storage-option")
        place[keys[-1]] = {"true": True, "false": False}.get(value.lower(), value)
    return options


@contextlib.contextmanager
def _secrets_masked(storage_options: dict | None):
    """An error whose message quotes a secret of `storage_options` (a library echoing a key) becomes one
    line with it masked (`boards.safety.secrets`); other errors pass unchanged."""
    try:
        yield
    except click.ClickException:
        raise
    except Exception as error:
        from ..boards.safety import secrets

        hidden = secrets.secret_values(storage_options or {})
        if not any(value and value in str(error) for value in hidden):
            raise
        raise click.ClickException(escape(secrets.redact_text(f"{type(error).__name__}: {error}", hidden))) from None


@click.command()
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option("--board", "-b", required=True, help="Registered board to pin the categories to.")
@click.option("--zip/--no-zip", "zip_", default=True, show_default=True, help="One zip per category.")
@click.option("--parallel", type=POSITIVE, default=None,
              help="Categories pinned at once: processes into a local folder (default: one per core from "
                   f"{PROCESS_MIN_IMAGES:,} images, else 1), threads into a bucket (default {REMOTE_PARALLEL}).")
def repartition(root, board, zip_, parallel):
    """Pin each train category of the image tree ROOT as its own pin, plus a `categories` table."""
    from .repartition import repartition as run

    categories = run(root, board, zip=zip_, parallel=parallel)
    click.echo(f"pinned {len(categories)} categories ({int(categories['images'].sum())} images) and "
               f"'categories' to board {board}")


@click.command()
@click.argument("board")
@click.option("--partition", "slice_", default="0/1", show_default=True, metavar="I/N",
              help="Categories slice I of N (0-based), as `convert --partition` cuts them.")
@click.option("--extract/--no-extract", default=True, show_default=True,
              help="Unpack each category's zip in the cache (convert reads the images).")
@click.option("--parallel", type=POSITIVE, default=None, help="Categories fetched at once.")
@click.option("--json", "as_json", is_flag=True, help="Print the data map (image paths, categories) as JSON.")
def fetch(board, slice_, extract, parallel, as_json):
    """Fetch categories slice I/N of a board made by `repartition` into the local cache, without converting.

    A node can warm its cache before training, or hand the images to another tool.
    """
    import json

    from .repartition import imagenet_partition

    index, count = _partition(slice_)
    data = imagenet_partition(index, count, board, parallel=parallel, extract=extract)
    if as_json:
        click.echo(json.dumps({key: data[key] for key in ("image", "category", "categories", "classes")}))
        return
    first, last = (escape(data["categories"][0]), escape(data["categories"][-1])) if data["categories"] else ("", "")
    click.echo(f"fetched categories {index}/{count} of board {escape(board)}: {len(data['categories'])} categories "
               f"({first} .. {last}), {len(data['image'])} images, into the cache")


@click.command()
@click.argument("source")
@click.argument("output")
@click.option("--partitions", "-p", type=POSITIVE, default=1, show_default=True, help="Part files (balanced shards).")
@click.option("--split", type=click.Choice(["train", "val"]), default="train", show_default=True,
              help="Which split of an ILSVRC tree to write.")
@click.option("--partition", "slice_", default=None, metavar="I/N",
              help="With SOURCE board://<board>: convert categories slice I of N (0-based).")
@click.option("--classes-from", default=None, metavar="DATASET",
              help="Label by the class list of an existing dataset (so train and val agree).")
@click.option("--row-group-size-mb", type=POSITIVE_FLOAT, default=32, show_default=True)
@click.option("--min-row-groups", type=POSITIVE, default=16, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the row shuffle.")
@click.option("--parallel", type=POSITIVE, default=None, help="Threads reading and checking images.")
@click.option("--overwrite", is_flag=True, help="Replace a finished dataset built from other inputs.")
@click.option("--max-pixels", type=POSITIVE, default=None,
              help="Per-image pixel budget (default 40000000): larger JPEGs are downscaled, other images skipped.")
@click.option("--memory-budget-mb", type=POSITIVE_FLOAT, default=None,
              help="Decoded pixels all threads may hold at once (default 1024).")
@click.option("--max-side", type=click.IntRange(min=1), default=None,
              help="Downscale images whose longer side exceeds this many pixels (default: keep every byte).")
@click.option("--quality", type=click.IntRange(1, 100), default=None,
              help="JPEG quality of the images --max-side downscales (default 90).")
@click.option("--spark", "spark_master", default=None, metavar="MASTER",
              help="Write the parts on this Spark cluster (local[N], spark://host:port, yarn, ...): one task a "
                   "part, so give --partitions of at least its task slots.")
@click.option("--storage-option", "storage_pairs", multiple=True, metavar="KEY=VALUE",
              help="An fsspec storage option for a SOURCE or OUTPUT URL in a bucket, also sent to the --spark "
                   "executors (repeatable): endpoint_url=http://host:9000, anon=true, client_kwargs.region_name="
                   "eu-west-1. Values are never printed; credentials are better left to the environment "
                   "(AWS_ACCESS_KEY_ID, ...) than typed on a command line.")
def convert(source, output, partitions, split, slice_, classes_from, row_group_size_mb, min_row_groups, seed,
            parallel, overwrite, max_pixels, memory_budget_mb, max_side, quality, spark_master, storage_pairs):
    """Convert SOURCE (an image folder, a tree's URL such as s3://bucket/tree, or board://<board>) to a
    Parquet dataset at OUTPUT.

    OUTPUT: a folder, any fsspec URL (s3://, gs://, ...), or board://<board>/<pin>. With --spark, the
    executors read the images and write the parts: SOURCE and OUTPUT must be where they can reach.
    """
    from .convert import convert as run
    from .info import dataset_info

    storage_options = _storage_options(storage_pairs) or None
    if quality is not None and max_side is None:
        raise click.BadParameter("--quality sets the quality of images --max-side downscales; give --max-side",
                                 param_hint="--quality")
    board_slice = {}
    if is_board_url(source):
        board = source[len("board://"):].strip("/")
        if "/" in board:
            board, _ = parse_board_url(source)
        index, count = _partition(slice_) if slice_ else (0, 1)
        # convert fetches the categories (on Spark: the executors) inside its timing: images/s counts it
        source_obj, board_slice = f"board://{board}", {"partition": (index, count)}
    else:
        if slice_:
            raise click.BadParameter("--partition needs a board:// SOURCE", param_hint="--partition")
        source_obj = source
    with _secrets_masked(storage_options):
        classes = dataset_info(classes_from, storage_options=storage_options)["classes"] if classes_from else None
    limits = {key: value for key, value in (("max_pixels", max_pixels), ("memory_budget_mb", memory_budget_mb),
                                            ("max_side", max_side), ("quality", quality)) if value is not None}
    session = None
    if spark_master:
        from .spark_converter import spark_session_for

        session = limits["spark"] = spark_session_for(spark_master)
    try:
        with _secrets_masked(storage_options):
            result = run(source_obj, output, partitions=partitions, split=split, classes=classes, seed=seed,
                         row_group_size_mb=row_group_size_mb, min_row_groups=min_row_groups, parallel=parallel,
                         overwrite=overwrite, storage_options=storage_options, **limits, **board_slice)
    finally:
        if session is not None:
            session.stop()
    click.echo(f"{result.url}: {result.rows} rows, {len(result.classes)} classes, {result.row_groups} row groups "
               f"in {result.partitions} part(s), {result.bytes / 2**20:.1f} MB"
               + (f", {result.images_per_second:.0f} images/s" if result.images_read else " (already complete)")
               + (f" over {result.seconds:.1f} s, of which {result.fetch_seconds:.1f} s fetching and checking "
                  "the board's category pins" if result.fetch_seconds else "")
               + (f" on Spark ({escape(spark_master)})" if spark_master else ""))
    if result.parts_reused:
        click.echo(f"resumed: kept {result.parts_reused} part(s) from an interrupted run")
    click.echo(f"re-encoded {len(result.reencoded)} (CMYK/grayscale/non-JPEG/16-bit/downscaled; "
               f"{result.reoriented} for their EXIF orientation, {result.resized} resized to --max-side), "
               f"skipped {len(result.skipped)}; "
               f"report: {result.report_url}")
    if result.empty_classes:
        click.echo(f"{len(result.empty_classes)} class(es) without images keep their label: "
                   f"{', '.join(escape(c) for c in result.empty_classes[:10])}"
                   f"{' ...' if len(result.empty_classes) > 10 else ''}")
    for entry in result.skipped[:20]:
        click.echo(f"  skipped {escape(entry['path'])}: {escape(entry['reason'])}")
    if len(result.skipped) > 20:
        click.echo(f"  ... and {len(result.skipped) - 20} more in the report")


@click.command()
@click.argument("dataset")
@click.option("--sheet", type=click.Path(dir_okay=False), default=None,
              help="Contact sheet PNG (default: ./<dataset name>-contact-sheet.png).")
@click.option("--no-sheet", is_flag=True, help="Only print the summary.")
@click.option("--samples", type=POSITIVE, default=36, show_default=True, help="Images on the contact sheet.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect(dataset, sheet, no_sheet, samples, as_json):
    """Rows, classes, row groups, sizes of DATASET, and a contact sheet of sample images with labels."""
    import json

    from .inspect import format_summary, inspect_dataset

    if not no_sheet and sheet is None:
        stem = parse_board_url(dataset)[1] if is_board_url(dataset) else Path(dataset.rstrip("/")).name
        sheet = os.path.join(os.getcwd(), f"{stem or 'dataset'}-contact-sheet.png")
    summary = inspect_dataset(dataset, sheet=None if no_sheet else sheet, samples=samples)
    if as_json:
        summary.pop("row_group_rows", None)
        click.echo(json.dumps(summary, indent=1, ensure_ascii=True))  # ASCII: control characters as \uXXXX
    else:
        classes = [escape(c) for c in summary.get("classes") or []]
        click.echo(escape_lines(format_summary({**summary, "classes": classes})))


@click.command()
@click.argument("dataset")
@click.option("--decode", is_flag=True, help="Also decode every image (slow: Pillow, one thread).")
def verify(dataset, decode):
    """Check every part and row group of DATASET against the checksums recorded at conversion."""
    from .verify import verify_dataset

    found = verify_dataset(dataset, decode=decode)
    click.echo(f"{dataset}: {found['parts']} part(s), {found['row_groups']} row groups, {found['rows']} rows: "
               f"all checksums match" + (", every image decodes" if decode else ""))
