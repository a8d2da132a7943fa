"""`dataset_info`: what a converted dataset holds, read from its ``_common_metadata`` alone.

Training sizes its output layer and its steps per epoch from this, so it must be cheap (one small
file and one listing, no row is read) and must refuse a dataset whose conversion never finished or
that lost a part since (its row count would be a lie).
"""

from __future__ import annotations

from .contracts import DatasetInfo
from .metadata import read_info
from .storage import locate
from .verify import check_parts


def dataset_info(url, *, storage_options: dict | None = None, check: bool = True) -> DatasetInfo:
    """Summary of a finished dataset: ``rows``, ``num_classes``, ``classes`` (wnids in label order),
    ``names`` {wnid: name}, ``class_rows`` (rows per class, label order), ``row_groups``,
    ``row_group_rows``, ``partitions``, ``files``, ``bytes``, ``split``, ``skipped``, ``reencoded``, ``resized`` (downscaled to ``max_side``; absent in older
    datasets), ``url``.

    `url`: a local folder, an fsspec URL or ``board://<board>/<pin>``. Raises
    `IncompleteDatasetError` for a folder without the completion marker (``_common_metadata``), and
    (unless `check=False`) `MissingPartError` / `CorruptPartError` when a part is gone or has
    another size than conversion wrote (one listing; `verify_dataset` checks every byte).

    Args:
        url: A local folder, an fsspec URL or ``board://<board>/<pin>``.
        storage_options: For fsspec (credentials, endpoints) when `url` is remote.
        check: Also check that every part is there with the size conversion wrote.

    Returns:
        The summary: a frozen `DatasetInfo`, read as fields (``info.rows``) or as the keys above
        (``info["rows"]``); ``info.to_dict()`` is a plain copy.
    """
    location = locate(url, storage_options)
    info = read_info(location)
    if check:
        check_parts(location, info)
    return info.with_changes(url=location.url)
