"""`actor_rollout_ref.rollout.tensor_model_parallel_size`: planned as replicas x tp, explained, and
impossible values named with one that works."""

from hybridrl.config import explain_text, find_problems, load_config, plan_batches

KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
NAME = "actor_rollout_ref.rollout.name"


def load(model_path, *overrides, check=True):
    base = [f"actor_rollout_ref.model.path={model_path}", "data.train_files=data/train.parquet", "data.train_batch_size=16"]
    return load_config(None, [*base, "actor_rollout_ref.actor.ppo_mini_batch_size=8", *overrides], check=check)


def messages(cfg) -> list[str]:
    return [p.message for p in find_problems(cfg) if KEY in p.message]


def test_tp_plans_replicas_and_explain_shows_them(tiny_model_dir):
    cfg = load(tiny_model_dir, "trainer.n_gpus_per_node=4", f"{KEY}=2", f"{NAME}=native")
    layout = plan_batches(cfg).actor.layout
    assert (layout.rollout_replicas, layout.rollout_tp, layout.groups("rollout")) == (2, 2, [0, 0, 1, 1])
    assert layout.dp == 4  # training is still data-parallel over all 4 ranks
    assert "rollout 2 replica(s) x tp 2" in explain_text(cfg)


def test_impossible_tp_is_named_with_a_value_that_works(tiny_model_dir):
    # the tiny model: 4 attention heads, 2 key/value heads, intermediate size 256
    cfg = load(tiny_model_dir, "trainer.n_gpus_per_node=4", f"{KEY}=3", f"{NAME}=native", check=False)
    assert messages(cfg) == [
        f"{KEY}=3 does not divide the actor's 4 rank(s) (trainer.nnodes x n_gpus_per_node): each rollout replica is "
        f"tp consecutive ranks; use e.g. {KEY}=4",
        f"{KEY}: 4 attention heads are not divisible by tensor_model_parallel_size=3; sizes that work for this model: 1, 2, 4",
    ]
    cfg = load(tiny_model_dir, "trainer.n_gpus_per_node=8", f"{KEY}=8", f"{NAME}=native", check=False)
    assert messages(cfg) == [
        f"{KEY}: 4 attention heads are not divisible by tensor_model_parallel_size=8; sizes that work for this model: 1, 2, 4"
    ]


def test_tp_needs_the_native_engine(tiny_model_dir):
    for name, why in (("hf", ""), ("auto", " (auto is hf on CPU)")):
        cfg = load(tiny_model_dir, "trainer.n_gpus_per_node=2", "trainer.device=cpu", f"{KEY}=2", f"{NAME}={name}", check=False)
        (p,) = [p for p in find_problems(cfg) if p.keys[0] == NAME]
        assert p.message == f"{KEY}=2 needs the native engine, not rollout.name={name}{why}; set {NAME}=native, or {KEY}=1"
        assert p.fix == {NAME: "native"}
    cfg = load(tiny_model_dir, "trainer.n_gpus_per_node=2", "trainer.device=cpu", f"{KEY}=2", f"{NAME}=native")
    assert find_problems(cfg) == []
