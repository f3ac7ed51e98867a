"""The TRL-shaped Python API (hybridrl/compat/trl, hybridrl/rewards/trl.py, hybridrl/trainer/callbacks.py):
TRL-form reward functions with their columns, TRL's argument names, callbacks and early stopping."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

import hybridrl
from hybridrl import HybridRLError, RLTrainer
from hybridrl.compat.trl import translate
from hybridrl.rewards.trl import TRLRewards, trl_row


def _call(rewards, rows, completions):
    infos = [trl_row(r)["extra_info"] for r in rows]
    return rewards(["reward_fn"] * len(rows), completions, [None] * len(rows), infos)


def test_columns_reach_the_functions_untouched_and_weights_sum():
    seen = {}

    def exact(prompts, completions, answer, meta, **kwargs):
        seen.update(prompts=prompts, completions=completions, answer=answer, meta=meta, kwargs=kwargs)
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

    async def polite(prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [None if i == 1 else 2.0 for i in range(len(completions))]  # None: does not apply

    chat = [{"role": "user", "content": "2+2="}]
    rows = [{"prompt": chat, "answer": "4", "meta": {"level": [1, 2]}, "id": 7}] * 2
    out = _call(TRLRewards([exact, polite], weights=[1.0, 0.25]), rows, ["4", "5"])
    assert out == [{"score": 1.5, "exact": 1.0, "polite": 2.0}, {"score": 0.0, "exact": 0.0}]
    assert seen["prompts"] == [chat, chat]
    assert seen["completions"] == [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]]
    assert seen["answer"] == ["4", "4"] and seen["meta"] == [{"level": [1, 2]}] * 2 and seen["kwargs"] == {"id": [7, 7]}


def test_text_prompts_give_text_completions_and_a_function_gets_only_what_it_names():
    def length(prompts, completions, answer):
        assert prompts == ["1+1="] and completions == ["2"] and answer == ["2"]
        return [float(len(completions[0]))]

    assert _call(TRLRewards([length]), [{"prompt": "1+1=", "answer": "2", "other": 1}], ["2"]) == [{"score": 1.0, "length": 1.0}]


def test_a_column_named_with_a_default_is_still_passed():
    """`answer=""` names the column as surely as `answer` does: the rows' values reach it, not the default."""
    seen = []

    def exact(prompts, completions, answer=""):
        seen.append(answer)
        return [float(c == a) for c, a in zip(completions, answer)]

    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    assert _call(TRLRewards([exact]), rows, ["2", "5"]) == [{"score": 1.0, "exact": 1.0}, {"score": 0.0, "exact": 0.0}]
    assert seen == [["2", "4"]]


def test_each_row_meets_its_own_completion():
    """Distinct rows: row i's prompt and columns arrive at index i with completion i (a shift by
    one, or a repeated row, scores differently)."""
    seen = {}

    def exact(prompts, completions, answer, level):
        seen.update(prompts=prompts, answer=answer, level=level)
        return [float(c == a) + 0.1 * lv for c, a, lv in zip(completions, answer, level)]

    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a), "level": a} for a in (1, 2, 3, 4)]
    out = _call(TRLRewards([exact]), rows, ["2", "4", "7", "8"])
    assert [r["score"] for r in out] == pytest.approx([1.1, 1.2, 0.3, 1.4])
    assert seen == {"prompts": ["1+1=", "2+2=", "3+3=", "4+4="], "answer": ["2", "4", "6", "8"], "level": [1, 2, 3, 4]}


def test_missing_and_unused_columns_are_one_line_errors():
    def wants_solution(prompts, completions, solution):
        return [0.0] * len(completions)

    with pytest.raises(
        HybridRLError, match=r"takes 'solution', but the rows have no column 'solution' \(columns: \['answer'\]\)"
    ):
        RLTrainer(reward_fn=wants_solution, train_data=[{"prompt": "1+1=", "answer": "2"}])
    with pytest.raises(HybridRLError, match=r"train_data: column\(s\) \['level'\] reach no reward function"):
        RLTrainer(reward_fn=wants_solution, train_data=[{"prompt": "1+1=", "solution": "2", "level": 1}])
    with pytest.raises(HybridRLError, match="reward_weights has 1 weights for 2 reward functions"):
        RLTrainer(reward_fn=[wants_solution, wants_solution], reward_weights=[1.0], train_data=[{"prompt": "x", "solution": 1}])


def test_a_verl_form_function_with_columns_it_would_never_see_is_refused():
    def verl(data_source, solution_str, ground_truth, extra_info):
        return 0.0

    with pytest.raises(HybridRLError, match=r"column\(s\) \['answer'\] would never reach verl\(data_source"):
        RLTrainer(reward_fn=verl, train_data=[{"prompt": "1+1=", "answer": "2"}])


def test_trl_names_translate_and_beta_is_the_kl_coefficient():
    t = translate(
        {"num_generations": 4, "per_device_train_batch_size": 16, "gradient_accumulation_steps": 2, "beta": 0.04, "steps": 3},
        "grpo",
    )
    assert t.rest == {"steps": 3} and t.api == {} and t.problems == [] and t.notices == []
    overrides = t.overrides
    assert "actor_rollout_ref.actor.kl_loss_coef=0.04" in overrides and "actor_rollout_ref.actor.use_kl_loss=true" in overrides
    assert "data.train_batch_size=8" in overrides  # 16 x 2 completions / 4 per prompt
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=8" in overrides
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16" in overrides
    assert not any(o.startswith("preference.beta") for o in overrides)
    overrides = translate({"per_device_train_batch_size": 16}, "grpo").overrides  # TRL's num_generations default, 8
    assert "actor_rollout_ref.rollout.n=8" in overrides and "data.train_batch_size=2" in overrides
    overrides = translate({"beta": 0.0}, "grpo").overrides
    assert "actor_rollout_ref.actor.use_kl_loss=false" in overrides  # TRL: beta=0 means no reference model


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"generation_batch_size": 32}, "generation_batch_size=32 is TRL's: is in completions; pass batch_size="),
        ({"num_generations": 3, "per_device_train_batch_size": 8}, "is not a multiple of num_generations=3"),
        ({"loss_type": "sft"}, "loss_type='sft'"),
    ],
)
def test_trl_names_with_another_meaning_are_refused_with_the_translation(settings, message):
    with pytest.raises(HybridRLError, match=message.replace("(", r"\(").replace(")", r"\)")):
        hybridrl.grpo("unused", [{"prompt": "x"}], **settings)


def test_beta_in_a_ppo_run_is_refused():
    with pytest.raises(HybridRLError, match=r"beta=0.04: in a ppo run, give the KL coefficient as kl_coef="):
        hybridrl.ppo("unused", [{"prompt": "x"}], beta=0.04)


class Recorder:
    def __init__(self, stop_after=None):
        self.steps, self.evaluations, self.saved, self.stop_after = [], [], [], stop_after

    def on_step_end(self, metrics):
        self.steps.append(metrics["training/global_step"])
        return self.stop_after is not None and len(self.steps) >= self.stop_after

    def on_evaluate(self, metrics):
        self.evaluations.append(metrics)

    def on_save(self, path):
        self.saved.append(path)


def _arith_rows(n):
    return [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)} for a in range(n) for b in range(n)]


def correct(prompts, completions, answer, **kwargs):
    return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]


def aligned(prompts, completions, answer=""):
    """1 where the row's answer belongs to the row's prompt: the run's reward/aligned/mean is 1.0
    only if a column named with a default arrives, row by row, beside its own prompt."""
    terms = [p[0]["content"].rstrip("=").split("+") for p in prompts]  # "a+b=" from _arith_rows
    return [float(ans == str(int(a) + int(b))) for ans, (a, b) in zip(answer, terms)]


@pytest.mark.slow
def test_grpo_with_batch_size_only_trl_rewards_and_a_callback_that_stops(tiny_model_with_weights, tmp_path):
    recorder = Recorder(stop_after=2)
    result = hybridrl.grpo(
        tiny_model_with_weights,
        _arith_rows(6),
        [correct, aligned],
        val_data=_arith_rows(2),
        batch_size=8,  # the mini-batch follows it (the config default is 64)
        num_generations=2,
        max_steps=5,
        max_completion_length=4,
        eval_steps=1,
        save_steps=100,
        output_dir=str(tmp_path / "run"),
        callbacks=[recorder, hybridrl.EarlyStopping("actor/pg_loss", patience=10)],
        **{"trainer.logger": ["jsonl"]},
    )
    assert recorder.steps == [1, 2]  # stopped after step 2 of 5
    assert [r["step"] for r in result.history] == [0, 1, 2]  # step 0: validation before training
    assert len(recorder.evaluations) == len([r for r in result.history if "val-core/reward_fn/reward/mean@1" in r])
    assert recorder.evaluations and all("val-core/reward_fn/reward/mean@1" in m for m in recorder.evaluations)
    assert recorder.saved == [result.run_dir / "checkpoints" / "step_2"] and result.checkpoint == recorder.saved[0]
    saved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert saved["data"]["train_batch_size"] == 8 and saved["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] == 8
    assert "reward/correct/mean" in result.history[-1]
    assert [r["reward/aligned/mean"] for r in result.history if r["step"] > 0] == [1.0, 1.0]
    row = json.loads((result.run_dir / "inputs/train_data.jsonl").read_text().splitlines()[0])
    assert row["extra_info"]["trl"]["columns"] == {"answer": "0"}  # the column, untouched, on its way to `correct`


def test_early_stopping_counts_checks_without_improvement():
    stop = hybridrl.EarlyStopping("critic/score/mean", patience=2, mode="max", min_delta=0.01)
    assert [stop.on_step_end({"critic/score/mean": v}) for v in (0.1, 0.105, 0.2, 0.2, 0.19)] == [
        False,
        False,
        False,
        False,
        True,
    ]
    assert stop.best == 0.2
    with pytest.raises(KeyError, match="no metric 'critic/score/mean'"):
        stop.on_step_end({"actor/pg_loss": 0.0})
