"""Reward functions given to the Python API run isolated as a reward file does (issue 54): a TRL-form
function that hangs or exits on its first call stops `grpo` in one line naming it, within
custom_reward_function.timeout_s, and this process lives on; one that hangs, exits or is interrupted
during training costs that batch's scores (counted), never the run; and no forked copy of this process
outlives the run."""

from __future__ import annotations

import os
import time

import pytest

import hybridrl
from hybridrl import HybridRLError


def _rows(n):
    return [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)} for a in range(n) for b in range(n)]


def _children_of_this_process() -> list[int]:
    """Live processes whose parent is this one: a run's reward workers are (forks or spawns of it)."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(pid)
    return found


def _no_workers_left(before: list[int], seconds: float = 10.0) -> bool:
    """No child process started since `before` is alive (within `seconds`: a killed one is reaped)."""
    end = time.monotonic() + seconds
    while set(_children_of_this_process()) - set(before):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("how", ["hang", "os_exit", "sys_exit"])
def test_a_trl_reward_that_hangs_or_exits_on_its_first_call_stops_grpo_in_one_line(tiny_model_with_weights, tmp_path, how):
    def greedy(prompts, completions, answer, **kwargs):
        if how == "hang":
            time.sleep(600)
        if how == "os_exit":
            os._exit(3)
        raise SystemExit("bye")

    before, start = _children_of_this_process(), time.monotonic()
    with pytest.raises(HybridRLError) as e:
        hybridrl.grpo(
            tiny_model_with_weights,
            _rows(3),
            [greedy],
            output_dir=str(tmp_path / "run"),
            **{"custom_reward_function.timeout_s": 2},
        )
    message = str(e.value)
    assert "reward function(s) greedy on the first row" in message and "\n" not in message
    assert {"hang": "timed out after 2 s", "os_exit": "exit code 3", "sys_exit": "SystemExit: bye"}[how] in message
    assert time.monotonic() - start < 30  # the 600 s sleep was cut at timeout_s
    assert _no_workers_left(before)


@pytest.mark.slow
def test_trl_rewards_that_hang_or_exit_in_training_cost_a_batch_not_the_run(tiny_model_with_weights, tmp_path, caplog):
    marks = tmp_path / "marks"
    marks.mkdir()
    before = _children_of_this_process()

    def flaky(prompts, completions, answer, **kwargs):
        """Fine on the start-up check; then hangs on the 2nd call, exits on the 3rd, interrupts the 4th."""
        calls = len(os.listdir(marks))
        open(marks / str(calls), "w").close()  # forked workers share no memory: count on disk
        if calls == 1:
            time.sleep(600)
        if calls == 2:
            os._exit(1)
        if calls == 3:
            raise KeyboardInterrupt
        return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]

    result = hybridrl.grpo(
        tiny_model_with_weights,
        _rows(4),
        [flaky],
        batch_size=4,
        num_generations=2,
        max_steps=4,
        max_completion_length=3,
        output_dir=str(tmp_path / "run"),
        **{"custom_reward_function.timeout_s": 2, "trainer.logger": ["jsonl"]},
    )
    steps = [r for r in result.history if r.get("step", 0) > 0]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    completions = 4 * 2  # one batched call per step
    assert [r["reward/errors"] for r in steps] == [completions] * 3 + [0]
    assert [r["reward/timeouts"] for r in steps] == [completions, 0, 0, 0]
    assert "reward/flaky/mean" in steps[-1]  # the last batch was scored
    failure = [r.getMessage() for r in caplog.records if r.name == "hybridrl.rewards"]
    assert failure and "reward function flaky failed on sample 0" in failure[0] and "timed out after 2 s" in failure[0]
    assert _no_workers_left(before)  # prime left 16 forked trainers alive after a run that exited 0
