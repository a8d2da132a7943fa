"""What the training recipe's learning-rate rule costs a step, from 10 to 55,000 steps an epoch.

`FitOptions.learning_rate_at` gives every step its rate (warm-up, then a constant, cosine or step
schedule); `train_torch` calls it once a step and writes the rate into the optimiser's parameter groups,
`train` (TensorFlow) runs the same rule on the step counter inside the compiled step. Its cost must not
grow with the length of an epoch: 10 steps, 5,004 (ImageNet-1k at a global batch of 256) and 55,000
(ImageNet-21k's 14.2 M images at 256). Measured: microseconds a call of the rule in Python for each
schedule, and a PyTorch SGD step of a small convolutional network with the rate set before it against
the same step without (the baseline, interleaved in the same run; the ratio should be ~1.00).
Writes bench/results/lr_schedule.json and bench/results/lr_schedule.png.

    .venv/bin/python bench/bench_lr_schedule.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
STEPS_PER_EPOCH = (10, 1_000, 5_004, 55_000)
EPOCHS = 90


def rule_microseconds(schedule: str, steps: int, calls: int = 200_000) -> float:
    from pinstorm.training.runs import FitOptions

    recipe = FitOptions(epochs=EPOCHS, learning_rate=0.1, lr_schedule=schedule, warmup_epochs=5)
    total = EPOCHS * steps
    picks = [(i * 7919) % total for i in range(1024)]   # steps spread over the whole fit
    timer = timeit.Timer(lambda: [recipe.learning_rate_at(s, steps) for s in picks])
    return timer.timeit(number=max(1, calls // len(picks))) / (max(1, calls // len(picks)) * len(picks)) * 1e6


def torch_step_ratio(steps: int, rounds: int = 21, per_round: int = 100) -> dict:
    """Median seconds of a small SGD step with the rate set before it, against the same step without."""
    import torch

    from pinstorm.training.runs import FitOptions

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, 10))
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = torch.rand(8, 3, 32, 32), torch.randint(0, 10, (8,))
    recipe = FitOptions(epochs=EPOCHS, learning_rate=0.1, lr_schedule="cosine", warmup_epochs=5)

    def step(number: int, scheduled: bool) -> None:
        if scheduled:
            rate = recipe.learning_rate_at(number % (EPOCHS * steps), steps)
            for group in optim.param_groups:
                group["lr"] = rate
        optim.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optim.step()

    timings = {False: [], True: []}
    for round_number in range(rounds):
        for scheduled in ((False, True) if round_number % 2 == 0 else (True, False)):   # interleaved
            started = time.perf_counter()
            for number in range(per_round):
                step(round_number * per_round + number, scheduled)
            timings[scheduled].append((time.perf_counter() - started) / per_round)
    plain, scheduled = statistics.median(timings[False]), statistics.median(timings[True])
    return {"step_ms_constant": plain * 1e3, "step_ms_scheduled": scheduled * 1e3, "ratio": scheduled / plain}


def main() -> None:
    runs = []
    for steps in STEPS_PER_EPOCH:
        row = {"steps_per_epoch": steps, "total_steps": EPOCHS * steps}
        for schedule in ("constant", "cosine", "step"):
            row[f"rule_us_{schedule}"] = rule_microseconds(schedule, steps)
        try:
            row.update(torch_step_ratio(steps))
        except ImportError:
            pass
        print(json.dumps(row), flush=True)
        runs.append(row)
    RESULTS.mkdir(exist_ok=True)
    out = {"epochs": EPOCHS, "warmup_epochs": 5, "python": sys.version.split()[0], "runs": runs}
    (RESULTS / "lr_schedule.json").write_text(json.dumps(out, indent=1) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, (rule, ratio) = plt.subplots(1, 2, figsize=(10, 3.6))
    steps = [r["steps_per_epoch"] for r in runs]
    for schedule in ("constant", "cosine", "step"):
        rule.plot(steps, [r[f"rule_us_{schedule}"] for r in runs], marker="o", label=schedule)
    rule.set(xscale="log", xlabel="steps per epoch (90 epochs, 5 of warm-up)", ylabel="µs per step",
             title="learning_rate_at, per call", ylim=(0, None))
    rule.legend()
    if all("ratio" in r for r in runs):
        ratio.plot(steps, [r["ratio"] for r in runs], marker="o")
        ratio.axhline(1.0, color="grey", lw=0.8)
        ratio.set(xscale="log", xlabel="steps per epoch", ylabel="scheduled / constant",
                  title="a small torch SGD step (CPU), median", ylim=(0.8, 1.2))
    figure.tight_layout()
    figure.savefig(RESULTS / "lr_schedule.png", dpi=110)


if __name__ == "__main__":
    main()
