"""docs/config.md is generated from the dataclasses; explain shows the batch plan or the errors."""

import dataclasses
from pathlib import Path

from hybridrl.config import Config, explain, load_config
from hybridrl.config.docs import render_reference
from hybridrl.config.schema import walk

REPO = Path(__file__).resolve().parents[2]
REQUIRED = ["actor_rollout_ref.model.path=models/tiny", "data.train_files=data/train.parquet"]


def test_reference_doc_is_up_to_date():
    committed = (REPO / "docs" / "config.md").read_text()
    assert committed == render_reference(), "regenerate: python -m hybridrl.config.docs > docs/config.md"


def test_every_key_is_documented_once_and_listed():
    text = render_reference()
    for entry in walk(Config()):
        assert entry.doc, f"{entry.path} has no doc"
        assert f"| `{entry.path}` |" in text
    assert "`critic.optim.lr` | `float` | `1e-05`" in text  # the critic's own default, not OptimConfig's
    assert (
        "One of: `gae`, `grpo`, `rloo`, `reinforce_plus_plus`, `remax`, `reinforce_plus_plus_baseline`, `opo`, "
        "`gpg`, `grpo_passk`." in text
    )  # from the registry
    assert "One of: `vanilla`, `gspo`, `cispo`, `gpg`, `clip_cov`, `kl_cov`, `geo_mean`." in text


def test_every_component_is_a_dataclass_with_a_docstring():
    for entry in walk(Config()):
        if entry.is_section:
            assert dataclasses.is_dataclass(entry.value) and type(entry.value).__doc__


def test_explain_shows_the_batch_plan():
    text = explain(
        None,
        [
            *REQUIRED,
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=128",
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=32",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        ],
    )
    lines = text.splitlines()
    assert lines[0] == "Batch plan (data-parallel size 1 = 1 node(s) x 1 device(s))"
    row = next(line for line in lines if "mini-batches" in line)
    assert "128 / ppo_mini_batch_size (32)" in row
    assert row.endswith(" 4  per epoch x 1 epoch(s) = 4 optimizer steps per step")
    assert any("32 x 8 / dp 1" in line and " 256  sequences" in line for line in lines)
    assert any("(gradient accumulation 16)" in line for line in lines)
    assert any("16 x (512 + 512)" in line and "16384" in line for line in lines)
    assert "critic: off (algorithm.adv_estimator=grpo)" in lines


def test_explain_accepts_a_config_object_and_shows_the_critic():
    cfg = load_config(None, [*REQUIRED, "trainer.n_gpus_per_node=2", "trainer.total_training_steps=7"])
    text = explain(cfg, ["critic.ppo_micro_batch_size_per_gpu=8"])
    assert "critic (critic)" in text
    assert "ppo_micro_batch_size_per_gpu (8)" in text
    assert "trainer.total_training_steps" in text and text.rstrip().endswith("7")


def test_explain_lists_every_error_instead_of_a_plan():
    text = explain(
        None, ["actor_rollout_ref.actor.lr=1e-6", "actor_rollout_ref.actor.ppo_mini_batch_size=48", "data.train_batch_size=128"]
    )
    assert text.startswith("4 problem(s) in the config:")
    assert "did you mean 'actor_rollout_ref.actor.optim.lr'" in text
    assert "use a divisor such as 32 or 64" in text
    assert "actor_rollout_ref.model.path is empty" in text
