"""Constants and helpers shared by the pipeline tests (the fixtures are in conftest_pipeline.py)."""

from __future__ import annotations

PER_CLASS = 40          # 10 classes x 40 digits: 320 train (+5 quirk files) and 80 val images
IMAGE_SIZE = 48


def read_rows(url, columns=("label", "wnid", "filename")):
    """Every row of a local dataset in stored order (part files by name, row groups in order)."""
    from pathlib import Path

    import pyarrow.parquet as pq

    rows = []
    for part in sorted(Path(url).glob("part-*.parquet")):
        rows += pq.read_table(part, columns=list(columns)).to_pylist()
    return rows
