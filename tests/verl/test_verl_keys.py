"""Every key of verl's PPO config tree is known: ours, renamed, normalized, ignored with a notice,
or refused with what is missing (hybridrl/compat/verl/keys.py)."""

import importlib.util
from pathlib import Path

import pytest
import yaml

from hybridrl.config import ConfigError, load_config, plan_batches
from hybridrl.config.schema import walk

VERL_KEYS = yaml.safe_load((Path(__file__).parent / "data" / "ppo_trainer_keys.yaml").read_text())
REQUIRED = ["actor_rollout_ref.model.path=models/m", "data.train_files=data/train.parquet"]
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"


def verl(*overrides, entry="ppo"):
    return load_config(None, [*REQUIRED, *overrides], verl=entry)


def errors(*overrides):
    with pytest.raises(ConfigError) as info:
        verl(*overrides)
    return info.value.errors


def _literal(v) -> bool:
    return not (isinstance(v, str) and ("${" in v or v == "???"))


def test_verls_whole_default_tree_is_accepted():
    """All 507 leaves of verl's ppo_trainer.yaml at verl's defaults: no error, no unknown key."""
    assert len(VERL_KEYS) == 507
    overrides = [
        f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
        for k, v in VERL_KEYS.items()
        if _literal(v)
    ]
    cfg = verl(*overrides, f"{R}.name=vllm")
    (ignored,) = [n for n in cfg.notices if n.startswith("ignored, no effect here: ")]
    assert "actor_rollout_ref.rollout.max_model_len" in ignored and "(vLLM/SGLang/TRT-LLM engine knob" in ignored
    assert "actor_rollout_ref.model.use_shm" in ignored and "(shm model loading)" in ignored
    assert ignored.count("actor_rollout_ref.rollout.load_format") == 1
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2  # verl's default, honoured (native engine)


@pytest.mark.parametrize("key", [k for k, v in VERL_KEYS.items() if not _literal(v)])
def test_every_interpolated_verl_key_is_known(key):
    """Keys whose verl default is an interpolation: set to a value, never 'unknown'."""
    try:
        verl(f"{key}=null")
    except ConfigError as e:
        assert not [m for m in e.errors if "unknown key" in m], e.errors


def test_no_config_defaults_are_verls_for_every_shared_key():
    ours = {e.path: e.value for e in walk(verl())}
    differ = {k: (v, ours[k]) for k, v in VERL_KEYS.items() if k in ours and _literal(v) and ours[k] != v}
    assert differ == {
        # paths: verl's are placeholders; here an empty one is an error naming the key
        "actor_rollout_ref.model.path": ("~/models/deepseek-llm-7b-chat", "models/m"),
        "actor_rollout_ref.model.tokenizer_path": (None, "models/m"),  # resolved from the model path, as verl does
        "critic.model.path": ("~/models/deepseek-llm-7b-chat", "models/m"),
        "data.train_files": ("~/data/rlhf/gsm8k/train.parquet", "data/train.parquet"),
        "data.val_files": ("~/data/rlhf/gsm8k/test.parquet", None),
        "data.val_max_samples": (-1, None),  # both mean every row
        "data.seed": (None, 1),  # verl: null = trainer.seed too
        "trainer.logger": (["console", "wandb"], ["console", "wandb", "jsonl"]),  # + the run's metrics.jsonl
        "trainer.device": ("cuda", "auto"),  # cuda where there is one
        "actor_rollout_ref.rollout.tensor_model_parallel_size": (2, 1),  # verl's 2 assumes several GPUs
        # verl's 1; ours follows the actor's degree (a colocated critic shares its processes; the
        # values are the same either way, only memory per device differs)
        "critic.ulysses_sequence_parallel_size": (1, None),
        "reward_model.model.path": ("~/models/FsfairX-LLaMA3-RM-v0.1", None),  # read only with reward_model.enable
        "reward_model.model.use_remove_padding": (False, True),  # padding-free scoring: the same scores, faster
        # the native engine's versions: the same tokens, off until their speed is measured on a GPU (docs/rollout.md)
        "actor_rollout_ref.rollout.enable_chunked_prefill": (True, False),
        "actor_rollout_ref.rollout.enable_prefix_caching": (True, False),
        # a step's samples decode in one wave: the same samples, faster (BENCHMARKS.md)
        "actor_rollout_ref.rollout.max_num_seqs": (256, 1024),
    }
    assert ours[f"{A}.clip_ratio_low"] == ours[f"{A}.clip_ratio_high"] == 0.2
    assert ours["data.train_batch_size"] == 1024 and ours["trainer.n_gpus_per_node"] == 8


def test_a_hybridrl_config_file_keeps_hybridrl_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: {train_files: t.parquet}\nactor_rollout_ref: {model: {path: m}}\n")
    cfg = load_config(path)
    assert cfg.data.train_batch_size == 256 and cfg.trainer.n_gpus_per_node == 1 and cfg.notices == []


def test_a_key_that_would_change_the_result_is_an_error_naming_what_is_missing():
    (e,) = errors(f"{A}.strategy=megatron")
    assert "needs the Megatron strategy" in e
    verl("actor_rollout_ref.hybrid_engine=true", f"{A}.strategy=fsdp2", "reward_model.enable=false")


def test_standalone_rollout_keys_of_verls_async_recipes():
    """verl's one-step-off / fully-async recipes: trainer.n_gpus_per_node train, rollout.n_gpus_per_node generate."""
    for spelling in ("rollout", "actor_rollout_ref.rollout"):
        cfg = verl(
            "actor_rollout_ref.hybrid_engine=false",
            "trainer.n_gpus_per_node=4",
            f"{spelling}.n_gpus_per_node=2",
            f"{spelling}.nnodes=1",
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=256",
        )
        assert (cfg.resource_pool.actor_rollout_ref, cfg.resource_pool.rollout, cfg.trainer.n_gpus_per_node) == (4, 2, 6)
        assert cfg.actor_rollout_ref.rollout.update_weights_bucket_megabytes == 256
        assert any("standalone rollout: 2 rollout device(s) per node apart from the actor's 4" in n for n in cfg.notices)
        assert any("set trainer.mode=one_step_off" in n for n in cfg.notices)  # sync: no overlap, and it says so
    cfg = verl("rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1", "trainer.mode=one_step_off")
    assert cfg.resource_pool.rollout == 1 and not any("set trainer.mode=one_step_off" in n for n in cfg.notices)
    assert errors("actor_rollout_ref.hybrid_engine=false") == [
        "actor_rollout_ref.hybrid_engine=false needs rollout devices apart from the actor's: set rollout.n_gpus_per_node "
        "(verl's recipes) or resource_pool.rollout, or leave hybrid_engine out"
    ]
    (e,) = errors("rollout.n_gpus_per_node=2", "rollout.nnodes=2")
    assert "hybridrl's rollout pool spans the trainer's nodes (trainer.nnodes=1)" in e
    (e,) = errors("async_training.partial_rollout=true")  # a hybridrl key: the check says what it needs
    assert "async_training.partial_rollout=true needs a rollout pool of its own" in e
    (e,) = errors("async_training.trigger_parameter_sync_step=2")
    assert "weights sent to the rollout pool only every N updates" in e
    verl("async_training.partial_rollout=false", "async_training.trigger_parameter_sync_step=1")


def test_renamed_keys():
    cfg = verl(
        f"{A}.optim.clip_grad=0.5",
        f"{A}.optim.warmup_style=cosine",
        "critic.optim.lr_warmup_steps_ratio=0.1",
        "trainer.max_actor_ckpt_to_keep=3",
        "trainer.max_critic_ckpt_to_keep=2",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2,4]",
        "ray_kwargs.ray_init.num_cpus=4",
        "+ray_kwargs.ray_init.runtime_env.env_vars.TOKENIZERS_PARALLELISM=false",
    )
    a = cfg.actor_rollout_ref.actor
    assert (a.grad_clip, a.optim.lr_scheduler_type, cfg.critic.optim.lr_warmup_steps_ratio) == (0.5, "cosine", 0.1)
    assert cfg.trainer.max_ckpt_to_keep == 3  # one step directory holds both: the larger count
    assert cfg.trainer.profile_steps == [2, 4]
    assert cfg.ray_init.num_cpus == 4
    assert cfg.ray_init.kwargs == {"runtime_env": {"env_vars": {"TOKENIZERS_PARALLELISM": False}}}


def test_global_micro_batch_sizes_are_divided_by_the_world_as_verl_does():
    cfg = verl(
        "trainer.n_gpus_per_node=4",
        f"{A}.ppo_micro_batch_size=32",
        f"{R}.log_prob_micro_batch_size=64",
        "actor_rollout_ref.ref.log_prob_micro_batch_size=16",
        "critic.ppo_micro_batch_size=8",
    )
    a = cfg.actor_rollout_ref
    assert (
        a.actor.ppo_micro_batch_size_per_gpu,
        a.rollout.log_prob_micro_batch_size_per_gpu,
        a.ref.log_prob_micro_batch_size_per_gpu,
        cfg.critic.ppo_micro_batch_size_per_gpu,
    ) == (8, 16, 4, 2)
    (e,) = errors("trainer.n_gpus_per_node=4", f"{A}.ppo_micro_batch_size=32", f"{A}.ppo_micro_batch_size_per_gpu=8")
    assert e.startswith(f"{A}.ppo_micro_batch_size and {A}.ppo_micro_batch_size_per_gpu are both set; set only one")
    (e,) = errors("trainer.n_gpus_per_node=4", f"{R}.log_prob_micro_batch_size=2")
    assert "smaller than the data-parallel size 4" in e


def test_sequence_and_tensor_parallelism_lay_out_as_in_verl():
    cfg = verl(
        "trainer.n_gpus_per_node=8",
        f"{A}.ulysses_sequence_parallel_size=2",
        f"{R}.tensor_model_parallel_size=4",
        f"{A}.ppo_micro_batch_size_per_gpu=16",
        "critic.ppo_micro_batch_size_per_gpu=32",
    )
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 16  # per sp group, as in verl
    plan = plan_batches(cfg)
    assert plan.dp == 4 and plan.actor.per_device_mini_batch == 256 // 4  # verl: 256 // (8 // 2) = 64
    assert plan.actor.layout.sp == 2 and plan.actor.layout.dp_shard == 4
    text = "\n".join(cfg.notices)
    assert "ulysses_sequence_parallel_size" not in text
    assert plan.actor.layout.rollout_replicas == 2 and "tensor_model_parallel_size" not in text  # 2 replicas x tp 4
    (e,) = errors(f"{A}.ulysses_sequence_parallel_size=3", "trainer.n_gpus_per_node=8")
    assert e.startswith(f"{A}.ulysses_sequence_parallel_size=3 does not divide")
    (e,) = errors(f"{R}.tensor_model_parallel_size=0")
    assert e == f"{R}.tensor_model_parallel_size=0 must be >= 1; use e.g. {R}.tensor_model_parallel_size=1"


def test_verl_engines_and_loggers_map_onto_ours():
    cfg = verl(f"{R}.name=sglang", "trainer.logger=[console,swanlab,file]")
    assert cfg.actor_rollout_ref.rollout.name == "auto"
    assert cfg.trainer.logger == ["console", "jsonl"]
    assert any("swanlab not available here" in n for n in cfg.notices)
    # vllm: the same with and without a file (tests/cli/test_preflight.py)
    expected = "vllm" if importlib.util.find_spec("vllm") else "auto"
    assert load_config(None, [*REQUIRED, f"{R}.name=vllm"]).actor_rollout_ref.rollout.name == expected


def test_grpo_with_one_sample_is_a_warning_as_in_verl():
    cfg = verl("algorithm.adv_estimator=grpo", f"{R}.n=1")
    assert any(n.startswith("algorithm.adv_estimator=grpo with actor_rollout_ref.rollout.n=1") for n in cfg.notices)
    (e,) = errors("algorithm.adv_estimator=rloo", f"{R}.n=1")
    assert "needs actor_rollout_ref.rollout.n > 1" in e


def test_hydra_forms():
    cfg = verl(f"{R}.n=5", f"~{R}.n", "+data.seed=7", "++trainer.max_ckpt_to_keep=2")
    assert (cfg.actor_rollout_ref.rollout.n, cfg.data.seed, cfg.trainer.max_ckpt_to_keep) == (1, 7, 2)


def test_did_you_mean_never_points_to_a_key_with_another_meaning():
    (e,) = errors(f"{A}.ppo_micro_batch=4")
    assert f"did you mean '{A}.ppo_micro_batch_size_per_gpu'" in e and "mini" not in e
    (e,) = errors("data.min_prompt_length=4")
    assert "did you mean" not in e
    verl(f"{A}.ppo_micro_batch_size=8")  # verl's deprecated global size: known, not a typo


def test_critic_follows_the_actors_dynamic_batching_and_loss_aggregation():
    c = verl(f"{A}.use_dynamic_bsz=true", f"{A}.loss_agg_mode=seq-mean-token-mean").critic
    assert (c.use_dynamic_bsz, c.loss_agg_mode, c.ppo_max_token_len_per_gpu) == (True, "seq-mean-token-mean", 32768)
    assert verl(f"{A}.use_dynamic_bsz=true", "critic.use_dynamic_bsz=false").critic.use_dynamic_bsz is False


def test_prefix_caching_and_chunked_prefill_are_ours_and_say_where_they_do_nothing():
    """verl scripts set enable_prefix_caching / enable_chunked_prefill (vLLM knobs): the native
    engine implements them at TP=1; elsewhere the run says they do nothing."""
    cfg = verl(f"{R}.enable_prefix_caching=True", f"{R}.enable_chunked_prefill=True", f"{R}.name=native")
    assert cfg.actor_rollout_ref.rollout.enable_prefix_caching and cfg.actor_rollout_ref.rollout.enable_chunked_prefill
    assert not any("does nothing" in n or "do nothing" in n for n in cfg.notices)
    cfg = verl(f"{R}.enable_prefix_caching=True", f"{R}.name=hf")
    assert any(n.startswith(f"{R}.enable_prefix_caching=true applies to the native engine") for n in cfg.notices)


@pytest.mark.parametrize("section", ["reward_model", "reward"])
def test_dapo_recipes_overlong_buffer_cfg_spelling_configures_the_overlong_buffer(section):
    """verl's DAPO recipes: +reward_model.reward_kwargs.overlong_buffer_cfg.{enable,len,penalty_factor,log}
    and max_resp_len (the reward manager's kwargs) are hybridrl's reward_model.overlong_buffer."""
    kw = f"+{section}.reward_kwargs"
    cfg = verl(
        "data.max_response_length=512",
        f"{kw}.overlong_buffer_cfg.enable=True",
        f"{kw}.overlong_buffer_cfg.len=128",
        f"{kw}.overlong_buffer_cfg.penalty_factor=0.5",
        f"{kw}.overlong_buffer_cfg.log=True",
        f"{kw}.max_resp_len=512",
        "reward_model.reward_manager=dapo",
    )
    ob = cfg.reward_model.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor, ob.log) == (True, 128, 0.5, True)
    assert cfg.custom_reward_function.reward_kwargs == {}  # nothing reaches the scorer
    (message,) = errors("data.max_response_length=512", f"{kw}.max_resp_len=256")
    assert "max_resp_len=256 differs from data.max_response_length=512" in message
