"""`build_rollout`: which engine `rollout.name` builds, the fallback for other architectures, the
multi-turn / TP / partial-rollout rules, and vllm's error."""

import importlib.util

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from hybridrl.config.schema import RolloutConfig
from hybridrl.models.tiny import build_tokenizer
from hybridrl.rollout import build_rollout
from hybridrl.rollout.hf import HFRolloutEngine
from hybridrl.rollout.native import NativeRolloutEngine

TOK = build_tokenizer()


def qwen2():
    config = Qwen2Config(
        vocab_size=len(TOK),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    return Qwen2ForCausalLM(config)


def test_native_builds_the_native_engine_on_the_trainers_weights():
    model = qwen2()
    engine = build_rollout(RolloutConfig(name="native", max_num_seqs=8), model, TOK, max_model_len=32)
    assert isinstance(engine, NativeRolloutEngine)
    assert engine.model.model.layers[0].mlp.up_proj.weight.data_ptr() == model.model.layers[0].mlp.up_proj.weight.data_ptr()
    assert engine.max_model_len == 32 and engine.max_num_seqs == 8 and not engine.use_graphs  # CPU: eager


def test_other_architectures_fall_back_to_hf_with_a_notice(capsys):
    config = GPT2Config(vocab_size=len(TOK), n_embd=32, n_layer=1, n_head=4, n_positions=64)
    config.architectures = ["GPT2LMHeadModel"]
    engine = build_rollout(RolloutConfig(name="native", max_num_seqs=8), GPT2LMHeadModel(config), TOK, max_model_len=2048)
    assert isinstance(engine, HFRolloutEngine)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GPT2LMHeadModel" in err[0] and "using rollout.name=hf" in err[0]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_without_vllm_says_what_to_do():
    with pytest.raises(RuntimeError, match="pip install vllm.*rollout.name=native"):
        build_rollout(RolloutConfig(name="vllm", max_num_seqs=8), qwen2(), TOK, max_model_len=2048)


def test_unknown_name():
    with pytest.raises(ValueError, match="choose one of auto, native, hf, vllm"):
        build_rollout(RolloutConfig(name="sglang", max_num_seqs=8), qwen2(), TOK, max_model_len=2048)


def test_auto_is_hf_on_cpu():
    engine = build_rollout(RolloutConfig(name="auto", max_num_seqs=8), qwen2(), TOK, max_model_len=32)
    assert isinstance(engine, HFRolloutEngine)


def test_engines_agree_on_the_eos_set_from_tokenizer_config_and_generation_config():
    from transformers import GenerationConfig

    from hybridrl.rollout.base import eos_token_ids

    model = qwen2()
    model.config.eos_token_id = 5
    model.generation_config = GenerationConfig(eos_token_id=[5, 7])  # e.g. Qwen2.5-Instruct lists two
    want = sorted({TOK.eos_token_id, 5, 7})
    assert eos_token_ids(model, TOK) == want
    hf = build_rollout(RolloutConfig(name="hf", max_num_seqs=8), model, TOK, max_model_len=2048)
    native = build_rollout(RolloutConfig(name="native", max_num_seqs=8), model, TOK, max_model_len=32)
    assert hf.eos_token_ids == native.eos_token_ids == want


def test_every_engine_says_what_it_runs_on_and_what_it_measured():
    """The RolloutEngine protocol's `model` and `last_metrics`, read by the actor: hf runs on the
    trainer's module itself; native on its own decoder (sharing the trainer's tensors here)."""
    from hybridrl.data import keys as K
    from hybridrl.data.batch import Batch
    from hybridrl.rollout import SamplingParams

    torch.manual_seed(0)
    model = qwen2()
    hf = build_rollout(RolloutConfig(name="hf", max_num_seqs=8), model, TOK, max_model_len=2048)
    native = build_rollout(RolloutConfig(name="native", max_num_seqs=8), model, TOK, max_model_len=32)
    assert hf.model is model and native.model is not model and hf.last_metrics == {} and native.last_metrics == {}
    prompts = Batch({K.PROMPTS: torch.tensor([[5, 6, 7], [0, 8, 9]]), K.PROMPT_MASK: torch.tensor([[1, 1, 1], [0, 1, 1]])})
    out = native.generate(prompts, SamplingParams(n=2, max_new_tokens=3))
    m = native.last_metrics
    assert m["rollout/decode_steps"] == 2  # the first token comes from the prefill, then 2 decode steps
    assert m["perf/rollout_tokens_per_s"] > 0 and 0 < m["rollout/kv_cache_usage"] <= 1
    assert out[K.RESPONSES].shape == (4, 3)  # 2 prompts x n=2, the samples of a prompt adjacent


def test_multi_turn_runs_the_agent_loop_on_the_native_engine_even_on_cpu(tmp_path):
    """One rule for every caller: multi_turn.enable resolves `auto` to native (not hf on CPU) and
    wraps the engine in AgentRollout."""
    from hybridrl.config.schema import MultiTurnConfig
    from hybridrl.rollout.agent.rollout import AgentRollout

    multi_turn = MultiTurnConfig(enable=True, format="hermes")
    engine = build_rollout(RolloutConfig(max_num_seqs=8, multi_turn=multi_turn), qwen2(), TOK, max_model_len=32)
    assert isinstance(engine, AgentRollout) and isinstance(engine.engine, NativeRolloutEngine)
    engine.close()


@pytest.mark.parametrize("name, multi_turn", [("hf", False), ("auto", False), ("native", True)])
def test_partial_rollouts_need_the_native_engine_single_turn(name, multi_turn):
    from hybridrl.config.schema import MultiTurnConfig

    r = RolloutConfig(name=name, max_num_seqs=8, multi_turn=MultiTurnConfig(enable=multi_turn))
    with pytest.raises(ValueError, match="partial_rollout needs the native engine, single-turn.*rollout.name=native"):
        build_rollout(r, qwen2(), TOK, max_model_len=32, partial_rollout=True)
    engine = build_rollout(RolloutConfig(name="native", max_num_seqs=8), qwen2(), TOK, max_model_len=32, partial_rollout=True)
    assert isinstance(engine, NativeRolloutEngine)


def test_the_tp_rule_is_written_once():
    """`tp_problem` (what build_rollout raises, and what the config check can reuse) and the keys
    that run at TP=1 only, read from the same place."""
    from hybridrl.config.checks.rollout import pick_engine, tp1_only_ignored, tp_problem

    assert tp_problem("native", 4) is None and tp_problem("hf", 1) is None
    assert "needs the native engine, not rollout.name=auto (auto is hf on CPU)" in tp_problem("hf", 2, "auto")
    assert pick_engine("auto", cuda=False) == "hf" and pick_engine("auto", cuda=True) == "native"
    assert pick_engine("auto", cuda=False, multi_turn=True) == "native" and pick_engine("hf", cuda=True) == "hf"
    r = RolloutConfig(name="native", enable_prefix_caching=True, enable_chunked_prefill=True)
    assert tp1_only_ignored(r) == []
    r.tensor_model_parallel_size = 2
    assert tp1_only_ignored(r) == ["enable_prefix_caching", "enable_chunked_prefill"]


def test_an_engine_refuses_a_hook_it_cannot_run():
    """Hooks replace capability probes: the hf engine takes `on_finish` (and never calls it: the
    batch ends together) and raises on a weight swap or an agent instead of dropping them."""
    from hybridrl.data import keys as K
    from hybridrl.data.batch import Batch
    from hybridrl.rollout import Hooks, SamplingParams

    hf = build_rollout(RolloutConfig(name="hf", max_num_seqs=8), qwen2(), TOK, max_model_len=32)
    prompts = Batch({K.PROMPTS: torch.tensor([[5, 6, 7]]), K.PROMPT_MASK: torch.tensor([[1, 1, 1]])})
    reported = []
    out = hf.generate(prompts, SamplingParams(max_new_tokens=3), Hooks(on_finish=reported.append))
    assert reported == [] and out[K.RESPONSES].shape[0] == 1
    for hook in ("weight_swap", "agent"):
        with pytest.raises(ValueError, match=f"hooks.{hook}=.*needs the native engine, not rollout.name=hf"):
            hf.generate(prompts, SamplingParams(max_new_tokens=3), Hooks(**{hook: object()}))


def test_factory_rules_import_without_torch():
    """The config checks call the rules; they must not pull torch in."""
    import subprocess
    import sys

    code = "import sys, hybridrl.rollout.factory as f; f.tp_problem('hf', 2); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
