"""`dataset_info`: what a converted dataset holds, read from its ``_common_metadata`` alone.

Training sizes its output layer and its steps per epoch from this, so it must be cheap (one small
file, no row is read) and must refuse a dataset whose conversion never finished.
"""

from __future__ import annotations

from .metadata import read_info
from .storage import locate


def dataset_info(url, *, storage_options: dict | None = None) -> dict:
    """Summary of a finished dataset: ``rows``, ``num_classes``, ``classes`` (wnids in label order),
    ``names`` {wnid: name}, ``class_rows`` (rows per class, label order), ``row_groups``,
    ``row_group_rows``, ``partitions``, ``files``, ``bytes``, ``split``, ``skipped``, ``reencoded``, ``url``.

    `url`: a local folder, an fsspec URL or ``board://<board>/<pin>``. Raises
    `IncompleteDatasetError` for a folder without the completion marker (``_common_metadata``).
    """
    location = locate(url, storage_options)
    info = read_info(location)
    info["url"] = location.url
    return info
