"""The mixture-of-experts keys: router replay (actor.router_replay.mode) and expert parallelism
(actor.fsdp_config.expert_parallel_size), their one-line errors, and verl's spellings."""

import pytest

from hybridrl.config import ConfigError, load_config

REQUIRED = ["actor_rollout_ref.model.path=models/tiny", "data.train_files=data/train.parquet"]
A = "actor_rollout_ref.actor"
GPUS4 = ["trainer.n_gpus_per_node=4", "data.train_batch_size=8", f"{A}.ppo_mini_batch_size=4"]


def errors(*overrides, verl=None) -> list[str]:
    try:
        load_config(None, [*REQUIRED, *overrides], verl=verl)
    except ConfigError as e:
        return e.errors
    return []


def test_defaults_and_accepted_values():
    cfg = load_config(None, REQUIRED)
    assert cfg.actor_rollout_ref.actor.router_replay.mode == "disabled"
    assert cfg.actor_rollout_ref.actor.fsdp_config.expert_parallel_size == 1
    for mode in ("R2", "R3"):
        assert errors(f"{A}.router_replay.mode={mode}") == []
    assert errors(*GPUS4, f"{A}.fsdp_config.expert_parallel_size=4") == []


@pytest.mark.parametrize(
    "overrides,message",
    [
        ([f"{A}.router_replay.mode=R4"], "router_replay.mode=R4 is not one of disabled, R2, R3"),
        (
            [*GPUS4, f"{A}.router_replay.mode=R3", f"{A}.ulysses_sequence_parallel_size=2"],
            "ulysses_sequence_parallel_size=2 and actor_rollout_ref.actor.router_replay.mode=R3 do not combine",
        ),
        (
            [f"{A}.router_replay.mode=R3", "actor_rollout_ref.rollout.name=hf"],
            "router_replay.mode=R3 replays the routing the native engine records; rollout.name=hf does not record it",
        ),
        (
            [f"{A}.router_replay.mode=R2", f"{A}.reuse_on_policy_log_prob=true"],
            "R2 replays the routing of the trainer's old-log-prob pass, which actor_rollout_ref.actor.reuse_on_policy_log_prob",
        ),
        (
            [*GPUS4, f"{A}.fsdp_config.expert_parallel_size=3"],
            "expert_parallel_size=3 must divide the actor's 4 ranks",
        ),
        (
            [*GPUS4, f"{A}.fsdp_config.expert_parallel_size=2", f"{A}.ulysses_sequence_parallel_size=2"],
            "ulysses_sequence_parallel_size=2 and actor_rollout_ref.actor.fsdp_config.expert_parallel_size=2 do not combine",
        ),
        ([*GPUS4, f"{A}.fsdp_config.expert_parallel_size=2", f"{A}.fsdp_config.fsdp_size=2"], "fsdp_size=2 must be -1"),
        (
            [*GPUS4, f"{A}.fsdp_config.expert_parallel_size=2", "actor_rollout_ref.model.lora_rank=8"],
            "expert_parallel_size=2 does not run LoRA",
        ),
        (["actor_rollout_ref.ref.fsdp_config.expert_parallel_size=2"], "is not read: the reference uses"),
    ],
)
def test_bad_values_fail_with_one_line_naming_the_fix(overrides, message):
    errs = errors(*overrides)
    assert any(message in e for e in errs), errs


def test_verls_keys():
    argv = [
        f"{A}.megatron.expert_model_parallel_size=4",  # Megatron's expert parallelism: ours
        "actor_rollout_ref.ref.megatron.expert_model_parallel_size=4",  # the reference follows the actor
        f"{A}.router_replay.mode=R3",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",  # verl's engine switch: ours records for R3
        "trainer.n_gpus_per_node=4",
    ]
    cfg = load_config(None, [*REQUIRED, *argv], verl="ppo")
    assert cfg.actor_rollout_ref.actor.fsdp_config.expert_parallel_size == 4
    assert cfg.actor_rollout_ref.actor.router_replay.mode == "R3"
    with pytest.raises(ConfigError, match="router_replay.mode=R3 needs router replay in the reference"):
        load_config(None, [*REQUIRED, "actor_rollout_ref.ref.router_replay.mode=R3"], verl="ppo")
    with pytest.raises(ConfigError, match="record_file=r.pt needs router-replay files"):
        load_config(None, [*REQUIRED, f"{A}.router_replay.record_file=r.pt"], verl="ppo")
