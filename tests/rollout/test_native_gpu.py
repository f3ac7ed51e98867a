"""The native engine on CUDA (skipped without a GPU): CUDA-graph decode equals eager decode and
HF generate; run on the GPU machine (see docs/rollout.md)."""

import sys
from pathlib import Path

import pytest
import torch

from hybridrl.data import keys as K
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.hf import HFRolloutEngine
from hybridrl.rollout.native.engine import NativeRolloutEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
sys.path.insert(0, str(Path(__file__).parent))  # the CPU tests' tiny models and prompts


@pytest.fixture
def setup():
    from test_native_engine import GREEDY, TOK, hf_model, prompts

    return hf_model("qwen2", seed=0).cuda(), TOK, prompts, GREEDY


def test_graphs_equal_eager_and_hf_in_float32(setup):
    model, tok, prompts, greedy = setup
    kw = dict(device="cuda", dtype=torch.float32, max_model_len=64, max_num_seqs=8)
    graphs = NativeRolloutEngine.from_hf_model(model, tok, **kw)
    eager = NativeRolloutEngine.from_hf_model(model, tok, enforce_eager=True, **kw)
    assert graphs.use_graphs and not eager.use_graphs
    want = HFRolloutEngine(model, tok).generate(prompts(), greedy)[K.RESPONSES]
    assert torch.equal(graphs.generate(prompts(), greedy)[K.RESPONSES], want)
    s = SamplingParams(n=3, temperature=1.0, max_new_tokens=12)
    seeds = list(range(15))
    a, b = graphs.generate(prompts(), s, seeds=seeds), eager.generate(prompts(), s, seeds=seeds)
    assert torch.equal(a[K.RESPONSES], b[K.RESPONSES])
    torch.testing.assert_close(a[K.ROLLOUT_LOG_PROBS], b[K.ROLLOUT_LOG_PROBS], atol=1e-4, rtol=0)
    assert len(graphs.runner.graphs) >= 2  # rows left mid-run: smaller batch sizes were captured too
    # sleep / wake: a re-allocated cache at the same address keeps the graphs, otherwise they go
    graphs.sleep()
    graphs.wake()
    assert torch.equal(graphs.generate(prompts(), s, seeds=seeds)[K.RESPONSES], a[K.RESPONSES])
    # memory taken while asleep moves the cache: the graphs are dropped and captured again
    held = graphs.cache.data  # still alive while asleep: the new cache cannot take its address
    old = held.data_ptr()
    graphs.sleep()
    graphs.wake()
    assert graphs.cache.data.data_ptr() != old and not graphs.runner.graphs
    assert torch.equal(graphs.generate(prompts(), s, seeds=seeds)[K.RESPONSES], a[K.RESPONSES])


def test_the_first_capture_warms_up_every_smaller_batch_size(setup, monkeypatch):
    """A batch shrinks as its sequences end. The first capture compiles and tunes the decode
    kernels of every smaller size of the ladder too, so a size met later is captured after one
    warm-up run, and the tokens stay those of eager decoding."""
    model, tok, prompts, _ = setup
    kw = dict(device="cuda", dtype=torch.float32, max_model_len=64, max_num_seqs=16)
    eng = NativeRolloutEngine.from_hf_model(model, tok, **kw)
    eager = NativeRolloutEngine.from_hf_model(model, tok, enforce_eager=True, **kw)
    runner, calls = eng.runner, []
    run_steps = runner._decode_steps
    monkeypatch.setattr(runner, "_decode_steps", lambda B, mode: (calls.append(B), run_steps(B, mode))[1])
    s = SamplingParams(n=3, temperature=1.0, max_new_tokens=20)
    seeds = list(range(15))  # 5 prompts x 3 samples
    assert runner.ladder == [1, 2, 4, 8, 16]
    a, b = eng.generate(prompts(), s, seeds=seeds), eager.generate(prompts(), s, seeds=seeds)
    assert torch.equal(a[K.RESPONSES], b[K.RESPONSES])
    torch.testing.assert_close(a[K.ROLLOUT_LOG_PROBS], b[K.ROLLOUT_LOG_PROBS], atol=1e-4, rtol=0)
    assert calls[:6] == [1, 2, 4, 8, 16, 16]  # the first capture (16 rows): every size warmed up, then captured
    later = calls[6:]
    assert later, "rows ended mid-run: smaller sizes were captured"
    assert later[0::2] == later[1::2]  # each later capture: one warm-up of its size, then the capture
    mode = (1.0, s.top_k, s.top_p)
    assert {(k, mode) for k in runner.ladder} <= runner._warm
    # the KV cache moves: the graphs are captured again, each after a single warm-up run
    held = eng.cache.data
    eng.sleep()
    eng.wake()
    assert eng.cache.data.data_ptr() != held.data_ptr() and not eng.runner.graphs
    calls.clear()
    assert torch.equal(eng.generate(prompts(), s, seeds=seeds)[K.RESPONSES], a[K.RESPONSES])
    assert calls and calls[0::2] == calls[1::2]


def test_bf16_engine_matches_trainer_log_probs_loosely(setup):
    model, tok, prompts, _ = setup
    from test_native_engine import trainer_log_probs

    eng = NativeRolloutEngine.from_hf_model(model, tok, device="cuda", max_model_len=64, max_num_seqs=16)
    assert eng.dtype == torch.bfloat16
    out = eng.generate(prompts(), SamplingParams(n=2, temperature=1.0, max_new_tokens=12)).to("cuda")
    want = trainer_log_probs(model, out, 1.0)
    diff = (out[K.ROLLOUT_LOG_PROBS].exp() - want.exp()).abs().sum() / out[K.RESPONSE_MASK].sum()
    assert diff < 0.02, diff  # bf16 engine vs fp32 trainer: probabilities agree to ~1e-2


def test_top_k_top_p_under_graphs_equal_eager(setup):
    """The torch top-k/top-p sampler inside a captured graph (not yet run on a GPU when written)."""
    model, tok, prompts, _ = setup
    kw = dict(device="cuda", dtype=torch.float32, max_model_len=64, max_num_seqs=8)
    s = SamplingParams(n=2, temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=10)
    seeds = list(range(10))
    a = NativeRolloutEngine.from_hf_model(model, tok, **kw).generate(prompts(), s, seeds=seeds)
    b = NativeRolloutEngine.from_hf_model(model, tok, enforce_eager=True, **kw).generate(prompts(), s, seeds=seeds)
    assert torch.equal(a[K.RESPONSES], b[K.RESPONSES])


def test_eight_steps_per_graph_replay_equal_one_step_eager(setup):
    """Several decode steps captured in one graph (the CUDA default) against one eager step per
    launch, float32: the same tokens, with EOS and the length limit falling mid-launch."""
    model, tok, prompts, _ = setup
    kw = dict(device="cuda", dtype=torch.float32, max_model_len=64, max_num_seqs=4)
    s = SamplingParams(n=3, temperature=1.0, max_new_tokens=29)
    seeds = list(range(15))
    many = NativeRolloutEngine.from_hf_model(model, tok, decode_steps_per_sync=8, **kw)
    one = NativeRolloutEngine.from_hf_model(model, tok, enforce_eager=True, decode_steps_per_sync=1, **kw)
    assert many.use_graphs and many.runner.decode_steps == 8
    a, b = many.generate(prompts(), s, seeds=seeds), one.generate(prompts(), s, seeds=seeds)
    assert torch.equal(a[K.RESPONSES], b[K.RESPONSES]) and torch.equal(a[K.RESPONSE_MASK], b[K.RESPONSE_MASK])
    torch.testing.assert_close(a[K.ROLLOUT_LOG_PROBS], b[K.ROLLOUT_LOG_PROBS], atol=1e-4, rtol=0)
    assert many.cache.allocator.num_free == many.cache.allocator.usable


def test_the_decode_loop_never_makes_the_host_wait(setup):
    """Between decode steps the host sends block ids, kept rows and new rows to the device; none of
    it may wait for the step in flight (a pageable copy would), or the device idles meanwhile."""
    import traceback
    import warnings

    model, tok, prompts, _ = setup
    eng = NativeRolloutEngine.from_hf_model(
        model, tok, device="cuda", dtype=torch.float32, max_model_len=64, max_num_seqs=8, block_size=4
    )
    s = SamplingParams(n=3, temperature=1.0, max_new_tokens=20)
    seeds = list(range(15))
    want = eng.generate(prompts(), s, seeds=seeds)  # warm-up: graphs captured, kernels compiled
    loop = {"add_blocks", "keep_rows", "start_rows", "decode", "leave", "grow", "advance"}  # Generation.run and its parts
    sites = []
    old = warnings.showwarning

    def show(message, *args, **kwargs):
        if "synchroniz" in str(message):
            sites.append({f.name for f in traceback.extract_stack()})

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            got = eng.generate(prompts(), s, seeds=seeds)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = old
    assert sites, "the prefill's first tokens are read: the debug mode must have seen that"
    assert not [names & loop for names in sites if names & loop]
    assert torch.equal(got[K.RESPONSES], want[K.RESPONSES])  # block tables and rows intact


def test_graphs_are_captured_while_another_thread_launches_kernels(setup):
    """A capture checks only its own thread's CUDA calls: a thread busy on another stream (a
    log-prob pass, a scorer on the GPU) neither breaks it nor changes the tokens."""
    import threading

    model, tok, prompts, _ = setup
    kw = dict(device="cuda", dtype=torch.float32, max_model_len=64, max_num_seqs=8)
    s = SamplingParams(n=3, temperature=1.0, max_new_tokens=12)
    seeds = list(range(15))
    want = NativeRolloutEngine.from_hf_model(model, tok, enforce_eager=True, **kw).generate(prompts(), s, seeds=seeds)
    stop, launched = threading.Event(), []

    def busy():
        x = torch.randn(1024, 1024, device="cuda")
        with torch.cuda.stream(torch.cuda.Stream()):
            while not stop.is_set():
                x = (x @ x).tanh()
                launched.append(1)
            torch.cuda.synchronize()

    t = threading.Thread(target=busy)
    t.start()
    try:
        engine = NativeRolloutEngine.from_hf_model(model, tok, **kw)
        got = engine.generate(prompts(), s, seeds=seeds)
    finally:
        stop.set()
        t.join()
    assert engine.runner.graphs and launched  # the graphs were captured while the thread ran
    assert torch.equal(got[K.RESPONSES], want[K.RESPONSES])
