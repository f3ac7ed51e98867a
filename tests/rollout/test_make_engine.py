"""Which engine `rollout.name` builds, the fallback for other architectures, and vllm's error."""

import importlib.util

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from hybridrl.config.schema import RolloutConfig
from hybridrl.models.tiny import build_tokenizer
from hybridrl.rollout import make_rollout_engine
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
    engine = make_rollout_engine("native", model, TOK, max_num_seqs=8, rollout=RolloutConfig(name="native"), max_model_len=32)
    assert isinstance(engine, NativeRolloutEngine)
    assert engine.model.model.layers[0].mlp.up_proj.weight.data_ptr() == model.model.layers[0].mlp.up_proj.weight.data_ptr()
    assert engine.max_model_len == 32 and engine.max_num_seqs == 8 and not engine.use_graphs  # CPU: eager


def test_other_architectures_fall_back_to_hf_with_a_notice(capsys):
    config = GPT2Config(vocab_size=len(TOK), n_embd=32, n_layer=1, n_head=4, n_positions=64)
    config.architectures = ["GPT2LMHeadModel"]
    engine = make_rollout_engine("native", GPT2LMHeadModel(config), TOK, max_num_seqs=8, rollout=RolloutConfig(name="native"))
    assert isinstance(engine, HFRolloutEngine)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GPT2LMHeadModel" in err[0] and "using rollout.name=hf" in err[0]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_without_vllm_says_what_to_do():
    with pytest.raises(RuntimeError, match="pip install vllm.*rollout.name=native"):
        make_rollout_engine("vllm", qwen2(), TOK, max_num_seqs=8, rollout=RolloutConfig(name="vllm"))


def test_unknown_name():
    with pytest.raises(ValueError, match="choose one of auto, native, hf, vllm"):
        make_rollout_engine("sglang", qwen2(), TOK, max_num_seqs=8)


def test_auto_is_hf_on_cpu():
    engine = make_rollout_engine("auto", qwen2(), TOK, max_num_seqs=8, rollout=RolloutConfig(), max_model_len=32)
    assert isinstance(engine, HFRolloutEngine)


def test_engines_agree_on_the_eos_set_from_tokenizer_config_and_generation_config():
    from transformers import GenerationConfig

    from hybridrl.rollout.base import eos_token_ids

    model = qwen2()
    model.config.eos_token_id = 5
    model.generation_config = GenerationConfig(eos_token_id=[5, 7])  # e.g. Qwen2.5-Instruct lists two
    want = sorted({TOK.eos_token_id, 5, 7})
    assert eos_token_ids(model, TOK) == want
    hf = make_rollout_engine("hf", model, TOK, max_num_seqs=8)
    native = make_rollout_engine("native", model, TOK, max_num_seqs=8, rollout=RolloutConfig(name="native"), max_model_len=32)
    assert hf.eos_token_ids == native.eos_token_ids == want


def test_every_engine_says_what_it_runs_on_and_what_it_measured():
    """The RolloutEngine protocol's `model` and `last_metrics`, read by the actor: hf runs on the
    trainer's module itself; native on its own decoder (sharing the trainer's tensors here)."""
    from hybridrl.data import keys as K
    from hybridrl.data.batch import Batch
    from hybridrl.rollout import SamplingParams

    torch.manual_seed(0)
    model = qwen2()
    hf = make_rollout_engine("hf", model, TOK, max_num_seqs=8, rollout=RolloutConfig(name="hf"))
    native = make_rollout_engine("native", model, TOK, max_num_seqs=8, rollout=RolloutConfig(name="native"), max_model_len=32)
    assert hf.model is model and native.model is not model and hf.last_metrics == {} and native.last_metrics == {}
    prompts = Batch({K.PROMPTS: torch.tensor([[5, 6, 7], [0, 8, 9]]), K.PROMPT_MASK: torch.tensor([[1, 1, 1], [0, 1, 1]])})
    out = native.generate(prompts, SamplingParams(n=2, max_new_tokens=3))
    m = native.last_metrics
    assert m["rollout/decode_steps"] == 2  # the first token comes from the prefill, then 2 decode steps
    assert m["perf/rollout_tokens_per_s"] > 0 and 0 < m["rollout/kv_cache_usage"] <= 1
    assert out[K.RESPONSES].shape == (4, 3)  # 2 prompts x n=2, the samples of a prompt adjacent
