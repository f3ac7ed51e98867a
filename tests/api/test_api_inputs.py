"""The Python API's inputs, checked before any model work: bad config keys, rows, reward functions
and keywords raise HybridRLError with one line; rows of every accepted container become the same file."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest
from api_helpers import quickstart_dict, rows

import hybridrl
import hybridrl.api as api
from hybridrl import HybridRLError, RLTrainer, inputs

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = [
    "trainer.total_training_steps=1",
    "warmup.steps=0",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
    "trainer.logger=[jsonl]",
]


def exact_match(data_source, solution_str, ground_truth, extra_info):
    return float(solution_str.strip() == str(ground_truth))


def test_doctests():
    assert doctest.testmod(api).failed == 0


# -- bad input: one line, HybridRLError, before any model work -------------------------------------


def _trainer(tmp_path, **kw):
    args = {"reward_fn": exact_match, "train_data": rows("train", 16), "overrides": OVERRIDES}
    args.update(kw)
    args["overrides"] = list(args["overrides"]) + [f"trainer.default_local_dir={tmp_path / 'run'}"]
    return RLTrainer(quickstart_dict(), **args)


def test_unknown_key_raises_with_a_suggestion(tmp_path):
    with pytest.raises(HybridRLError, match=r"unknown key 'actor_rollout_ref.actor.lrr'; did you mean"):
        _trainer(tmp_path, overrides=OVERRIDES + ["actor_rollout_ref.actor.lrr=1e-3"])
    with pytest.raises(HybridRLError, match=r"keyword rolout_n=8 is no config key"):
        hybridrl.grpo("m", [], None, rolout_n=8)
    with pytest.raises(HybridRLError, match=r"keyword ppo_mini_batch_size=8 names 2 keys"):
        hybridrl.grpo("m", [], None, ppo_mini_batch_size=8)


def test_bad_row_names_the_row(tmp_path):
    data = rows("train", 16)
    del data[3]["prompt"]  # (a missing data_source is fine with a reward function: test_trl_api.py)
    with pytest.raises(HybridRLError, match=r"train_data.jsonl, row 3: missing the prompt field 'prompt'") as e:
        _trainer(tmp_path, train_data=data).fit()
    assert "\n" not in str(e.value)
    with pytest.raises(HybridRLError, match=r"train_data: got one dict"):
        _trainer(tmp_path, train_data=data[0], overrides=OVERRIDES + ["trainer.overwrite=true"]).fit()


def test_reward_function_that_raises_or_returns_text(tmp_path):
    def broken(data_source, solution_str, ground_truth, extra_info):
        return 1 / 0

    with pytest.raises(HybridRLError, match=r"reward_fn broken\(.*\) on the first training row failed: ZeroDivisionError"):
        _trainer(tmp_path, reward_fn=broken).fit()

    def two_args(solution_str, ground_truth):
        return 1.0

    with pytest.raises(HybridRLError, match=r"failed: TypeError.*must take \(data_source, solution_str"):
        _trainer(tmp_path, reward_fn=two_args, overrides=OVERRIDES + ["trainer.overwrite=true"]).fit()

    with pytest.raises(HybridRLError, match=r"returned 'yes'; return a finite number"):
        _trainer(tmp_path, reward_fn=lambda **kw: "yes", overrides=OVERRIDES + ["trainer.overwrite=true"]).fit()


def test_a_second_run_into_the_same_directory_is_refused_not_exited(tmp_path):
    _trainer(
        tmp_path, overrides=OVERRIDES + ["trainer.total_training_steps=1", "warmup.steps=0", "trainer.resume_mode=disable"]
    ).fit()
    with pytest.raises(HybridRLError, match=r"already holds a run .* trainer.overwrite=true"):
        _trainer(tmp_path, overrides=OVERRIDES + ["trainer.resume_mode=disable"]).fit()


def _live_run(path: Path) -> dict[str, str]:
    """A run's files, as a run that has trained two steps leaves them; {name: content}."""
    files = {"config.yaml": "# hybridrl config, resolved\ntrainer: {}\n", "metrics.jsonl": '{"step": 1}\n{"step": 2}\n'}
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return files


@pytest.mark.parametrize("holder", ["process", "thread"])
def test_overwrite_never_moves_a_live_runs_files(tmp_path, holder):
    """trainer.overwrite=true into a directory another run holds (another process, or another
    thread of this one): refused in one line before anything is moved aside (the lock is taken
    before the directory is claimed)."""
    import threading

    from run_lock_helpers import hold_lock

    from hybridrl.trainer import rundir

    run = tmp_path / "run"
    files = _live_run(run)
    release, held = threading.Event(), threading.Event()

    def hold_in_a_thread():
        with rundir.locked(run):
            held.set()
            release.wait(60)

    pid = None
    if holder == "process":
        proc = hold_lock(run)
        pid = proc.pid
    else:
        t = threading.Thread(target=hold_in_a_thread, name="live-run")
        t.start()
        assert held.wait(30)
    try:
        with pytest.raises(HybridRLError, match="is in use by another run") as e:
            _trainer(tmp_path, overrides=OVERRIDES + ["trainer.overwrite=true", "trainer.resume_mode=disable"]).fit()
        assert "\n" not in str(e.value) and (f"pid {pid}" if pid else "thread 'live-run'") in str(e.value)
    finally:
        if holder == "process":
            proc.kill()
            proc.wait()
        else:
            release.set()
            t.join()
    assert {name: (run / name).read_text() for name in files} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no run.old-<time>


def test_keywords_map_to_config_keys():
    assert api.keyword_overrides({"batch_size": 16, "lr": 1e-5, "device": "cpu", "use_kl_loss": True}) == [
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.optim.lr=1e-05",
        'trainer.device="cpu"',
        "actor_rollout_ref.actor.use_kl_loss=true",
    ]
    cfg = RLTrainer(
        quickstart_dict(),
        overrides=OVERRIDES + api.keyword_overrides({"rollout_n": 2, "micro_batch_size": 8, "experiment_name": "007"}),
    ).config
    assert cfg.actor_rollout_ref.rollout.n == 2 and cfg.trainer.experiment_name == "007"  # a string stays a string


def test_every_row_container_gives_the_same_file(tmp_path):
    import datasets
    import pandas as pd
    import pyarrow as pa

    data = rows("train", 8)
    expected = [json.dumps(r, ensure_ascii=False) for r in data]
    for name, container in (
        ("list", data),
        ("pandas", pd.DataFrame(data)),
        ("datasets", datasets.Dataset.from_list(data)),
        ("pyarrow", pa.Table.from_pylist(data)),
        ("generator", (r for r in data)),
    ):
        out = tmp_path / f"{name}.jsonl"
        inputs.write_rows(container, str(out), "train_data")
        assert [json.loads(x) for x in out.read_text().splitlines()] == [json.loads(x) for x in expected], name


def test_reward_models_take_an_in_memory_module(tmp_path):
    """reward_models=[module]: a torch module with forward(input_ids, attention_mask) -> scores
    scores the rollouts in place of the rule reward (verl's default weights: RM 1, rule 0)."""
    import torch

    class LengthScore(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor(0.25))

        def forward(self, input_ids, attention_mask):
            return self.w * attention_mask.sum(-1)

    out = tmp_path / "run"
    result = RLTrainer(
        quickstart_dict(),
        reward_models=[LengthScore()],
        overrides=[*OVERRIDES, "trainer.total_training_steps=2", f"trainer.default_local_dir={out}"],
    ).fit()
    rows = [r for r in result.history if "reward_model/score/mean" in r]
    assert len(rows) == 2
    for r in rows:
        # every score is 0.25 x (prompt + response tokens): positive, and the step's score is the RM's
        assert r["reward_model/score/mean"] > 0 and r["critic/score/mean"] == pytest.approx(r["reward_model/score/mean"])
    sft = [*OVERRIDES, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", f"trainer.default_local_dir={tmp_path / 's'}"]
    with pytest.raises(HybridRLError, match="reward_models is for RL"):
        RLTrainer({**quickstart_dict(), "algorithm": {"name": "sft"}}, reward_models=[LengthScore()], overrides=sft).fit()


def test_hybridrl_exports_the_api():
    assert hybridrl.RLTrainer is api.RLTrainer and hybridrl.grpo is api.grpo and hybridrl.ppo is api.ppo
    from hybridrl.rewards.remote import RemoteReward

    assert hybridrl.RemoteReward is RemoteReward


def test_reward_models_turn_the_reward_model_on_before_validation(tmp_path):
    """The argument is config: reward_model.enable=true is decided with the other keys, so the checks
    that need it see it (an own reward-model pool was refused as "reward_model.enable=false"), and
    the run's setup changes nothing in the validated config."""
    import torch

    placed = [
        *OVERRIDES,
        "trainer.n_gpus_per_node=2",
        "resource_pool.actor_rollout_ref=1",
        "resource_pool.reward_model=1",
        f"trainer.default_local_dir={tmp_path}",
    ]
    trainer = RLTrainer(quickstart_dict(), reward_models=[torch.nn.Linear(1, 1)], overrides=placed)
    assert trainer.config.reward_model.enable is True
    assert (
        RLTrainer(quickstart_dict(), overrides=[*OVERRIDES, f"trainer.default_local_dir={tmp_path}"]).config.reward_model.enable
        is False
    )
