"""Shared by the CUDA-graph tests (tests/models/test_graphs.py on CPU, tests/gpu/test_graphs_gpu.py):
a tiny tied Qwen2 model and GRPO-shaped rows (groups of n samples of one prompt)."""

import tiny_models
import torch
from transformers import Qwen2ForCausalLM


def tiny_qwen2(vocab: int, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int) -> Qwen2ForCausalLM:
    """tests/tiny_models.py's model at these sizes, 2,048 positions, no padding token (as HF's default)."""
    return tiny_models.tiny_qwen2(
        vocab,
        attn="sdpa",
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        pad_token_id=None,
    )


def grouped_rows(seed: int, groups: int, n: int, P: int, R: int, vocab: int, min_prompt: int = 1):
    """`groups` prompts x `n` samples: ragged prompts (left-padded, >= min_prompt tokens) and
    responses (right-padded); (prompts, prompt_mask, responses, response_mask)."""
    g = torch.Generator().manual_seed(seed)
    b = groups * n
    prompt_lens = torch.randint(min_prompt, P + 1, (groups,), generator=g).repeat_interleave(n)
    prompts = torch.randint(2, vocab, (groups, P), generator=g).repeat_interleave(n, 0)
    responses = torch.randint(2, vocab, (b, R), generator=g)
    response_lens = torch.randint(1, R + 1, (b,), generator=g)
    prompt_mask = (torch.arange(P)[None] >= P - prompt_lens[:, None]).long()
    response_mask = (torch.arange(R)[None] < response_lens[:, None]).long()
    return prompts, prompt_mask, responses, response_mask
