"""The native engine on CPU against HF `generate` and the trainer's log-probs (tiny models, float32)."""

import time

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig

from hybridrl.data import keys as K
from hybridrl.data.dataset import PromptRecord, collate_prompts
from hybridrl.models.logprobs import log_probs_from_logits, response_logits
from hybridrl.models.tiny import build_tokenizer
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.base import NO_HOOKS, Hooks
from hybridrl.rollout.hf import HFRolloutEngine
from hybridrl.rollout.native.cache import CacheFullError
from hybridrl.rollout.native.engine import Generation, NativeRolloutEngine

TOK = build_tokenizer()
PADDED_VOCAB = 64  # len(TOK) = 49 real ids, 15 padding rows; at TP=2 rank 1's block [32, 64) holds both
SHAPE = dict(
    vocab_size=len(TOK),
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=1,
)
MOE = dict(SHAPE, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SHAPE, rope_theta=500000.0, tie_word_embeddings=False),
    "qwen2": lambda: Qwen2Config(**SHAPE, tie_word_embeddings=False),
    # Tied tiny models mostly repeat their last token (its own embedding dominates the logits),
    # so the other tests use untied ones; this one checks the tied head.
    "qwen2-tied": lambda: Qwen2Config(**SHAPE, tie_word_embeddings=True),
    "qwen3": lambda: Qwen3Config(**SHAPE, head_dim=16, tie_word_embeddings=False),
    # biases everywhere: o_proj/down_proj biases are added once after a TP all-reduce (test_native_tp.py)
    "llama-bias": lambda: LlamaConfig(**SHAPE, attention_bias=True, mlp_bias=True, tie_word_embeddings=False),
    # an embedding with rows past the tokenizer (as Qwen2.5's 151,936 for 151,665 tokens): the
    # engines must never draw them (hf_model makes them win almost every draw if they could)
    "qwen2-padded": lambda: Qwen2Config(**{**SHAPE, "vocab_size": PADDED_VOCAB}, tie_word_embeddings=False),
    # mixtures of experts (models/moe_decoder.py): 8 experts, 2 a token; Qwen2-MoE with a shared expert
    "qwen3_moe": lambda: Qwen3MoeConfig(**MOE, head_dim=16, tie_word_embeddings=False),
    "qwen2_moe": lambda: Qwen2MoeConfig(**MOE, shared_expert_intermediate_size=48, tie_word_embeddings=False),
}
TEXTS = ["1+2=", "13+41=", "7*8=", "(2+3)*4=", "99-1="]


def hf_model(family="qwen2", seed=0):
    config = CONFIGS[family]()
    config.architectures = [type(config).__name__.replace("Config", "ForCausalLM")]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # unit-scale weights: the default init (std 0.02) repeats the last token forever
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # matrices and each expert's: N(0, 1 / fan_in)
                p.normal_(0, 1.0 if "embed" in name else p.shape[-1] ** -0.5)
            elif name.endswith(".bias") and family == "llama-bias":  # HF initializes biases to zero
                p.normal_(0, 0.5)
        if family == "qwen2-padded":  # padding logits of std ~5.7 against ~1: one of 15 beats every real id
            model.lm_head.weight[len(TOK) :].normal_(0, 1.0)
    return model


def prompts(texts=TEXTS):
    recs = [PromptRecord(TOK(t, add_special_tokens=False)["input_ids"], t, "arith", "0", {}) for t in texts]
    return collate_prompts(recs, TOK.pad_token_id, [f"u{i}" for i in range(len(texts))])


def engine_for(model, **kw):
    kw.setdefault("max_model_len", 64)
    kw.setdefault("block_size", 4)
    return NativeRolloutEngine.from_hf_model(model, TOK, **kw)


def run_generation(engine, batch, sampling, hooks=NO_HOOKS):
    """`engine.generate`, step by step, keeping the call's `Generation` (its run record) to look at."""
    run = Generation(engine, batch, sampling, hooks, None)
    while run.step():
        pass
    out, engine.last_metrics = run.result()
    return out, run


GREEDY = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=12)


def trainer_log_probs(model, out, temperature):
    with torch.no_grad():
        logits = response_logits(model, out[K.PROMPTS], out[K.PROMPT_MASK], out[K.RESPONSES], out[K.RESPONSE_MASK], temperature)
    return log_probs_from_logits(logits, out[K.RESPONSES]) * out[K.RESPONSE_MASK]


@pytest.mark.parametrize("family", list(CONFIGS))
def test_greedy_equals_hf_generate(family):
    model = hf_model(family)
    want = HFRolloutEngine(model, TOK).generate(prompts(), GREEDY)
    got = engine_for(model).generate(prompts(), GREEDY)
    assert torch.equal(got[K.RESPONSES], want[K.RESPONSES])
    assert torch.equal(got[K.RESPONSE_MASK], want[K.RESPONSE_MASK])
    assert list(got[K.RESPONSE_TEXT]) == list(want[K.RESPONSE_TEXT])
    assert got[K.RESPONSE_MASK].sum() > 2 * len(TEXTS)  # not all EOS at once: the paths are real
    if family != "qwen2-tied":
        assert len({tuple(r.tolist()) for r in got[K.RESPONSES][:, :6]}) > 2  # the prompts matter
    torch.testing.assert_close(got[K.ROLLOUT_LOG_PROBS], want[K.ROLLOUT_LOG_PROBS], atol=1e-5, rtol=0)


def test_continuous_batching_with_a_small_cache_matches_one_at_a_time():
    """6 usable blocks of 4 tokens, 3 rows: prompts wait for blocks and rows, finished sequences
    leave mid-batch; every sequence still gets exactly the tokens it gets alone."""
    model = hf_model("qwen2", seed=3)
    texts = ["1+2=", "13+41+7=", "7=", "(2+3)*4-11=", "9-1=", "123456789+1="]
    free_run = engine_for(model, ignore_eos=True).generate(prompts(texts), GREEDY)[K.RESPONSES]

    # Random weights rarely emit the real EOS: stop on the token whose first occurrence varies
    # most across the sequences, so that they end at different steps.
    def spread(v):
        return len({row.tolist().index(v) if v in row.tolist() else -1 for row in free_run})

    eos = max(range(len(TOK)), key=spread)
    alone = []
    for t in texts:
        eng = engine_for(model)
        eng.eos_token_ids = [eos]
        out = eng.generate(prompts([t]), GREEDY)
        alone.append(out[K.RESPONSES][0, : int(out[K.RESPONSE_MASK].sum())].tolist())
    eng = engine_for(model, num_blocks=7, max_num_seqs=3, max_num_batched_tokens=16)
    eng.eos_token_ids = [eos]
    out, run = run_generation(eng, prompts(texts), GREEDY)
    got = [r[: int(m.sum())].tolist() for r, m in zip(out[K.RESPONSES], out[K.RESPONSE_MASK])]
    assert got == alone
    lengths = [len(x) for x in got]
    assert len(set(lengths)) > 2  # mixed lengths: rows leave and join mid-batch
    assert eng.last_metrics["rollout/decode_steps"] > max(lengths)  # they could not all run at once
    assert eng.last_metrics["rollout/kv_cache_usage"] > 0.5
    assert eng.cache.allocator.num_free == eng.cache.allocator.usable  # every block came back
    # the texts of rows that ended in a decode step were detokenized in the decode loop (a row that
    # ended on its first, prefilled token is left to the end): the same strings
    assert [t is not None for t in run.record.texts] == [n > 1 for n in lengths]
    assert list(out[K.RESPONSE_TEXT]) == TOK.batch_decode(
        [r[: int(m.sum())] for r, m in zip(out[K.RESPONSES], out[K.RESPONSE_MASK])], skip_special_tokens=True
    )
    # a caller that streams the ended rows decodes them itself: the engine detokenizes at the end
    reported = []
    again, run = run_generation(eng, prompts(texts), GREEDY, Hooks(on_finish=lambda rows, toks: reported.extend(rows.tolist())))
    assert sorted(reported) == list(range(len(texts))) and all(t is None for t in run.record.texts)
    assert list(again[K.RESPONSE_TEXT]) == list(out[K.RESPONSE_TEXT])


def test_samples_share_the_prompt_blocks():
    """n samples fork from one prefill (shared full blocks + a copied partial block): each equals
    generating that sample alone with its seed."""
    model = hf_model("qwen3", seed=1)
    s = SamplingParams(n=3, temperature=1.0, max_new_tokens=10)
    eng = engine_for(model)
    p = prompts(["13+41+7+8=", "2="])  # 10 tokens = 2 full blocks + a partial one; 2 tokens = partial only
    out = eng.generate(p, s, seeds=[11, 12, 13, 21, 22, 23])
    for row, seed in enumerate([11, 12, 13, 21, 22, 23]):
        one = eng.generate(
            prompts([["13+41+7+8=", "2="][row // 3]]), SamplingParams(n=1, temperature=1.0, max_new_tokens=10), seeds=[seed]
        )
        n = int(one[K.RESPONSE_MASK].sum())
        assert out[K.RESPONSES][row, :n].tolist() == one[K.RESPONSES][0, :n].tolist()
    assert list(out[K.UID]) == ["u0"] * 3 + ["u1"] * 3


def test_seeds_reproduce_differ_and_ignore_the_rest_of_the_batch():
    model = hf_model("llama", seed=2)
    eng = engine_for(model)
    s = SamplingParams(n=1, temperature=1.0, max_new_tokens=12)
    a = eng.generate(prompts(["1+2="]), s, seeds=[5])[K.RESPONSES][0]
    b = eng.generate(prompts(["99-1=", "1+2="]), s, seeds=[77, 5])[K.RESPONSES][1]
    assert a.tolist() == b[: len(a)].tolist()
    others = {tuple(eng.generate(prompts(["1+2="]), s, seeds=[k])[K.RESPONSES][0].tolist()) for k in range(6)}
    assert len(others) > 1
    torch.manual_seed(3)
    c = eng.generate(prompts(), s)[K.RESPONSES]
    torch.manual_seed(3)
    assert torch.equal(c, eng.generate(prompts(), s)[K.RESPONSES])


@pytest.mark.parametrize("top_k, top_p", [(-1, 1.0), (5, 0.9)])
def test_sampled_log_probs_equal_the_trainers(top_k, top_p):
    """float32 on CPU: the engine's log-probs of its sampled tokens equal the trainer's
    (response_logits on the HF model at the same temperature) within 1e-5."""
    model = hf_model("qwen2", seed=4)
    s = SamplingParams(n=4, temperature=0.7, top_k=top_k, top_p=top_p, max_new_tokens=10)
    torch.manual_seed(0)
    out = engine_for(model).generate(prompts(), s)
    want = trainer_log_probs(model, out, 0.7)
    torch.testing.assert_close(out[K.ROLLOUT_LOG_PROBS], want, atol=1e-5, rtol=0)
    assert (out[K.ROLLOUT_LOG_PROBS] < 0).any()


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_ids_past_the_tokenizer_are_never_drawn(engine):
    """A model whose embedding has 15 rows past the tokenizer's 49 ids, weighted so that a padding
    row has the largest logit at almost every position: the engine -> runner -> sampler wiring of
    the tokenizer's length (the HF engine's logits processor) keeps every draw below 49, greedy,
    sampled and top-k/top-p, and the log-probs keep the trainer's full-vocabulary normalizer."""
    model = hf_model("qwen2-padded", seed=9)
    with torch.no_grad():  # without the limit the padding rows would win: the test has something to catch
        first = model(prompts()[K.PROMPTS]).logits[:, -1].argmax(-1)
    assert (first >= len(TOK)).all()
    make = (lambda: engine_for(model)) if engine == "native" else (lambda: HFRolloutEngine(model, TOK))
    top = SamplingParams(n=2, temperature=1.0, top_k=20, top_p=0.99, max_new_tokens=10)
    for sampling in (GREEDY, SamplingParams(n=4, temperature=0.7, max_new_tokens=10), top):
        torch.manual_seed(0)
        out = make().generate(prompts(), sampling)
        mask = out[K.RESPONSE_MASK].bool()
        assert mask.sum() > 2 * len(TEXTS)
        assert int(out[K.RESPONSES][mask].max()) < len(TOK), sampling
        want = trainer_log_probs(model, out, sampling.temperature or 1.0)
        torch.testing.assert_close(out[K.ROLLOUT_LOG_PROBS], want, atol=1e-4, rtol=0)


def test_load_weights_follows_the_trainer():
    model = hf_model("qwen2", seed=5)
    eng = engine_for(model, share_weights=False)  # copies, as on a GPU with fp32 trainer weights
    before = eng.generate(prompts(), GREEDY)[K.RESPONSES]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    assert torch.equal(eng.generate(prompts(), GREEDY)[K.RESPONSES], before)  # not synced yet
    eng.load_weights(model.named_parameters())
    want = HFRolloutEngine(model, TOK).generate(prompts(), GREEDY)[K.RESPONSES]
    got = eng.generate(prompts(), GREEDY)[K.RESPONSES]
    assert torch.equal(got, want) and not torch.equal(got, before)


def test_shared_weights_see_in_place_updates_without_a_copy():
    model = hf_model("qwen2", seed=6)
    eng = engine_for(model)  # CPU, float32 = the trainer's dtype: aliased
    emb = eng.model.model.embed_tokens.weight
    assert emb.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    want = HFRolloutEngine(model, TOK).generate(prompts(), GREEDY)[K.RESPONSES]
    assert torch.equal(eng.generate(prompts(), GREEDY)[K.RESPONSES], want)


def test_sleep_frees_the_cache_and_wake_restores_it():
    model = hf_model("qwen2", seed=7)
    eng = engine_for(model)
    first = eng.generate(prompts(), GREEDY)[K.RESPONSES]
    eng.sleep()
    assert eng.cache is None
    eng.wake()
    assert eng.cache is not None and eng.cache.usage == 0.0
    assert torch.equal(eng.generate(prompts(), GREEDY)[K.RESPONSES], first)


def test_decode_graphs_are_dropped_when_the_cache_changes_size(monkeypatch):
    """Graphs bake the cache's layout in (layer l's K/V start l x num_blocks blocks in): a cache of
    another size at the same address (free memory changed between steps) must not reuse them."""
    from hybridrl.rollout.native import runner as runner_module

    eng = engine_for(hf_model("qwen2", seed=8), num_blocks=40)
    r = eng.runner
    monkeypatch.setattr(runner_module, "cache_key", lambda cache: (0, tuple(cache.data.shape)))  # the address repeats
    eng.sleep()
    eng.wake()
    r.graphs["captured"] = object()
    eng.sleep()
    eng.wake()
    assert "captured" in r.graphs  # same address, same size: kept
    eng.sleep()
    r.budget.fixed_num_blocks = 30
    eng.wake()
    assert r.graphs == {} and eng.cache.data.shape[2] == 30


def test_bad_inputs_fail_clearly():
    model = hf_model("qwen2")
    eng = engine_for(model, max_num_seqs=2)
    with pytest.raises(ValueError, match="max_num_seqs"):
        eng.generate(prompts(), SamplingParams(n=3, max_new_tokens=4))
    with pytest.raises(ValueError, match="max_model_len"):
        eng.generate(prompts(), SamplingParams(n=1, max_new_tokens=100))
    with pytest.raises(CacheFullError, match="gpu_memory_utilization"):
        engine_for(model, num_blocks=3).generate(prompts(), GREEDY)
    with pytest.raises(ValueError, match="LoRA"):
        eng.load_weights([("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", torch.zeros(1))])
    with pytest.raises(KeyError, match="no parameter"):
        eng.load_weights([("v_head.weight", torch.zeros(1))])


def test_the_scheduler_owns_its_queues_and_blocks():
    """schedule -> start_group -> run -> grow -> postprocess -> keep_rows, by hand: block size 4,
    a 6-token prompt with n=2 (one shared full block, a partial block copied per sample)."""
    from hybridrl.rollout.native.cache import BlockAllocator
    from hybridrl.rollout.native.scheduler import Group, Scheduler

    alloc = BlockAllocator(12)  # 11 usable
    sched = Scheduler(alloc, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    groups = [Group(list(range(6)), [0, 1], [10, 11]), Group(list(range(9)), [2, 3], [12, 13])]
    for g in groups:
        sched.add(g)
    # worst case with 4 new tokens: 1 shared block + 2 x (ceil((6 + 3) / 4) - 1) = 5; 2 + 2 x (3 - 2) = 4
    assert [sched.group_need(g, 4) for g in groups] == [5, 4]
    assert sched.schedule(4) == groups and not sched.waiting
    assert sched.schedule(4) == []
    seqs, copies = sched.start_group(groups[0], 4)
    assert [s.blocks for s in seqs] == [[1, 2], [1, 3]] and copies == [(2, 3)] and alloc.refcount[1] == 2
    assert sched.run(seqs) == 0 and sched.run([]) == 2 and len(sched.running) == 2
    assert sched.grow(seqs[0]) == 4 and seqs[0].blocks == [1, 2, 4]
    sched.postprocess([seqs[1]], [3])
    assert seqs[1].generated == 3 and seqs[1].blocks == [] and alloc.refcount[1] == 1 and alloc.refcount[3] == 0
    sched.keep_rows([0])
    assert sched.running == [seqs[0]] and not sched.idle
    sched.postprocess([seqs[0]], [4])
    sched.keep_rows([])
    assert sched.idle and alloc.num_free == 11 and sched.committed == 0


def assert_same_samples(a, b):
    """The same tokens and masks; log-probs equal to float precision (another attention path)."""
    assert torch.equal(a[K.RESPONSES], b[K.RESPONSES])
    assert torch.equal(a[K.RESPONSE_MASK], b[K.RESPONSE_MASK])
    torch.testing.assert_close(a[K.ROLLOUT_LOG_PROBS], b[K.ROLLOUT_LOG_PROBS], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("max_num_seqs", [64, 5])
def test_prefix_caching_gives_the_same_samples_and_skips_the_shared_prefix(max_num_seqs):
    """Prompts with a shared system-prompt-like prefix: with prefix caching, later prompts share
    its full KV blocks and compute only the rest, and the samples are those of a full prefill (same
    tokens, log-probs to float precision). Some prompts are the prefix itself (the last block is
    recomputed: its last token's logits are needed) or diverge inside a block. max_num_seqs=5
    admits the groups in waves: hits on blocks of groups still running, and blocks forgotten when
    their last sequence ends; every block goes back to the allocator."""
    shared = "(12+34)*56-78=(9*8)+"  # 20 characters: 5 full blocks of 4
    texts = [shared + "1=", shared + "22*3=", shared, shared[:18] + "7-7=", "5+5=", shared + "(4+4)*(2+2)="]
    sampling = SamplingParams(n=3, temperature=1.0, max_new_tokens=10)
    model = hf_model()
    outs, engines = [], []
    for caching in (False, True):
        engine = engine_for(model, max_num_seqs=max_num_seqs, prefix_caching=caching)
        outs.append(engine.generate(prompts(texts), sampling, seeds=list(range(3 * len(texts)))))
        engines.append(engine)
        assert engine.cache.allocator.num_free == engine.cache.allocator.usable
    assert_same_samples(*outs)
    assert "rollout/prefix_cache_hit_rate" not in engines[0].last_metrics
    rate = engines[1].last_metrics["rollout/prefix_cache_hit_rate"]
    total = sum(len(t) for t in texts)
    # at most: every prompt after the first reuses the shared blocks it starts with
    best = (0 + 20 + 16 + 16 + 0 + 20) / total  # the prefix itself recomputes its last block; one diverges in block 5
    assert 0 < rate <= best + 1e-9, (rate, best)
    if max_num_seqs == 64:  # one wave: every later prompt hits all its shared full blocks
        assert rate == pytest.approx(best)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_chunked_prefill_gives_the_same_samples_and_lets_others_decode(prefix_caching):
    """Prompts longer than max_num_batched_tokens (8) are prefilled 8 tokens at a time, one chunk
    between decode steps: the samples are those of a whole-prompt prefill, and sequences already
    running decode between the chunks. With prefix caching, a short prompt admitted while a long one
    is still being prefilled must not read its blocks before they are written."""
    long_a, long_b = "(12+34)*56-78=(9*8)+1=", "(12+34)*56-78=(9*8)+(4+4)*(2+2)="  # 22 and 32 characters
    texts = ["1+2=", long_a, "7*8=", long_a[:-2] + "5=", long_b, "99-1="]
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=10)
    model = hf_model()
    outs, calls = [], []
    for chunked in (False, True):
        engine = engine_for(model, max_num_batched_tokens=8, chunked_prefill=chunked, prefix_caching=prefix_caching)
        log = []
        extend, decode = engine.runner.extend, engine.runner.decode
        engine.runner.extend = lambda *a, **k: log.append("chunk" if k.get("sample") is False else "extend") or extend(*a, **k)
        engine.runner.decode = lambda *a, **k: log.append("decode") or decode(*a, **k)
        outs.append(engine.generate(prompts(texts), sampling, seeds=list(range(2 * len(texts)))))
        calls.append(log)
        assert engine.cache.allocator.num_free == engine.cache.allocator.usable
    assert_same_samples(*outs)
    assert "chunk" not in calls[0]
    log = calls[1]
    assert log.count("chunk") >= 2  # 22 tokens: 2 chunks and a last one that samples; 32: 3 and 1 (fewer with hits)
    first, last = log.index("chunk"), len(log) - 1 - log[::-1].index("chunk")
    assert "decode" in log[first:last]  # the short prompts decoded while the long ones were prefilled
    # every chunk pass, the sampling last ones included (which are the only other extends without prefix hits)
    chunks = engine.last_metrics["rollout/prefill_chunks"]
    assert chunks == log.count("chunk") + log.count("extend") if not prefix_caching else chunks > log.count("chunk")


def test_max_launch_gap_covers_a_prefill_chunk_between_decode_steps():
    """rollout/max_launch_gap_ms: the longest wait between two decode launches. A chunk of a long
    prompt's prefill runs between them; made to take 0.25 s, the gap is at least that."""
    texts = ["1+2=", "(12+34)*56-78=(9*8)+1=", "7*8="]
    engine = engine_for(hf_model(), max_num_batched_tokens=8, chunked_prefill=True)
    extend, chunks = engine.runner.extend, []

    def slow_chunk(*a, **k):
        if k.get("sample") is False:
            time.sleep(0.25)
            chunks.append(k)
        return extend(*a, **k)

    engine.runner.extend = slow_chunk
    engine.generate(prompts(texts), SamplingParams(n=2, temperature=1.0, max_new_tokens=10), seeds=list(range(6)))
    assert chunks  # the long prompt was prefilled in chunks, between decode steps of the short ones
    assert engine.last_metrics["rollout/max_launch_gap_ms"] >= 250
    engine.runner.extend = extend
    engine.generate(prompts(texts[::2]), SamplingParams(n=2, temperature=1.0, max_new_tokens=10), seeds=list(range(4)))
    assert 0 < engine.last_metrics["rollout/max_launch_gap_ms"] < 250  # short prompts only: no pass between steps


def test_on_finish_reports_each_sequence_once_as_it_ends():
    """generate(on_finish=...) hands every output row to the caller exactly once, with the tokens
    it ends up with in RESPONSES, from inside the decode loop: shorter responses are reported in
    earlier calls than longer ones (what lets hybridrl/rewards/stream.py score during decoding)."""
    model = hf_model("qwen2", seed=3)
    texts = ["1+2=", "13+41+7=", "7=", "(2+3)*4-11=", "9-1=", "123456789+1="]
    free_run = engine_for(model, ignore_eos=True).generate(prompts(texts), GREEDY)[K.RESPONSES]

    def spread(v):  # the token whose first occurrence varies most: responses of mixed lengths
        return len({row.tolist().index(v) if v in row.tolist() else -1 for row in free_run})

    eng = engine_for(model)
    eng.eos_token_ids = [max(range(len(TOK)), key=spread)]
    calls = []
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=12)
    state = set(vars(eng))
    out = eng.generate(prompts(texts), sampling, Hooks(on_finish=lambda rows, toks: calls.append((rows.tolist(), toks))))
    lengths = out[K.RESPONSE_MASK].sum(-1).long().tolist()
    reported = {}
    for i, (rows, toks) in enumerate(calls):
        for r, t in zip(rows, toks):
            assert r not in reported, f"row {r} reported twice"
            reported[r] = (i, t.tolist())
    assert sorted(reported) == list(range(2 * len(texts)))
    for r, (_, toks) in reported.items():
        assert toks == out[K.RESPONSES][r, : lengths[r]].tolist()
    assert len(set(lengths)) > 2 and len(calls) > 2  # mixed lengths, reported at different steps
    for a in range(len(lengths)):
        for b in range(len(lengths)):
            if lengths[a] < lengths[b]:  # every row started at once: the shorter ended first
                assert reported[a][0] <= reported[b][0]
    assert set(vars(eng)) == state  # nothing of the call (the hook included) is kept on the engine
