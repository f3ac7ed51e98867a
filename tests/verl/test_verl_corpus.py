"""32 of verl's own example command lines (tests/verl/scripts/) are accepted with no config file,
and hybridrl's batch plan is verl's normalization, worked out independently in corpus.py."""

import pytest
from corpus import params, scripts, verl_plan

from hybridrl.config import ConfigError, explain_text, load_config, plan_batches


def test_the_corpus_is_large_enough():
    names = [s.name for s in scripts()]
    assert len(names) >= 30
    families = {n.split("__")[0] for n in names}
    assert {
        "ppo_trainer",
        "grpo_trainer",
        "rloo_trainer",
        "remax_trainer",
        "reinforce_plus_plus_trainer",
        "cispo_trainer",
        "gpg_trainer",
        "gmpo_trainer",
        "tuning",
        "recipe",
        "docs",
    } <= families


@pytest.mark.parametrize("script", params())
def test_explain_accepts_the_script_as_is(script):
    cfg = load_config(None, script.argv, verl=script.entry)
    assert explain_text(cfg).startswith("Batch plan")


@pytest.mark.parametrize("script", params())
def test_batch_plan_is_verls(script):
    """Accepted, and the per-device sizes are verl's: with sequence parallelism the data-parallel
    size is the devices / sp, and a per-GPU size is per sp group, as in verl."""
    try:
        cfg = load_config(None, script.argv, verl=script.entry)
    except ConfigError as e:
        pytest.fail(f"{script.name}:\n{e}")
    plan, verl = plan_batches(cfg), verl_plan(script)
    assert plan.dp == verl.world // verl.sp
    assert plan.actor.per_device_mini_batch == verl.actor_mini_per_gpu
    if verl.actor_micro_per_gpu is not None:
        assert plan.actor.micro_batch == verl.actor_micro_per_gpu
    train, mini = script.int("data.train_batch_size", 1024), script.int("actor_rollout_ref.actor.ppo_mini_batch_size", 256)
    assert plan.actor.num_mini_batches == train // mini
    assert plan.sequences_per_device == train * script.int("actor_rollout_ref.rollout.n", 1) // (verl.world // verl.sp)
    if plan.critic is not None:
        assert plan.critic.per_device_mini_batch == verl.critic_mini_per_gpu
        if verl.critic_micro_per_gpu is not None:
            assert plan.critic.micro_batch == verl.critic_micro_per_gpu
        if script.value("critic.use_dynamic_bsz") is None:  # verl: inherits the actor's
            assert cfg.critic.use_dynamic_bsz == cfg.actor_rollout_ref.actor.use_dynamic_bsz
