"""`convert board://...` over a data.txt board served on HTTP (issue 36, items 5 and 6): the cache holds
each category once, a second convert makes no per-pin request, and the summary counts the fetch."""

from __future__ import annotations

import re

from click.testing import CliRunner

from pinstorm import boards
from pinstorm.cli import cli
from pinstorm.pipeline import convert, repartition

pytest_plugins = ["conftest_pipeline"]


def test_a_second_convert_of_a_cached_board_makes_no_per_pin_request(digits_root, tmp_path):
    folder = tmp_path / "served"
    repartition(digits_root, boards.board_register("local", name="src", path=folder), progress=False)
    with boards.serve_board(folder) as url:
        web = boards.board_register("datatxt", name="web", url=url)
        first = convert("board://web", tmp_path / "one", partitions=2, min_row_groups=2)
        assert first.images_read > 0 and 0 < first.fetch_seconds <= first.seconds
        cache = tmp_path / "cache" / "web"
        assert list(cache.rglob("*.JPEG")) and not list(cache.rglob("*.zip"))   # each category once

        urls: list[str] = []
        original = web.storage.session.request

        def counted(method, target, *a, **k):
            urls.append(target)
            return original(method, target, *a, **k)

        web.storage.session.request = counted
        second = convert("board://web", tmp_path / "two", partitions=2, min_row_groups=2)
        assert second.rows == first.rows
        # the categories table's revalidation and one of the index for all 10 category pins: no per-pin request
        assert urls == [f"{url}/data.txt"] * 2, urls

        result = CliRunner().invoke(cli, ["convert", "board://web", str(tmp_path / "three"), "--partitions", "2",
                                          "--min-row-groups", "2"])
        assert result.exit_code == 0, result.output
        assert re.search(r"images/s over [\d.]+ s, of which [\d.]+ s fetching and checking the board's "
                         r"category pins", result.output), result.output
