"""Validation messages name the keys and suggest a value that works; batch plans by hand."""

import itertools
import random

import pytest

from hybridrl.config import (
    Config,
    ConfigError,
    find_problems,
    load_config,
    plan_batches,
    validate,
)
from hybridrl.config.schema import show

REQUIRED = ["actor_rollout_ref.model.path=models/tiny", "data.train_files=data/train.parquet"]
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"


def load(*overrides, check=True):
    return load_config(None, [*REQUIRED, *overrides], check=check)


# --------------------------------------------------------------------------- batch plan by hand


ARGS_128 = (
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=128",
    f"{R}.n=8",
    f"{A}.ppo_mini_batch_size=32",
    f"{A}.ppo_micro_batch_size_per_gpu=16",
)


def test_plan_single_device_grpo():
    cfg = load(*ARGS_128)
    p = plan_batches(cfg)
    assert (p.dp, p.prompts_per_step, p.sequences_per_step, p.sequences_per_device) == (1, 128, 1024, 1024)
    assert p.generation_rounds == 1  # 1024 sequences, up to 1024 at a time (rollout.max_num_seqs)
    assert plan_batches(load(*ARGS_128, f"{R}.max_num_seqs=256")).generation_rounds == 4
    a = p.actor
    assert (a.mini_batch_prompts, a.mini_batch_sequences, a.per_device_mini_batch) == (32, 256, 256)
    assert (a.micro_batch, a.grad_accum) == (16, 16)
    assert (a.num_mini_batches, a.epochs, a.optimizer_steps_per_step) == (4, 1, 4)
    assert a.tokens_per_micro_batch == 16 * (512 + 512)
    assert p.critic is None
    assert (p.rollout_log_prob_micro_batch, p.rollout_log_prob_passes) == (1024, 1)
    assert not p.uses_ref


def test_plan_two_nodes_with_critic_inheriting_the_actor():
    cfg = load(
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=2",
        "data.train_batch_size=64",
        f"{R}.n=4",
        f"{A}.ppo_mini_batch_size=16",
        f"{A}.ppo_epochs=2",
        "critic.ppo_micro_batch_size_per_gpu=4",
        f"{R}.log_prob_micro_batch_size_per_gpu=24",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=100",
        f"{A}.use_kl_loss=true",
        "data.max_prompt_length=100",
        "data.max_response_length=28",
    )
    p = plan_batches(cfg)
    assert (p.dp, p.sequences_per_step, p.sequences_per_device) == (4, 256, 64)
    a = p.actor
    assert (a.mini_batch_sequences, a.per_device_mini_batch, a.micro_batch, a.grad_accum) == (64, 16, 16, 1)
    assert (a.num_mini_batches, a.optimizer_steps_per_step) == (4, 8)
    assert a.tokens_per_micro_batch == 16 * 128
    c = p.critic
    assert (c.mini_batch_prompts, c.per_device_mini_batch, c.micro_batch, c.grad_accum) == (16, 16, 4, 4)
    assert (c.epochs, c.optimizer_steps_per_step) == (2, 8)
    assert (p.rollout_log_prob_micro_batch, p.rollout_log_prob_passes) == (24, 3)  # 24 + 24 + 16
    assert p.uses_ref and (p.ref_log_prob_micro_batch, p.ref_log_prob_passes) == (64, 1)


def test_plan_refuses_sizes_that_do_not_fit():
    cfg = load(f"{A}.ppo_mini_batch_size=48", "data.train_batch_size=128", check=False)
    with pytest.raises(ConfigError, match=r"ppo_mini_batch_size=48 does not divide data.train_batch_size=128"):
        plan_batches(cfg)


def test_plan_never_has_empty_pieces():
    """Over a grid of small sizes: either the plan is refused or every piece is >= 1 and adds
    up; and when exactly one rule is broken, its suggested fix makes the config valid. A fresh
    random quarter of the 8,640 combinations per run (the whole grid took 18 s of CI); a failure
    names its combination."""
    grid = list(itertools.product(range(1, 9), (1, 2, 3), (1, 2, 3, 4), range(1, 10), (None, 1, 2, 3, 4), ("gae", "grpo")))
    for combo in random.sample(grid, len(grid) // 4):
        train, n, gpus, mini, micro, est = combo
        cfg = _hand_built(train, n, gpus, mini, micro, est)
        problems = find_problems(cfg)
        if not problems:
            p = plan_batches(cfg)
            for r in (p.actor, p.critic):
                if r is None:
                    continue
                assert min(r.per_device_mini_batch, r.micro_batch, r.grad_accum, r.num_mini_batches) >= 1, combo
                assert r.micro_batch * r.grad_accum * p.dp == r.mini_batch_sequences, combo
                assert r.num_mini_batches * r.mini_batch_prompts == p.prompts_per_step, combo
            continue
        with pytest.raises(ConfigError):
            plan_batches(cfg)
        if len(problems) == 1:
            (problem,) = problems
            assert problem.fix, (combo, problem.message)
            for key, value in problem.fix.items():
                _set(cfg, key, value)
            assert validate(cfg) == [], (combo, problem.message)


def _hand_built(train, n, gpus, mini, micro, est) -> Config:
    cfg = Config()
    cfg.actor_rollout_ref.model.path = "m"
    cfg.data.train_files = "t.parquet"
    cfg.data.train_batch_size = train
    cfg.actor_rollout_ref.rollout.n = n
    cfg.trainer.n_gpus_per_node = gpus
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = mini
    cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = micro
    cfg.algorithm.adv_estimator = est
    return cfg


def _set(cfg, key, value):
    *parents, name = key.split(".")
    for part in parents:
        cfg = getattr(cfg, part)
    setattr(cfg, name, value)


# --------------------------------------------------------------------------- every problem suggests a fix

BROKEN = [
    # batch sizes
    ([f"{A}.ppo_mini_batch_size=48", "data.train_batch_size=128"], "use a divisor such as 32 or 64"),
    ([f"{A}.ppo_mini_batch_size=512"], "is larger than data.train_batch_size=256"),
    (
        ["trainer.n_gpus_per_node=3", "data.train_batch_size=96", f"{A}.ppo_mini_batch_size=32"],
        "cannot be split evenly over data-parallel size 3",
    ),
    (
        [
            "trainer.n_gpus_per_node=3",
            "data.train_batch_size=128",
            f"{R}.n=8",
            f"{A}.ppo_mini_batch_size=32",
            f"{A}.ppo_micro_batch_size_per_gpu=24",
        ],
        f"use data.train_batch_size=132 and {A}.ppo_mini_batch_size=33 and {A}.ppo_micro_batch_size_per_gpu=22, "
        f"or {R}.n=9, or a data-parallel size that divides 256",
    ),
    (
        ["data.train_batch_size=128", f"{R}.n=8", f"{A}.ppo_mini_batch_size=32", f"{A}.ppo_micro_batch_size_per_gpu=48"],
        "does not divide the per-device mini-batch of 256 sequences",
    ),
    ([f"{A}.ppo_micro_batch_size_per_gpu=512"], "is larger than the per-device mini-batch of 64 sequences"),
    (["critic.ppo_micro_batch_size_per_gpu=24"], "critic.ppo_micro_batch_size_per_gpu=24 does not divide"),
    (["critic.ppo_mini_batch_size=48"], "critic.ppo_mini_batch_size=48 does not divide data.train_batch_size=256"),
    (
        ["trainer.nnodes=2", "trainer.n_gpus_per_node=4", "data.train_batch_size=12", f"{A}.ppo_mini_batch_size=12"],
        "(trainer.nnodes=2 x trainer.n_gpus_per_node=4)",
    ),
    (["algorithm.adv_estimator=rloo"], f"needs {R}.n > 1 (got 1); use {R}.n=5"),
    (["algorithm.adv_estimator=rloo", f"{R}.n=1"], f"use {R}.n=5"),
    # ranges
    (["data.train_batch_size=0"], "data.train_batch_size=0 must be >= 1; use e.g. data.train_batch_size=256"),
    ([f"{A}.ppo_micro_batch_size_per_gpu=0"], f"use e.g. {A}.ppo_micro_batch_size_per_gpu=null"),
    ([f"{R}.n=0"], f"{R}.n=0 must be >= 1"),
    (["trainer.n_gpus_per_node=0"], "trainer.n_gpus_per_node=0 must be >= 1"),
    ([f"{A}.clip_ratio_c=1.0"], f"{A}.clip_ratio_c=1.0 must be > 1"),
    ([f"{A}.clip_ratio_low=-0.1"], f"{A}.clip_ratio_low=-0.1 must be > 0"),
    ([f"{R}.top_p=0"], f"{R}.top_p=0.0 must be in (0, 1]"),
    ([f"{R}.gpu_memory_utilization=1.5"], f"{R}.gpu_memory_utilization=1.5 must be in (0, 1]"),
    ([f"{R}.max_num_batched_tokens=0"], f"{R}.max_num_batched_tokens=0 must be >= 1"),
    (
        [f"{R}.weight_checksum_interval=-1"],
        f"{R}.weight_checksum_interval=-1 must be an integer >= 0; use e.g. {R}.weight_checksum_interval=20",
    ),
    ([f"{R}.name=native", f"{R}.n=8", f"{R}.max_num_seqs=4"], f"{R}.max_num_seqs=4 must be >= rollout.n=8"),
    ([f"{R}.name=natve"], f"use e.g. {R}.name=native"),
    ([f"{R}.top_k=0"], f"{R}.top_k=0 must be -1 (off) or >= 1"),
    ([f"{R}.temperature=-1"], f"{R}.temperature=-1.0 must be >= 0"),
    ([f"{R}.val_kwargs.top_p=1.5"], f"{R}.val_kwargs.top_p=1.5 must be in (0, 1]"),
    (["algorithm.gamma=1.5"], "algorithm.gamma=1.5 must be between 0 and 1"),
    (["trainer.total_training_steps=0"], "trainer.total_training_steps=0 must be >= 1"),
    (["trainer.save_freq=0"], "trainer.save_freq=0 must be -1 (off) or >= 1"),
    ([f"{A}.optim.betas=[0.9]"], "must be two numbers in [0, 1)"),
    ([f"{A}.optim.lr=0"], f"{A}.optim.lr=0.0 must be > 0"),
    (["critic.optim.lr=-1"], "critic.optim.lr=-1.0 must be > 0"),
    (["warmup.lr=0", "warmup.steps=5", "warmup.files=w.jsonl"], "warmup.lr=0.0 must be > 0"),
    # choices
    (["algorithm.adv_estimator=gpro", f"{R}.n=4"], "use e.g. algorithm.adv_estimator=grpo"),
    (["algorithm.adv_estimator=rlo"], "rloo would also need other keys changed"),
    ([f"{A}.loss_agg_mode=token_mean"], f"use e.g. {A}.loss_agg_mode=token-mean"),
    ([f"{A}.kl_loss_type=lowvar_kl"], f"use e.g. {A}.kl_loss_type=low_var_kl"),
    (["algorithm.kl_penalty=full"], "algorithm.kl_penalty=full is not one of kl, k1, abs, mse, k2, low_var_kl, k3"),
    (["algorithm.kl_ctrl.type=adaptiv"], "use e.g. algorithm.kl_ctrl.type=adaptive"),
    (["data.truncation=center"], "data.truncation=center is not one of error, left, right, middle"),
    (["trainer.resume_mode=resume"], "use e.g. trainer.resume_mode=auto"),
    (["trainer.device=gpu"], "trainer.device=gpu is not one of auto, cpu, cuda"),
    (["trainer.logger=[console, wandbb]"], "has 'wandbb', not among console"),
    ([f"{R}.name=sglang"], f"{R}.name=sglang is not one of auto, native, hf, vllm"),
    ([f"{A}.optim.lr_scheduler_type=linear"], "is not one of constant, cosine"),
    # requirements
    (["actor_rollout_ref.model.path="], "actor_rollout_ref.model.path is empty"),
    (["data.train_files=[]"], "data.train_files=[] names no file"),
    (["trainer.resume_mode=resume_path"], "trainer.resume_mode=resume_path needs trainer.resume_from_path"),
    (["warmup.steps=10"], "warmup.steps=10 needs warmup.files"),
    ([f"{R}.temperature=0"], f"{R}.temperature=0 with {R}.do_sample=true cannot sample"),
    ([f"{R}.val_kwargs.do_sample=true"], f"{R}.val_kwargs.temperature=0 with {R}.val_kwargs.do_sample=true"),
    (["custom_reward_function.path=my_reward.py", "custom_reward_function.name="], "must name a function in my_reward.py"),
]


@pytest.mark.parametrize("overrides, expected", BROKEN, ids=[" ".join(o) for o, _ in BROKEN])
def test_problem_names_the_keys_and_its_suggested_fix_works(overrides, expected):
    with pytest.raises(ConfigError) as info:
        load(*overrides)
    (message,) = info.value.errors
    assert expected in message
    (problem,) = find_problems(load(*overrides, check=False))
    assert problem.message == message
    assert all(key in message for key in problem.keys[:1])
    assert problem.fix, "every problem here has a one-change fix"
    fix = [f"{key}={show(value)}" for key, value in problem.fix.items()]
    assert all(f in message or show(v) in message for f, v in zip(fix, problem.fix.values())), (fix, message)
    load(*overrides, *fix)  # the suggested value validates


def test_validate_lists_everything_at_once():
    errors = validate(Config())
    assert any("actor_rollout_ref.model.path is empty" in e for e in errors)
    assert any("data.train_files" in e for e in errors)
    assert validate(load()) == []


def test_critic_keys_are_ignored_without_a_critic():
    cfg = load(
        "algorithm.adv_estimator=grpo",
        f"{R}.n=4",
        "critic.ppo_mini_batch_size=7",
        "critic.optim.lr=-1",
        "critic.loss_agg_mode=bogus",
    )
    assert plan_batches(cfg).critic is None


# --------------------------------------------------------------------------- placement (resource_pool)


def test_split_placement_plans_each_role_on_its_own_devices():
    cfg = load(
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=2",
        "resource_pool.actor_rollout_ref=6",
        "resource_pool.critic=2",
        "data.train_batch_size=96",
        f"{R}.n=4",
        f"{A}.ppo_mini_batch_size=24",
    )
    p = plan_batches(cfg)
    assert (p.dp, p.sequences_per_device) == (12, 32)  # 2 nodes x 6 actor devices
    assert p.actor.per_device_mini_batch == 96 // 12 and p.critic.per_device_mini_batch == 96 // 4


@pytest.mark.parametrize(
    "overrides, message, fix",
    [
        (["resource_pool.actor_rollout_ref=3"], "resource_pool.actor_rollout_ref=3 is more than trainer.n_gpus_per_node=2", None),
        (
            ["resource_pool.critic=1"],
            "resource_pool.actor_rollout_ref must say how many of the 2 per node the actor gets",
            {"resource_pool.actor_rollout_ref": 1},
        ),
        (
            ["resource_pool.actor_rollout_ref=2", "resource_pool.critic=1"],
            "more than trainer.n_gpus_per_node=2",
            {"trainer.n_gpus_per_node": 3},
        ),
        (
            ["resource_pool.actor_rollout_ref=1", "resource_pool.critic=1", "algorithm.adv_estimator=grpo", f"{R}.n=2"],
            "no critic is trained",
            {"resource_pool.critic": None},
        ),
        (
            ["warmup.steps=5", "warmup.files=x.jsonl", "warmup.batch_size=5"],
            "must divide by the actor's data-parallel size 2",
            {"warmup.batch_size": 4},
        ),
    ],
)
def test_placement_problems_name_the_keys_and_a_fix(overrides, message, fix):
    cfg = load("trainer.n_gpus_per_node=2", "data.train_batch_size=8", f"{A}.ppo_mini_batch_size=4", *overrides, check=False)
    problems = [p for p in find_problems(cfg) if message in p.message]
    assert problems, [p.message for p in find_problems(cfg)]
    if fix is not None:
        assert problems[0].fix == fix


def test_split_critic_batch_must_divide_over_its_own_devices():
    cfg = load(
        "trainer.n_gpus_per_node=4",
        "resource_pool.actor_rollout_ref=1",
        "resource_pool.critic=3",
        "data.train_batch_size=8",
        f"{A}.ppo_mini_batch_size=4",
        check=False,
    )
    msgs = [p.message for p in find_problems(cfg)]
    assert any("critic" in m and "data-parallel size 3" in m and "resource_pool.critic=3" in m for m in msgs), msgs


# --------------------------------------------------------------------------- token budgets, LoRA, packing


def test_token_budget_below_the_longest_sequence_names_the_key_it_comes_from():
    msgs = validate(load(f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=600", check=False))
    assert msgs == [
        f"{A}.ppo_max_token_len_per_gpu=600 is below the longest possible sequence, data.max_prompt_length "
        f"+ data.max_response_length = 1024 tokens, which must fit one micro-batch; use e.g. "
        f"{A}.ppo_max_token_len_per_gpu=1024"
    ]
    # Log-prob passes inherit the actor's switch and budget; their own values are reported as their own.
    msgs = validate(load(f"{A}.use_dynamic_bsz=true", f"{R}.log_prob_max_token_len_per_gpu=512", check=False))
    assert len(msgs) == 1 and msgs[0].startswith(f"{R}.log_prob_max_token_len_per_gpu=512 is below")
    assert validate(load(f"{A}.ppo_max_token_len_per_gpu=600", check=False)) == []  # dynamic off: unused


def test_dynamic_bsz_inheritance_is_resolved():
    from hybridrl.config.schema import resolve

    cfg = resolve(
        load(f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=4096", "critic.ppo_max_token_len_per_gpu=8192")
    )
    a = cfg.actor_rollout_ref
    assert (a.rollout.log_prob_use_dynamic_bsz, a.rollout.log_prob_max_token_len_per_gpu) == (True, 4096)
    assert (a.ref.log_prob_use_dynamic_bsz, a.ref.log_prob_max_token_len_per_gpu) == (True, 4096)
    assert cfg.critic.forward_max_token_len_per_gpu == 8192


def test_lora_and_packing_keys_are_checked():
    msgs = validate(
        load("actor_rollout_ref.model.lora_rank=-1", "actor_rollout_ref.model.packed_attn_backend=flash", check=False)
    )
    assert any(m.startswith("actor_rollout_ref.model.lora_rank=-1 must be >= 0") for m in msgs)
    assert any(
        m.startswith("actor_rollout_ref.model.packed_attn_backend=flash is not one of auto, varlen, flex, sdpa") for m in msgs
    )
