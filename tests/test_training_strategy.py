"""make_strategy: which strategy "auto" picks, the all-reduce probe, the fallback and its timeout."""

from __future__ import annotations

import json
import logging
import textwrap

import pytest

from training_support import finish
from pinstorm.training.multiworker import make_tf_config
from pinstorm.training.strategy import (ProbeError, StrategyError, choose_kind, configure_cpu_devices,
                               make_strategy, probe_all_reduce, strategy_choice)

pytest_plugins = ["conftest_training"]


def test_nccl_on_cpu_devices_falls_back_to_reduction_to_one_device(two_cpu_devices, caplog):
    import tensorflow as tf

    with caplog.at_level(logging.WARNING, logger="pinstorm.training"):
        strategy = make_strategy("mirrored", devices=2, cross_device_ops="nccl")
    choice = strategy_choice(strategy)
    assert isinstance(strategy, tf.distribute.MirroredStrategy) and strategy.num_replicas_in_sync == 2
    assert isinstance(strategy.extended._cross_device_ops, tf.distribute.ReductionToOneDevice)
    assert choice.fallback_from == "NcclAllReduce" and choice.cross_device_ops == "ReductionToOneDevice"
    assert "No OpKernel was registered to support Op 'NcclAllReduce'" in choice.error
    assert "fell back from NcclAllReduce" in choice.describe()
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("NcclAllReduce failed its all-reduce probe" in m and "NcclAllReduce'" in m for m in warning)
    # the fallback really all-reduces across both replicas
    assert probe_all_reduce(strategy) < 30


def test_fallback_none_raises_the_original_error(two_cpu_devices):
    import tensorflow as tf

    with pytest.raises(ProbeError, match="NcclAllReduce") as raised:
        make_strategy("mirrored", devices=2, cross_device_ops="nccl", fallback=None)
    assert isinstance(raised.value.__cause__, tf.errors.InvalidArgumentError)
    assert "No OpKernel was registered" in str(raised.value.__cause__)


def test_strategy_reduce_is_no_probe_but_ours_is(two_cpu_devices):
    """Why the probe runs a replica-context all-reduce: NcclAllReduce passes strategy.reduce on CPUs."""
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(two_cpu_devices, cross_device_ops=tf.distribute.NcclAllReduce())
    per_replica = strategy.run(lambda: tf.constant(1.0))
    assert float(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)) == 2.0
    with pytest.raises(ProbeError):
        probe_all_reduce(strategy, timeout=30)


@pytest.mark.parametrize("requested, used", [
    ("hierarchical", "HierarchicalCopyAllReduce"),
    ("one-device", "ReductionToOneDevice"),
    ("reduction_to_one_device", "ReductionToOneDevice"),
    ("auto", "default collective all-reduce"),   # not every device is a GPU: no NCCL
    ("collective", "default collective all-reduce"),
])
def test_cross_device_ops_are_honoured(two_cpu_devices, requested, used):
    choice = strategy_choice(make_strategy("mirrored", devices=2, cross_device_ops=requested))
    assert choice.cross_device_ops == used and choice.fallback_from is None
    assert choice.replicas == 2 and choice.probe_seconds is not None


def test_auto_kind_and_devices(two_cpu_devices):
    assert strategy_choice(make_strategy("auto", devices=2)).kind == "mirrored"
    one = make_strategy("auto")
    assert strategy_choice(one).kind == "one-device" and one.num_replicas_in_sync == 1
    named = make_strategy("mirrored", devices=two_cpu_devices, cross_device_ops="one-device")
    assert named.num_replicas_in_sync == 2


def test_choose_kind_reads_the_cluster():
    two_workers = json.loads(make_tf_config(["127.0.0.1:1", "127.0.0.1:2"], 1))
    one_worker = json.loads(make_tf_config(["127.0.0.1:1"], 0))
    assert choose_kind("auto", 1, two_workers) == "multiworker"
    assert choose_kind("auto", 4, one_worker) == "mirrored"
    assert choose_kind("auto", 1, None) == "one-device"
    assert choose_kind("one_device", 8, two_workers) == "one-device"
    with pytest.raises(StrategyError, match="unknown strategy kind"):
        choose_kind("parameter-server", 1, None)


def test_bad_options_are_named(two_cpu_devices, monkeypatch):
    with pytest.raises(StrategyError, match="unknown cross_device_ops 'ring'"):
        make_strategy("mirrored", devices=2, cross_device_ops="ring")
    with pytest.raises(StrategyError, match="fallback must be"):
        make_strategy("mirrored", devices=2, fallback="hierarchical")
    with pytest.raises(StrategyError, match="needs TF_CONFIG"):
        make_strategy("multiworker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        make_strategy("auto")


def test_device_count_cannot_change_after_tensorflow_started(two_cpu_devices):
    assert configure_cpu_devices(2) == two_cpu_devices   # the same count again is fine
    with pytest.raises(StrategyError, match="already initialised with 2 logical CPU device.*devices=3"):
        make_strategy("mirrored", devices=3)


WORKER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    os.environ["TF_CONFIG"] = sys.argv[1]
    index, flag = json.loads(sys.argv[1])["task"]["index"], Path(sys.argv[2])
    from pinstorm.training.strategy import make_strategy, ProbeTimeout
    if index == 0:
        started = time.perf_counter()
        try:
            make_strategy("multiworker", probe_timeout=3, fallback=None)
            print(json.dumps({"outcome": "passed"}))
        except ProbeTimeout as error:
            print(json.dumps({"outcome": "timeout", "message": str(error),
                              "seconds": time.perf_counter() - started}))
        flag.write_text("done")
    else:
        # joins the cluster, then never takes part in the probe's collective: worker 0's hangs
        make_strategy("multiworker", probe=False)
        deadline = time.time() + 120
        while not flag.exists() and time.time() < deadline:
            time.sleep(0.2)
""")


@pytest.mark.slow
def test_a_hung_all_reduce_times_out(processes, tmp_path):
    """A real hung collective: worker 1 joins the cluster but never all-reduces."""
    from pinstorm.training.multiworker import local_cluster

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    workers = local_cluster(2)
    flag = tmp_path / "worker0-done"
    started = [processes.start([str(script), make_tf_config(workers, i), str(flag)]) for i in (0, 1)]
    out, _ = finish(started[0], timeout=120)
    finish(started[1], timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["outcome"] == "timeout", result
    assert "did not finish within 3 s" in result["message"] and "abandoned" in result["message"]
    assert 3 <= result["seconds"] < 30
