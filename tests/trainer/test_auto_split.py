"""resource_pool.rollout=auto's decision (hybridrl/trainer/auto_split.py) on worked numbers."""

from __future__ import annotations

import ast
import pathlib

import pytest

import hybridrl.trainer.auto_split as auto_split
from hybridrl.trainer.auto_split import StepTimes, choose_split, measured_times, split_step


def test_measured_four_gpu_case_stays_colocated():
    """Issue 41's 4-H200 measurement: generation 1.5 s of a 5.32 s colocated sync step. 2 + 2 ran at
    8.0 s (the trainer on 2 GPUs took 5.1 s to update); the model predicts the trainer side of 2 + 2
    at 3.82 x 4/2 + push = 7.74 s, and no split beats 5.32 s, so the run stays colocated."""
    times = StepTimes(gen=1.5, other=3.82, switch=0.1, push=0.1)
    d = choose_split(4, times)
    assert d.rollout is None
    assert d.predictions[2] == pytest.approx(3.82 * 2 + 0.1)  # the trainer side of 2 + 2
    # 3 + 1: the pool generates the 1.4 s (without the engine's switching) 4x slower: 5.7 s, the best split
    assert d.predictions[1] == pytest.approx(max(1.4 * 4, 3.82 * 4 / 3) + 0.1)
    assert "staying colocated" in d.reason and "3 trainer + 1 rollout" in d.reason
    assert d.step_s == d.colocated_s == pytest.approx(5.32)
    # even if every response were one long tail, 2 + 2 is not chosen: the trainer side bounds it
    assert choose_split(4, StepTimes(gen=1.5, other=3.82, tail=1.4)).rollout is None


def test_long_tail_generation_dominates_takes_a_split():
    """Generation 8 s of a 10 s step on 4 devices, 6 s of it the longest response's decode (a tail
    that more devices do not shorten; one round at any split here). r = 3: rollout 6 + 2 x 4/3 + 0.2
    = 8.87 s, trainer 2 x 4 + 0.2 = 8.2 s, so 8.87 s < 9 s (10% under 10 s): 1 trainer + 3 rollout.
    r = 2 would be 6 + 4 + 0.2 = 10.2 s."""
    times = StepTimes(gen=8.0, other=2.0, push=0.2, tail=6.0, sequences=1024, max_num_seqs=1024)
    d = choose_split(4, times)
    assert d.rollout == 3
    assert d.step_s == pytest.approx(6 + 2 * 4 / 3 + 0.2)
    assert d.predictions[2] == pytest.approx(10.2)
    assert d.reason.startswith("1 trainer + 3 rollout devices")
    # the same times with no tail (perfect data-parallel scaling): a split only ties colocated sync
    flat = choose_split(4, StepTimes(gen=8.0, other=2.0, push=0.2))
    assert flat.rollout is None and min(flat.predictions.values()) == pytest.approx(4 * 8 / 3 + 0.2)


def test_switching_removed_by_a_split_and_rounds():
    """The colocated engine's weight load, wake and sleep (3 s of 6 s generation) are not paid on a
    pool: on 8 devices, other 2 s, colocated 8 s. r = 5: rollout 3 x 8/5 + push 0.1 = 4.9 s, trainer
    2 x 8/3 + 0.1 = 5.43 s; r = 4: rollout 3 x 8/4 + 0.1 = 6.1 s."""
    d = choose_split(8, StepTimes(gen=6.0, other=2.0, switch=3.0, push=0.1))
    assert d.rollout == 5 and d.step_s == pytest.approx(2 * 8 / 3 + 0.1)
    assert d.predictions[4] == pytest.approx(6.1)
    # the tail is paid once per generation round: 512 sequences, 64 at a time per device
    t = StepTimes(gen=4.0, other=1.0, tail=4.0, sequences=512, max_num_seqs=64)
    assert auto_split.rounds(t, 8) == 1 and auto_split.rounds(t, 2) == 4
    assert split_step(t, 8, 2)[0] == pytest.approx(16.0)


def test_candidates_and_min_gain():
    times = StepTimes(gen=8.0, other=2.0, push=0.2, tail=6.0)
    assert choose_split(4, times, candidates=[2]).rollout is None  # r=3 not allowed by the batch sizes: 10.2 s
    assert choose_split(4, times, candidates=[]).rollout is None
    # a negative min_gain takes the best split even when predicted slower than colocated
    d = choose_split(4, StepTimes(gen=1.5, other=3.82), min_gain=-1.0)
    assert d.rollout == 1 and d.step_s > d.colocated_s
    # min_gain just above the predicted saving keeps colocated; just below takes the split
    saving = 1 - (6 + 2 * 4 / 3 + 0.2) / 10
    assert choose_split(4, times, min_gain=saving + 1e-6).rollout is None
    assert choose_split(4, times, min_gain=saving - 1e-6).rollout == 3


def test_measured_times_from_metrics_rows():
    rows = [
        {"timing_s/gen": 2.0, "timing_s/step": 5.0, "timing_s/update_weights": 0.2, "rollout/wake_s": 0.1},
        {"timing_s/gen": 4.0, "timing_s/step": 9.0, "timing_s/update_weights": 0.4, "rollout/sleep_s": 0.2},
    ]
    t = measured_times(rows, sequences=64, max_num_seqs=32)
    assert (t.gen, t.other) == (3.0, 4.0)
    assert t.switch == pytest.approx(0.3 + 0.1 + 0.2) and t.push == pytest.approx(0.3)
    assert t.tail == 0.0  # no decode timing (the hf engine): the plain data-parallel model
    assert (t.sequences, t.max_num_seqs) == (64, 32)


def test_decision_module_is_pure():
    """No torch, no hybridrl imports: the decision is arithmetic on measured numbers."""
    tree = ast.parse(pathlib.Path(auto_split.__file__).read_text())
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert imported <= {"__future__", "math", "dataclasses"}, imported
