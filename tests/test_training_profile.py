"""`pinstorm profile` end to end on the demo's board (served over HTTP) and dataset."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from pinstorm.cli import cli
from pinstorm.training.profiling import ProfileError, ProfileReport, StageTime, _verdict

pytest_plugins = ["conftest_training"]

STAGES = ["board fetch", "raw fsspec copy (baseline)", "board metadata", "extraction", "parquet read",
          "decode (make_dataset)", "train step (cached input)", "real fit"]
PER_EPOCH = STAGES[4:]


@pytest.mark.slow
def test_profile_measures_every_stage_of_the_demo(two_cpu_devices, tmp_path):
    from pinstorm import boards
    from pinstorm.training import make_strategy, profile
    from pinstorm.training.demo import demo_data

    before = boards.board_list()
    from pinstorm.pipeline import dataset_info

    with demo_data(tmp_path / "demo", size="small") as data:
        stored = dataset_info(data["train"])["rows"]
        report = profile(data["train"], board=data["board"], max_pins=4, model_name="alexnet",
                         model_kwargs={"width": 0.125}, image_size=32, batch_size=8, steps=4, fetch_parallel=4,
                         strategy=make_strategy("one-device"), input_options={"flip": False},
                         output_dir=tmp_path / "report")
        assert boards.board_list() == before                           # the demo's boards are not registered
    assert boards.board_list() == before                               # nor is the cold-cache copy

    assert [s.name for s in report.stages] == STAGES
    fetch, raw, metadata, extraction = (report.stage(n) for n in STAGES[:4])
    # the first four categories: four zips fetched, 64 digits (16 train images each) extracted
    assert fetch.detail.startswith("4 pins") and extraction.images == 64 and extraction.seconds > 0
    assert fetch.amount == pytest.approx(raw.amount) and fetch.amount > 0
    assert report.fetch_vs_raw == pytest.approx(raw.seconds / fetch.seconds)
    assert metadata.amount == 4 and metadata.seconds > 0
    rows = report.stage("parquet read")
    assert rows.images >= stored and rows.images % stored == 0       # whole passes over the stored rows
    for name in PER_EPOCH:
        assert report.stage(name).images_per_second > 0, name
    assert 0.0 <= report.stall_share < 1.0
    assert report.bound in PER_EPOCH[:3] and report.advice
    assert report.settings["replicas"] == 1 and report.settings["image_size"] == 32

    saved = json.loads((tmp_path / "report" / "profile.json").read_text())
    assert saved["bound"] == report.bound and [s["name"] for s in saved["stages"]] == STAGES
    assert saved["stages"][0]["rate"] == pytest.approx(fetch.rate)
    assert (tmp_path / "report" / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in (tmp_path / "report").iterdir() if p.name.startswith("pinstorm-profile-scratch")]


@pytest.mark.slow
def test_profile_command_on_the_demo_prints_json(two_cpu_devices, tmp_path):
    result = CliRunner().invoke(cli, ["profile", "--demo", "--output", str(tmp_path), "--steps", "3",
                                      "--batch-size", "8", "--width", "0.125", "--max-pins", "2",
                                      "--strategy", "one-device", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert [s["name"] for s in summary["stages"]] == STAGES and summary["bound"] in STAGES
    assert summary["settings"]["pins"] and len(summary["settings"]["pins"]) == 2
    assert (tmp_path / "profile.json").exists() and (tmp_path / "profile.png").exists()


def test_profile_needs_something_to_measure(tmp_path):
    from pinstorm.training import profile

    with pytest.raises(ProfileError, match="needs a dataset"):
        profile()
    result = CliRunner().invoke(cli, ["profile"])
    assert result.exit_code == 2 and "give a DATASET" in result.output
    with pytest.raises(ProfileError, match="not registered"):
        profile(board="no-such-board", output_dir=tmp_path)


def _stage(name, images_per_second, per_epoch=True):
    return StageTime(name, 1.0, images_per_second, "img", int(images_per_second), per_epoch=per_epoch)


@pytest.mark.parametrize("decode, step, real, bound, says", [
    (300, 1000, 290, "decode (make_dataset)", "more decode threads"),          # input-bound by its own speed
    (5000, 1000, 600, "decode (make_dataset)", "compete for the same"),        # fast alone, slow together
    (5000, 1000, 980, "train step (cached input)", "fewer replicas per host"),  # the step is the bound
])
def test_the_verdict_names_the_bound_and_what_to_change(decode, step, real, bound, says):
    stages = [_stage("parquet read", 20000), _stage("decode (make_dataset)", decode),
              _stage("train step (cached input)", step), _stage("real fit", real)]
    stall = 1 - real / step
    named, advice = _verdict(stages, stall, None, replicas=2, gpus=False, parallel=None, fetch_parallel=8)
    assert named == bound and any(says in line for line in advice), advice
    text = "\n".join(ProfileReport(stages, named, advice, stall).lines())
    assert f"{named}" in text and "<- bound" in text


def test_a_slow_fetch_against_the_raw_copy_asks_for_parallel_fetches():
    fetch = StageTime("board fetch", 4.0, 100.0, "MB", per_epoch=False, detail="16 pins")
    raw = StageTime("raw fsspec copy (baseline)", 1.0, 100.0, "MB", per_epoch=False)
    _, advice = _verdict([fetch, raw], None, 0.25, replicas=1, gpus=False, parallel=None, fetch_parallel=8, pins=16)
    assert any("0.25x a raw copy" in a and "parallel=16" in a for a in advice), advice
    _, advice = _verdict([fetch, raw], None, 0.9, replicas=1, gpus=False, parallel=None, fetch_parallel=8, pins=16)
    assert any("storage itself is the limit" in a and "local SSD" in a for a in advice), advice


def test_metadata_that_costs_as_much_as_the_fetch_is_named():
    fetch = StageTime("board fetch", 4.0, 100.0, "MB", per_epoch=False)
    metadata = StageTime("board metadata", 3.0, 16, "pins", per_epoch=False)
    _, advice = _verdict([fetch, metadata], None, None, replicas=1, gpus=False, parallel=None, fetch_parallel=8,
                         board_kind="datatxt")
    assert any("3.00 s of the 4.00 s fetch is metadata" in a and "index_max_age" in a for a in advice), advice
    said = next(a for a in advice if "index_max_age" in a)
    assert "board_datatxt(url, index_max_age=60)" in said   # the Python advice, and the command, which runs:
    import re
    import shlex

    from click.testing import CliRunner

    from pinstorm.boards import registry
    from pinstorm.cli import cli

    command = re.search(r"pinstorm (board register [^)]*)", said).group(1).replace("URL", "http://127.0.0.1:9/b")
    outcome = CliRunner().invoke(cli, [*shlex.split(command), "--name", "advised", "--no-check"])
    assert outcome.exit_code == 0, outcome.output
    assert registry._specs["advised"]["index_max_age"] in (60, "60")


@pytest.mark.parametrize("kind", ["local", "folder", "s3"])
def test_index_max_age_is_advised_only_for_boards_read_through_data_txt(kind):
    fetch = StageTime("board fetch", 4.0, 100.0, "MB", per_epoch=False)
    metadata = StageTime("board metadata", 3.0, 16, "pins", per_epoch=False)
    _, advice = _verdict([fetch, metadata], None, 0.9, replicas=1, gpus=False, parallel=None, fetch_parallel=8,
                         board_kind=kind)
    assert any("3.00 s of the 4.00 s fetch is metadata" in a for a in advice), advice
    assert not any("index_max_age" in a for a in advice), advice
    # a local board is read in place: "the storage itself is the limit, bring the data closer" does not apply
    assert any("storage itself" in a for a in advice) == (kind == "s3"), advice


def test_a_part_is_never_reported_larger_than_its_whole():
    from pinstorm.training.profiling import _share

    assert _share(0.09, 0.18) == "50% of the fetch"
    for part in (0.18, 0.27, 5.0):             # a cached re-run as slow as, or slower than, the cold fetch
        assert "%" not in _share(part, 0.18) and "all metadata" in _share(part, 0.18)
    fetch = StageTime("board fetch", 0.18, 1.0, "MB", per_epoch=False)
    metadata = StageTime("board metadata", 0.27, 4, "pins", per_epoch=False)
    _, advice = _verdict([fetch, metadata], None, None, replicas=1, gpus=False, parallel=None, fetch_parallel=8,
                         board_kind="local")
    assert advice and not any("0.27 s of the 0.18 s" in a for a in advice), advice
    assert any("all metadata and checks" in a for a in advice), advice


def test_a_board_alone_is_profiled_without_tensorflow_work(tmp_path):
    """Fetch, metadata and extraction of zipped pins on a local board; no dataset, so no bound."""
    from pinstorm import boards
    from pinstorm.training import profile

    boards.board_register("local", name="photos", path=tmp_path / "board", cache=tmp_path / "cache")
    for name in ("cats", "dogs"):
        folder = tmp_path / "src" / name
        folder.mkdir(parents=True)
        for i in range(3):
            (folder / f"{name}{i}.jpg").write_bytes(bytes([i]) * 2048)   # names count, bytes need not decode
        boards.pin(str(folder), name=name, board="photos", zip=True)
    report = profile(board="photos", output_dir=tmp_path / "report", fetch_parallel=2)
    assert [s.name for s in report.stages] == STAGES[:4]
    assert report.settings["pins"] == ["cats", "dogs"] and report.stage("board metadata").amount == 2
    assert report.stage("extraction").images == 6 and report.bound is None and report.stall_share is None
    assert report.stage("raw fsspec copy (baseline)").amount == pytest.approx(report.stage("board fetch").amount)
    assert json.loads((tmp_path / "report" / "profile.json").read_text())["fetch_vs_raw"] == report.fetch_vs_raw
    assert boards.board_list() == ["local", "photos"]                 # nothing registered for the cold fetch
    assert not any("index_max_age" in a for a in report.advice), report.advice   # a local board has no index
    for line in report.lines():
        assert not re.search(r"(\d{3,})% of the fetch", line) or int(re.search(r"(\d+)%", line)[1]) <= 100, line

    # a Board from a constructor, never registered, is profiled the same way; its own cache stays empty
    folder = boards.board_folder(tmp_path / "board", cache=tmp_path / "own-cache")
    report = profile(board=folder, output_dir=tmp_path / "report2", fetch_parallel=2)
    assert [s.name for s in report.stages] == STAGES[:4] and report.settings["board"] == folder.name
    assert not (tmp_path / "own-cache").exists() or not any((tmp_path / "own-cache").rglob("*.jpg"))
    assert boards.board_list() == ["local", "photos"]
