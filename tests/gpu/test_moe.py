"""Mixtures of experts on a GPU at Qwen3-30B-A3B's layer shapes (hidden 2048, 32 query / 4 KV heads
of 128, 128 experts of intermediate 768, 8 per token, vocabulary 151,936), 2 layers, random
weights (HF's init), bf16: the grouped-GEMM kernel against the expert loop; the native engine's
log-probs against the trainer's (the same weights, CUDA-graphed decode, routing recorded);
training/rollout_probs_diff_{mean,max} with router replay off and R3 on the same batch; the
decode step at 256 rows. Skipped without CUDA. Run:
  python -m pytest tests/gpu/test_moe.py -s   (prints the numbers)
With 2 GPUs, expert parallelism over NCCL against EP=1."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.models import moe
from hybridrl.models.tiny import QWEN3_30B_A3B, tiny_qwen3_moe_config
from hybridrl.rollout import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# 2 layers of Qwen3-30B-A3B, its tokenizer's EOS and pad ids
SHAPE = tiny_qwen3_moe_config(**{**QWEN3_30B_A3B, "num_hidden_layers": 2, "eos_token_id": 151645, "pad_token_id": 151643})


class _Tok:
    """What the engine needs of a tokenizer (ids in, ids out)."""

    eos_token_id, pad_token_id = 151645, 151643

    def batch_decode(self, seqs, skip_special_tokens=True):
        return [" ".join(map(str, s.tolist())) for s in seqs]


def _prompts(n: int, length: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(length // 2, length + 1, (n,), generator=g)
    ids = torch.randint(2, 150000, (n, length), generator=g)
    mask = (torch.arange(length)[None] >= length - lens[:, None]).long()
    return Batch(
        {K.PROMPTS: ids * mask + _Tok.pad_token_id * (1 - mask), K.PROMPT_MASK: mask}, {K.UID: [str(i) for i in range(n)]}
    )


@pytest.fixture(scope="module")
def hf():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**SHAPE)).float()


def test_grouped_gemm_kernel_agrees_with_the_expert_loop_in_bf16():
    g = torch.Generator(device="cuda").manual_seed(0)
    T, E, k, H, I = 512, 128, 8, 2048, 768
    x = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    ids = torch.rand(T, E, device="cuda", generator=g).topk(k, -1).indices
    w = torch.rand(T, k, device="cuda", generator=g)
    gate_up = (torch.randn(E, 2 * I, H, device="cuda", generator=g) * H**-0.5).bfloat16()
    down = (torch.randn(E, H, I, device="cuda", generator=g) * I**-0.5).bfloat16()
    grouped = moe.expert_forward(x, ids, w, gate_up, down, impl="grouped")
    loop = moe.expert_forward(x, ids, w, gate_up, down, impl="loop")
    err = float((grouped.float() - loop.float()).norm() / loop.float().norm())
    print(f"grouped vs loop, relative error {err:.2e}")
    assert err < 1e-2


def _trainer(model, replay: bool):
    from hybridrl.workers import forward
    from hybridrl.workers.engine import TrainEngine

    engine = TrainEngine(torch.device("cuda"), "actor", forward.log_probs)
    engine.place(model, remove_padding=True, share_prompts=True, train=False)
    engine.moe.replay = replay
    return engine


def _engine(hf, record: bool):
    from hybridrl.rollout.native.engine import NativeRolloutEngine

    kw = dict(device="cuda", dtype=torch.bfloat16, max_model_len=1024, max_num_seqs=256, ignore_eos=True)
    return NativeRolloutEngine.from_hf_model(hf, _Tok(), share_weights=False, record_routing=record, **kw)


def _probs_diff(out, old) -> tuple[float, float]:
    mask = out[K.RESPONSE_MASK].bool()
    diff = (out[K.ROLLOUT_LOG_PROBS].exp() - old.exp()).abs()[mask]
    return float(diff.mean()), float(diff.max())


def test_engine_log_probs_match_the_trainer_and_r3_shrinks_the_mismatch(hf):
    """One batch, generated once with the routing recorded; the trainer's old log-probs routing
    itself (replay off) and replaying the engine's routing (R3)."""
    from hybridrl.workers import forward
    from hybridrl.workers.engine import Split

    engine = _engine(hf, record=True)
    out = engine.generate(_prompts(64, 256), SamplingParams(n=4, temperature=1.0, max_new_tokens=128), seeds=list(range(256)))
    assert engine.last_metrics["rollout/graph_captures"] >= 1
    recorded = out[K.ROUTED_EXPERTS][..., 0, 0] >= 0
    assert int(recorded.sum()) == int(out[K.PROMPT_MASK].sum() + out[K.RESPONSE_MASK].sum()) - len(out)
    numbers = {}
    for mode in ("off", "R3"):
        trainer = _trainer(hf, replay=mode == "R3")
        old, used = forward.log_probs_and_routes(trainer, trainer.model, out, Split(16), 1.0)
        numbers[mode] = _probs_diff(out, old)
        same = (used == out[K.ROUTED_EXPERTS])[recorded].float().mean()
        numbers[mode] += (float(same),)
        print(
            f"router replay {mode}: rollout_probs_diff mean {numbers[mode][0]:.3e} max {numbers[mode][1]:.3e}, "
            f"routing equal to the engine's {100 * numbers[mode][2]:.2f}%"
        )
    assert numbers["R3"][2] == 1.0  # the replayed routing is the engine's, every token, every layer
    assert numbers["off"][2] < 1.0  # bf16 kernels of another shape flip some top-k choices
    assert numbers["R3"][0] <= numbers["off"][0]
    assert numbers["R3"][0] < 5e-3  # bf16 engine vs bf16-autocast trainer on the same routing


def test_decode_step_at_256_rows(hf):
    times = {}
    for record in (False, True):
        engine = _engine(hf, record)
        prompts, s = _prompts(256, 256, seed=1), SamplingParams(n=1, temperature=1.0, max_new_tokens=128)
        engine.generate(prompts, s)  # captures the graphs
        engine.generate(prompts, s)
        assert engine.last_metrics.get("rollout/graph_captures", 0) == 0
        times[record] = engine.last_metrics["rollout/decode_ms_per_step"]
        del engine
        torch.cuda.empty_cache()
    print(f"decode ms/step at 256 rows (2 layers): {times[False]:.2f}, recording the routing {times[True]:.2f}")
    assert times[True] < 1.5 * times[False] + 1.0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_expert_parallel_over_nccl_agrees_with_ep1(tmp_path):
    import torch.multiprocessing as mp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
    import expert_parallel_workers as W

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "r.pt")
    env = dict(os.environ)
    mp.start_processes(W.rank_main, args=(2, port, out, str(tmp_path / "ckpt"), "cuda"), nprocs=2, start_method="spawn")
    os.environ.update(env)
    r = torch.load(out, weights_only=True)  # our workers' own results: tensors, numbers, tuples
    for name, g in r[1]["grads"].items():  # bf16 autocast: each all-to-all'd GEMM rounds like EP=1's, up to order
        err = float((r[2]["grads"][name] - g).norm())
        assert err <= 0.03 * float(g.norm()) + 1e-6, (name, err)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_moe_under_cuda_graphs_equals_tp1(tmp_path):
    """Each rank holds 4 of the 8 experts; the all-reduce of the partial outputs is captured in
    the decode graphs (float32 tiny models: the experts' `dense` path)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
    from test_native_engine import engine_for, hf_model
    from tp_workers import CASES, engine_kwargs, generate_all, run_tp

    families = ("qwen3_moe", "qwen2_moe")
    per_rank = run_tp(2, families, tmp_path, device="cuda")
    for family in families:
        want = generate_all(engine_for(hf_model(family).cuda(), **engine_kwargs("cuda")))
        for r, res in enumerate(per_rank):
            assert res[family]["sharded_load_equal"] and res[family]["graphs"] >= 1, (family, r)
            for case in CASES:
                g, w = res[family][case], want[case]
                assert (g[K.RESPONSES] == w[K.RESPONSES]).float().mean() > 0.95, (family, case, r)
                same = (g[K.RESPONSES] == w[K.RESPONSES]).all(1)
                torch.testing.assert_close(g[K.ROLLOUT_LOG_PROBS][same], w[K.ROLLOUT_LOG_PROBS][same], atol=1e-4, rtol=0)
