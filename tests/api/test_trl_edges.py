"""The edges a TRL user hits first (issue 54 §4, hybridrl/compat/trl): GRPOConfig habits, `args=GRPOConfig(...)`,
GRPOTrainer's positional order, transformers callbacks. TRL is not needed: the config objects here have
GRPOConfig's attribute names and defaults."""

from __future__ import annotations

import dataclasses
import re
import types

import pytest

import hybridrl
import hybridrl.api as api
from hybridrl import HybridRLError, RLTrainer

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]


def correct(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


@pytest.fixture
def built(monkeypatch):
    """grpo() up to its RLTrainer (the config built, checked and carrying its notices), without training."""
    monkeypatch.setattr(api.RLTrainer, "fit", lambda self: self)


@dataclasses.dataclass
class GRPOConfig:
    """A stand-in with GRPOConfig's names and defaults, and its __post_init__'s derived batch fields."""

    output_dir: str | None = None
    learning_rate: float = 1e-6
    num_generations: int = 8
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    max_completion_length: int = 256
    logging_steps: float = 10
    bf16: bool | None = None
    save_strategy: str = "steps"
    push_to_hub: bool = False
    beta: float = 0.0
    seed: int = 42
    label_smoothing_factor: float = 0.0  # a TrainingArguments name hybridrl has no counterpart for

    def __post_init__(self):
        self.output_dir = self.output_dir or "trainer_output"
        self.bf16 = True if self.bf16 is None else self.bf16
        if self.generation_batch_size is None:
            self.steps_per_generation = self.steps_per_generation or self.gradient_accumulation_steps
            self.generation_batch_size = self.per_device_train_batch_size * self.steps_per_generation
        else:
            self.steps_per_generation = self.generation_batch_size // self.per_device_train_batch_size


def test_names_that_change_nothing_are_one_notice_not_an_error(built, tiny_model_with_weights, tmp_path):
    trainer = hybridrl.grpo(
        tiny_model_with_weights, ROWS, correct, logging_steps=5, bf16=True, dataloader_num_workers=4, output_dir=tmp_path
    )
    (notice,) = [n for n in trainer.config.notices if n.startswith("TRL's names")]
    assert "logging_steps (hybridrl logs every step's metrics" in notice
    assert "bf16 (precision follows the device" in notice and "dataloader_num_workers (every row is tokenized once" in notice
    assert trainer.config.trainer.default_local_dir == str(tmp_path)


def test_every_name_that_cannot_be_used_is_reported_at_once():
    with pytest.raises(HybridRLError) as e:
        hybridrl.grpo(
            "unused",
            ROWS,
            correct,
            save_strategy="epoch",
            eval_strategy="epoch",
            push_to_hub=True,
            logging_steps=5,
            no_such_name=1,
            lr_scheduler_type="linear",
        )
    message = str(e.value)
    assert "\n" not in message and message.startswith("5 problems in the arguments of grpo(): (1) ")
    assert "save_strategy='epoch' is TRL's: hybridrl saves a checkpoint every save_steps=N steps (trainer.save_freq)" in message
    assert "eval_strategy='epoch' is TRL's: hybridrl validates on eval_dataset every eval_steps=N steps" in message
    assert "push_to_hub=True is TRL's: hybridrl does not upload" in message
    assert "lr_scheduler_type='linear' is TRL's: hybridrl has constant and cosine" in message
    assert "keyword no_such_name=1 is no config key" in message
    assert "logging_steps" not in message


def test_trl_names_at_their_harmless_values_pass(built, tiny_model_with_weights):
    trainer = hybridrl.grpo(
        tiny_model_with_weights, ROWS, correct, push_to_hub=False, save_strategy="steps", optim="adamw_torch", save_total_limit=2
    )
    assert trainer.config.trainer.max_ckpt_to_keep == 2


def test_args_object_sets_what_differs_from_grpoconfigs_defaults(built, tiny_model_with_weights, tmp_path):
    args = GRPOConfig(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4, learning_rate=1e-5, logging_steps=1
    )
    trainer = hybridrl.grpo(tiny_model_with_weights, reward_funcs=[correct], args=args, train_dataset=ROWS)
    cfg = trainer.config
    assert cfg.actor_rollout_ref.rollout.n == 2 and cfg.actor_rollout_ref.actor.optim.lr == 1e-5
    assert cfg.data.train_batch_size == 2 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 2  # 4 completions / 2
    assert cfg.trainer.default_local_dir == str(tmp_path)
    assert cfg.trainer.seed == 1  # GRPOConfig's default seed (42) is not carried over: hybridrl's stands
    notices = " | ".join(cfg.notices)
    assert "logging_steps" in notices and "bf16" not in notices  # bf16 is at its (derived) default
    # generation_batch_size as __post_init__ derives it is no setting of the user's
    assert not any("generation_batch_size" in n for n in cfg.notices)


def test_args_object_names_with_no_counterpart_are_listed_once(built, tiny_model_with_weights):
    args = GRPOConfig(label_smoothing_factor=0.1, num_generations=2)
    cfg = hybridrl.grpo(tiny_model_with_weights, ROWS, correct, args=args).config
    assert "args: ignored, TRL's names with no counterpart here: label_smoothing_factor" in cfg.notices


def test_args_object_with_refused_values_fails_in_one_line():
    args = GRPOConfig(push_to_hub=True, generation_batch_size=32, num_generations=2)
    with pytest.raises(
        HybridRLError, match=r"^2 problems in the arguments of grpo\(\): .*generation_batch_size=32 is TRL's: .*push_to_hub"
    ):
        hybridrl.grpo("unused", ROWS, correct, args=args)


def test_any_object_with_the_attribute_names_is_an_args_object(built, tiny_model_with_weights):
    args = types.SimpleNamespace(num_generations=2, max_completion_length=16)
    cfg = hybridrl.grpo(tiny_model_with_weights, ROWS, correct, args=args, rollout_n=4).config
    assert cfg.actor_rollout_ref.rollout.n == 4  # a keyword wins over args
    assert cfg.data.max_response_length == 16


def test_trls_positional_order(built, tiny_model_with_weights):
    """GRPOTrainer(model, reward_funcs, args): the same call here."""
    trainer = hybridrl.grpo(tiny_model_with_weights, [correct], GRPOConfig(num_generations=2), train_dataset=ROWS)
    assert trainer.config.actor_rollout_ref.rollout.n == 2
    assert trainer.reward_fn.__class__.__name__ == "TRLRewards"
    trainer = hybridrl.grpo(tiny_model_with_weights, correct, train_dataset=ROWS, num_generations=2)
    assert trainer.reward_fn.__class__.__name__ == "TRLRewards"


def test_trls_positional_order_with_rows_third_is_refused_in_one_line():
    with pytest.raises(HybridRLError, match=re.escape("grpo(model, reward_funcs, list): in TRL's order the third argument is")):
        hybridrl.grpo("unused", correct, ROWS)


def test_hybridrls_and_trls_name_for_one_argument_is_refused():
    with pytest.raises(HybridRLError, match="data and train_dataset are the same argument"):
        hybridrl.grpo("unused", ROWS, correct, train_dataset=ROWS)


class TrainerCallbackShaped:
    """transformers' TrainerCallback shape, without transformers' class."""

    def on_step_end(self, args, state, control, **kwargs):
        return control


def test_a_transformers_callback_is_refused_at_the_start():
    from transformers import EarlyStoppingCallback

    for cb in (EarlyStoppingCallback(), TrainerCallbackShaped()):
        with pytest.raises(HybridRLError) as e:
            RLTrainer(reward_fn=correct, train_data=ROWS, callbacks=[cb])
        message = str(e.value)
        assert f"callback {type(cb).__name__} is a transformers TrainerCallback" in message
        assert "hybridrl calls on_step_end(metrics), on_evaluate(metrics) and on_save(path)" in message


def test_a_callback_hook_that_cannot_take_its_argument_is_refused_at_the_start():
    class NoArgument:
        def on_save(self):
            pass

    with pytest.raises(HybridRLError, match=re.escape("callback NoArgument.on_save() cannot be called as on_save(path)")):
        RLTrainer(reward_fn=correct, train_data=ROWS, callbacks=[NoArgument()])


def test_doctests():
    import doctest

    from hybridrl.compat.trl import settings

    assert doctest.testmod(settings).failed == 0
