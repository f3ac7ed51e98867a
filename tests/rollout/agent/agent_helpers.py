"""Shared pieces of the agent-loop tests: a byte-level chat tokenizer with a ChatML template
(Qwen's tool-message rendering), a tiny Qwen2 model over it, and a scripted policy.

The scripted policy wraps a real native engine's sampler: per output sequence (keyed by its
seed) it holds a plan of turns; a planned token is forced (its logit kept, all others -inf), a
`None` entry is sampled freely from the model. Everything else — the paged cache, the pauses,
the appended tool tokens, the masks — is the engine's and the agent loop's own code. Every
token the sampler emits is recorded, so tests can compare the trained tokens with them.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from hybridrl.data.dataset import PromptRecord, collate_prompts
from hybridrl.rollout.native.engine import NativeRolloutEngine

CHATML = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    specials = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "additional_special_tokens": ["<|im_start|>"]}
    fast.add_special_tokens(specials)
    fast.chat_template = CHATML
    return fast


TOK = chat_tokenizer()
DECODE_STEPS = 1  # decode steps per launch of the engines these tests build (test_agent_loop.py runs 1 and 5)
EOS = TOK.eos_token_id


def tiny_model(seed: int = 0):
    config = Qwen2Config(
        vocab_size=len(TOK),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=EOS,
        pad_token_id=TOK.pad_token_id,
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # unit-scale weights: varied samples rather than a repeated token
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 1.0 if "embed" in name else p.shape[1] ** -0.5)
    return model


def chat_prompts(questions, extra=None):
    recs = []
    for i, q in enumerate(questions):
        text = TOK.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        ids = TOK(text, add_special_tokens=False)["input_ids"]
        recs.append(PromptRecord(ids, text, "test", str(i), dict(extra[i]) if extra else {}))
    return collate_prompts(recs, TOK.pad_token_id, [f"u{i}" for i in range(len(recs))])


def engine_for(model, **kw):
    kw.setdefault("max_model_len", 1024)
    kw.setdefault("block_size", 4)
    kw.setdefault("decode_steps_per_sync", DECODE_STEPS)
    return NativeRolloutEngine.from_hf_model(model, TOK, **kw)


def turn(text: str | None = None, free: int = 0, eos: bool = True) -> list[int | None]:
    """A planned model turn: `free` freely sampled tokens, then `text`'s tokens, then EOS."""
    ids = [None] * free + (TOK.encode(text, add_special_tokens=False) if text else [])
    return ids + ([EOS] if eos else [])


class ScriptedPolicy:
    """Force planned tokens through a native engine's sampler (see the module docstring).
    `plans`: seed -> list of turns (lists of token ids or None); after its plan a sequence gets EOS."""

    def __init__(self, engine: NativeRolloutEngine, plans: dict[int, list[list[int | None]]]):
        self.plans = {s: [list(t) for t in turns] for s, turns in plans.items()}
        self.current: dict[int, list[int | None]] = {}
        self.sampled: dict[int, list[int]] = defaultdict(list)  # every token the sampler emitted, per seed
        self.extend_calls = 0
        runner = engine.runner
        self.rows = None
        prefill, extend, decode, sample = runner.prefill, runner.extend, runner.decode, runner._sample_into

        def next_turn(seeds):
            for s in seeds:
                turns = self.plans.get(int(s), [])
                self.current[int(s)] = turns.pop(0) if turns else [EOS]

        def wrapped_prefill(prompts, blocks, samples, copies, seeds, mode, **kw):
            next_turn(seeds)
            self.rows = len(seeds)
            return prefill(prompts, blocks, samples, copies, seeds, mode, **kw)

        def wrapped_extend(tokens, starts, tables, seeds, mode, *rest, **kw):
            if kw.get("sample") is False:  # a chunk of a long prompt: nothing is sampled
                return extend(tokens, starts, tables, seeds, mode, *rest, **kw)
            self.extend_calls += 1
            next_turn(seeds)  # a turn starts: after tool tokens, or a prompt's rest after a prefix-cache hit
            self.rows = len(seeds)
            return extend(tokens, starts, tables, seeds, mode, *rest, **kw)

        def wrapped_decode(B, mode):
            self.rows = B
            return decode(B, mode)

        def wrapped_sample(logits, seeds, positions, mode, tok_out, lp_out, pos_offset=0):
            rows = self.rows
            for j in range(rows):
                plan = self.current.get(int(seeds[j]), [EOS])
                forced = plan.pop(0) if plan else EOS
                if forced is not None:
                    keep = logits[j, forced].clone()
                    logits[j] = float("-inf")
                    logits[j, forced] = keep
            sample(logits, seeds, positions, mode, tok_out, lp_out, pos_offset)
            for j in range(rows):
                self.sampled[int(seeds[j])].append(int(tok_out[j]))

        runner.prefill, runner.extend, runner.decode, runner._sample_into = (
            wrapped_prefill,
            wrapped_extend,
            wrapped_decode,
            wrapped_sample,
        )
