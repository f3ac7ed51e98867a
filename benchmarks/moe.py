"""Mixtures of experts on GPUs: the native engine's decode step against its memory floor, and the
GRPO step's stage times (router replay off / R3, expert parallelism, against a dense model of the
same active parameters).

Commands (Qwen3-30B-A3B shapes, random weights: speed depends on shapes, not weights):
  one GPU, decode:  PYTHONPATH=. python benchmarks/moe.py decode --out $OUT                # 48 layers, 256 rows
  one GPU, step:    PYTHONPATH=. python benchmarks/moe.py step --layers 8 --out $OUT       # replay off and R3, + dense
  4 GPUs, EP=4:     PYTHONPATH=. python benchmarks/moe.py step --layers 48 --gpus 4 --ep 4 --no-dense --out $OUT \
                      --set actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
                            actor_rollout_ref.actor.fsdp_config.optimizer_offload=true
                    (48 layers: fp32 master experts, gradients and Adam of E/4 experts are ~116 GB a GPU;
                    the engine at TP=4 holds a quarter of the bf16 weights; fewer --layers if it does not fit)
CPU smoke test:     PYTHONPATH=. python benchmarks/moe.py decode --tiny --out /tmp/moe_bench
                    PYTHONPATH=. python benchmarks/moe.py step --tiny --out /tmp/moe_bench

decode: the engine (bf16, CUDA graphs) generates `--new-tokens` tokens for `--rows` prompts of
`--prompt-len` random tokens, EOS ignored, once to capture the graphs, then timed; with the
routing recorded (router replay R3) and without. Reported per decode step:
- ms: the engine's `rollout/decode_ms_per_step`;
- floor ms: bytes one step must read / the device's copy bandwidth (a 1 GiB device-to-device
  copy, read + write): every non-expert weight, the experts some row routes to (the share
  `touched` measured from the recorded routing: with 256 rows x 8 slots over 128 experts nearly
  all), and the K/V of every row at the mean context length;
- floor (all experts) ms: the same with every expert read.

step: `hybridrl train` GRPO for `--steps` steps on arithmetic prompts, responses of forced
lognormal lengths (median `--median`), once per variant: router replay off, R3 (and `--dense`: a
Qwen3 of the same attention and the SwiGLU width of the 8 active experts, 8 x 768 = 6144, i.e. the
same active parameters per token). Medians over steps 2.. of the stage times, tokens/s per GPU
(prompt + response tokens / step time / GPUs), the decode step, and
training/rollout_probs_diff_{mean,max} (the train/inference mismatch R3 is for).
Writes moe_decode.json / moe_step.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout import copy_bandwidth, sync  # noqa: E402

from hybridrl.data import keys as K  # noqa: E402
from hybridrl.data.batch import Batch  # noqa: E402
from hybridrl.models.tiny import QWEN3_30B_A3B, tiny_qwen3_moe_config  # noqa: E402

QWEN3 = tiny_qwen3_moe_config(**QWEN3_30B_A3B)  # Qwen3-30B-A3B's shapes, 48 layers
TINY = tiny_qwen3_moe_config(vocab_size=512)


class _Tok:
    """What the engine needs of a tokenizer (ids in, ids out)."""

    eos_token_id, pad_token_id = 1, 0

    def batch_decode(self, seqs, skip_special_tokens=True):
        return [" ".join(map(str, s.tolist())) for s in seqs]


def _engine(shape: dict, device, rows: int, max_len: int, record: bool):
    from transformers import Qwen3MoeConfig

    from hybridrl.rollout.native.engine import NativeRolloutEngine

    config = Qwen3MoeConfig(**shape)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    engine = NativeRolloutEngine(
        config,
        _Tok(),
        device=device,
        dtype=dtype,
        max_model_len=max_len,
        max_num_seqs=rows,
        ignore_eos=True,
        gpu_memory_utilization=0.9,
        record_routing=record,
    )
    torch.manual_seed(0)
    with torch.no_grad():  # HF's init: N(0, 0.02) matrices, unit norms
        for name, p in engine.model.named_parameters():
            p.normal_(0, 0.02) if p.dim() >= 2 else p.fill_(1.0)
    return engine


def _prompts(n: int, length: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(2, vocab, (n, length), generator=g)
    return Batch({K.PROMPTS: ids, K.PROMPT_MASK: torch.ones_like(ids)}, {K.UID: [str(i) for i in range(n)]})


def _touched(routes: torch.Tensor, prompt_len: int, n_experts: int) -> float:
    """Mean share of a layer's experts some row routes to in one decode step: rows run in lock
    step (equal prompts, EOS ignored), so response position j is one step for every row."""
    resp = routes[:, prompt_len:-1]  # (B, steps, L, k): the inputs of the decode steps
    shares = []
    for j in range(resp.shape[1]):
        for layer in range(resp.shape[2]):
            shares.append(torch.unique(resp[:, j, layer]).numel() / n_experts)
    return statistics.mean(shares)


def decode(a) -> dict:
    from hybridrl.rollout import SamplingParams

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = dict(TINY if a.tiny else QWEN3, **({"num_hidden_layers": a.layers} if a.layers else {}))
    rows, plen, new = (8, 16, 8) if a.tiny else (a.rows, a.prompt_len, a.new_tokens)
    prompts = _prompts(rows, plen, shape["vocab_size"])
    s = SamplingParams(n=1, temperature=1.0, max_new_tokens=new)
    bw = copy_bandwidth(device)
    out = {"shape": {k: shape[k] for k in ("num_hidden_layers", "hidden_size", "num_experts", "num_experts_per_tok")}}
    for record in (False, True):
        engine = _engine(shape, device, rows, plen + new + 16, record)
        engine.generate(prompts, s)  # captures the graphs
        sync()
        t = time.perf_counter()
        got = engine.generate(prompts, s)
        sync()
        wall = time.perf_counter() - t
        row = {"decode_ms": engine.last_metrics["rollout/decode_ms_per_step"], "wall_s": wall}
        row["graph_captures"] = engine.last_metrics.get("rollout/graph_captures", 0.0)
        if record:
            m = engine.model
            expert = sum(p.numel() * p.element_size() for n, p in m.named_parameters() if ".experts." in n)
            other = sum(p.numel() * p.element_size() for n, p in m.named_parameters() if ".experts." not in n)
            kv = rows * (plen + new / 2) * shape["num_hidden_layers"] * 2 * m.n_kv_heads * m.head_dim * 2
            touched = _touched(got[K.ROUTED_EXPERTS], plen, shape["num_experts"])
            row.update(touched=touched, floor_ms=1000 * (other + touched * expert + kv) / bw)
            row["floor_all_experts_ms"] = 1000 * (other + expert + kv) / bw
            row["weights_gb"] = (other + expert) / 1e9
        out["recording" if record else "plain"] = row
        del engine, got
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out["copy_bandwidth_gbs"] = bw / 1e9
    p, r = out["plain"], out["recording"]
    print(
        f"decode at {rows} rows, {shape['num_hidden_layers']} layers: {p['decode_ms']:.2f} ms/step "
        f"(recording the routing: {r['decode_ms']:.2f}); floor {r['floor_ms']:.2f} ms "
        f"({100 * r['touched']:.1f}% of the experts touched per step; all experts {r['floor_all_experts_ms']:.2f} ms)"
    )
    return out


STAGES = ("timing_s/step", "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv")
STAGES += ("timing_s/update_actor", "timing_s/update_weights", "rollout/decode_ms_per_step", "perf/mfu/actor")
STAGES += ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "moe/replay_mismatch_frac")
STAGES += ("moe/expert_load_max_over_mean", "moe/aux_loss", "response_length/mean", "perf/total_num_tokens")


def step(a) -> dict:
    from hybridrl.data.converters import make_arith
    from hybridrl.models.tiny import write_tiny_model_dir

    work = Path(a.out) / "step_work"
    data = make_arith(str(work / "data"), n_train=512, n_test=8, n_sft=8, max_operand=99, seed=0)
    moe_shape = dict(TINY if a.tiny else QWEN3, num_hidden_layers=a.layers or (2 if a.tiny else 8))
    variants = [("off", "qwen3_moe", "disabled"), ("R3", "qwen3_moe", "R3")]
    if not a.no_dense:
        variants.append(("dense", "qwen3", "disabled"))
    tiny = a.tiny
    results = {}
    for name, family, replay in variants:
        shape = {k: v for k, v in moe_shape.items() if k not in ("architectures", "model_type")}
        if family == "qwen3":  # the 8 active experts' SwiGLU width as one dense MLP
            dense = ("moe_", "num_experts", "norm_topk", "router_", "decoder_sparse_step", "mlp_only_layers")
            shape = {k: v for k, v in shape.items() if not k.startswith(dense)}
            shape.update(intermediate_size=moe_shape["num_experts_per_tok"] * moe_shape["moe_intermediate_size"])
            shape.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3")
            model = write_tiny_model_dir(work / "dense", **shape)
        else:
            model = write_tiny_model_dir(work / "moe", family="qwen3_moe", **shape)
        run = work / f"run_{name}"
        overrides = {
            "data.train_files": data["train"],
            "data.val_files": "null",
            "data.train_batch_size": 4 if tiny else a.prompts,
            "data.max_prompt_length": 32,
            "data.max_response_length": 16 if tiny else a.max_response,
            "actor_rollout_ref.model.path": model,
            "actor_rollout_ref.model.random_init": "true",
            "actor_rollout_ref.model.enable_gradient_checkpointing": "true",
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2 if tiny else a.prompts // 2,
            "actor_rollout_ref.actor.use_dynamic_bsz": "true",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 512 if tiny else 16384,
            "actor_rollout_ref.actor.optim.lr": 1e-6,
            "actor_rollout_ref.actor.router_replay.mode": replay,
            "actor_rollout_ref.rollout.name": "native",
            "actor_rollout_ref.rollout.n": 4 if tiny else a.n,
            "actor_rollout_ref.rollout.forced_response_lengths.distribution": "lognormal",
            "actor_rollout_ref.rollout.forced_response_lengths.median": 8 if tiny else a.median,
            "algorithm.adv_estimator": "grpo",
            "trainer.device": "cpu" if tiny else "cuda",
            "trainer.n_gpus_per_node": a.gpus,
            "trainer.total_training_steps": 2 if tiny else a.steps,
            "trainer.default_local_dir": run,
            "trainer.logger": "[jsonl]",
            "trainer.log_samples": 0,
        }
        if a.ep > 1 and family != "qwen3":
            overrides["actor_rollout_ref.actor.fsdp_config.expert_parallel_size"] = a.ep
        overrides.update(kv.split("=", 1) for kv in a.set)
        empty = work / "empty.yaml"
        empty.write_text("{}\n")
        cmd = [sys.executable, "-m", "hybridrl", "train", str(empty), *[f"{k}={v}" for k, v in overrides.items()]]
        t = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(cmd, text=True, capture_output=True, cwd=ROOT, env=env)
        (work / f"{name}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            print(f"{name}: exit {proc.returncode}, see {work / f'{name}.log'}\n{proc.stderr[-2000:]}", flush=True)
            results[name] = {"error": proc.returncode}
            continue
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rows = [r for r in rows if r.get("step", 0) >= 2] or rows
        med = {k: statistics.median([r[k] for r in rows if k in r]) for k in STAGES if any(k in r for r in rows)}
        med["tokens_per_s_per_gpu"] = med["perf/total_num_tokens"] / med["timing_s/step"] / a.gpus
        med["wall_s"] = time.perf_counter() - t
        results[name] = med
        print(f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in med.items()), flush=True)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("decode", "step"))
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true", help="a tiny model on CPU (smoke test)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: decode 48, step 8)")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompts", type=int, default=32, help="step: prompts per step")
    p.add_argument("--n", type=int, default=8, help="step: samples per prompt")
    p.add_argument("--median", type=float, default=256.0, help="step: median response length")
    p.add_argument("--max-response", type=int, default=1024)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--ep", type=int, default=1, help="step: actor.fsdp_config.expert_parallel_size")
    p.add_argument("--no-dense", action="store_true", help="step: skip the dense model of the same active parameters")
    p.add_argument("--set", nargs="*", default=[], help="step: more key=value overrides for every variant")
    a = p.parse_args()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    result = decode(a) if a.what == "decode" else step(a)
    (Path(a.out) / f"moe_{a.what}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
