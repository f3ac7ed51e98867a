"""`actor.reuse_on_policy_log_prob` on and off, on one batch of the GSM8K recipe's shape (issue 39, item 6).

Command (one GPU):  python benchmarks/lab/reuse_log_prob.py OUT.json [0.5b|1.5b|tiny]
CPU smoke test:     python benchmarks/lab/reuse_log_prob.py /tmp/reuse.json tiny

The recipe (`benchmarks/gsm8k_grpo.sh`): 32 prompts x 16 samples, mini-batches of 16 prompts (two
optimizer steps), packed micro-batches of 24,576 tokens, log-prob passes of 65,536, KL loss, the
decoder layers compiled. Prompts of 100-200 tokens shared by their 16 samples, responses of
64-512 tokens; random weights of the real architecture (speed depends on shapes, not weights).

  off: `compute_log_prob` over the whole batch (the old log-prob stage), then `update_actor`;
  on:  `update_actor` alone; it runs the log-prob pass over the second mini-batch only.

The two alternate on the same worker (warm-up of each first), 7 times each; medians of wall time
with the device synchronized, and each part of "on" timed alone as well.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: update

import torch  # noqa: E402
import update as U  # noqa: E402

from hybridrl.config import config_from_dict, plan_batches  # noqa: E402
from hybridrl.data import keys as K  # noqa: E402
from hybridrl.data.batch import Batch  # noqa: E402
from hybridrl.models.prepare import compile_decoder_layers  # noqa: E402
from hybridrl.models.tiny import write_tiny_model_dir  # noqa: E402
from hybridrl.workers.actor import ActorRolloutRefWorker  # noqa: E402
from hybridrl.workers.engine import Split  # noqa: E402
from hybridrl.workers.forward import SEQ_KEYS  # noqa: E402
from hybridrl.workers.objectives import PPOPolicyLoss  # noqa: E402

REPS = 7


def recipe_batch(prompts: int, n: int, vocab: int, P: int = 200, R: int = 512, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(P // 2, P + 1, (prompts,), generator=g).repeat_interleave(n)
    rlen = torch.randint(R // 8, R + 1, (prompts * n,), generator=g)
    prompt_ids = torch.randint(2, vocab, (prompts, P), generator=g).repeat_interleave(n, 0)
    rows = prompts * n
    return Batch(
        {
            K.PROMPTS: prompt_ids,
            K.PROMPT_MASK: (torch.arange(P)[None] >= P - plen[:, None]).long(),
            K.RESPONSES: torch.randint(2, vocab, (rows, R), generator=g),
            K.RESPONSE_MASK: (torch.arange(R)[None] < rlen[:, None]).float(),
            K.ROLLOUT_LOG_PROBS: -torch.rand(rows, R, generator=g) * 3,
            K.REF_LOG_PROBS: -torch.rand(rows, R, generator=g) * 3,
            K.ADVANTAGES: torch.randn(rows, R, generator=g),
        }
    )


def make_worker(model_dir: str, prompts: int, n: int, mini: int, device: torch.device) -> ActorRolloutRefWorker:
    cfg = config_from_dict(
        {
            "data": {
                "train_files": "unused.jsonl",
                "train_batch_size": prompts,
                "max_prompt_length": 200,
                "max_response_length": 512,
            },
            "actor_rollout_ref": {
                "model": {"path": model_dir, "random_init": True},
                "actor": {
                    "ppo_mini_batch_size": mini,
                    "use_dynamic_bsz": True,
                    "ppo_max_token_len_per_gpu": 24576,
                    "use_kl_loss": True,
                    "kl_loss_coef": 0.001,
                    "kl_loss_type": "low_var_kl",
                    "use_torch_compile": False,  # compiled below, as the trainer does on CUDA
                    "optim": {"lr": 1e-7},
                },
                "rollout": {"n": n, "log_prob_max_token_len_per_gpu": 65536},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {"device": device.type},
        }
    )
    torch.manual_seed(0)
    w = ActorRolloutRefWorker(cfg, plan_batches(cfg), device)
    with device:
        w.init_model(model_dir, True, 100, need_ref=False)
    if device.type == "cuda":
        compile_decoder_layers(w.model)
    return w


def main(out: str, arch: str = "0.5b") -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    prompts, n, mini = (32, 16, 16) if arch != "tiny" else (4, 4, 2)
    model_dir = str(write_tiny_model_dir(tempfile.mkdtemp(), **U.ARCH[arch]))
    w = make_worker(model_dir, prompts, n, mini, dev)
    batch = recipe_batch(prompts, n, U.ARCH[arch]["vocab_size"], *((200, 512) if arch != "tiny" else (24, 32)))
    rows_per_mini = mini * n

    def off():
        b = w.compute_log_prob(batch.select(list(batch.keys())))
        b = b.select([k for k in b.keys() if k != K.ROLLOUT_LOG_PROBS])
        w.update_actor(b)

    def on():
        w.update_actor(batch.select(list(batch.keys())))

    def tail_pass():  # what "on" adds: the log-prob pass over the later mini-batch(es)
        w.compute_log_prob(batch.index(slice(rows_per_mini, len(batch))).select(SEQ_KEYS))

    def full_pass():
        w.compute_log_prob(batch.select(SEQ_KEYS))

    loss = PPOPolicyLoss(w.arr.actor, w.temperature)
    a = w.arr.actor
    split = Split(w.plan.actor.micro_batch, a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, "ppo_max_token_len_per_gpu")

    def head_update():  # one optimizer step on the first mini-batch, its own forward as pi_old
        w.engine.update(loss.select(batch.index(slice(0, rows_per_mini))), loss, split, mini_size=rows_per_mini)

    def timed(fn) -> float:
        U.sync(dev)
        t0 = time.perf_counter()
        fn()
        U.sync(dev)
        return time.perf_counter() - t0

    fns = {"off": off, "on": on, "full_logprob_pass": full_pass, "tail_logprob_pass": tail_pass, "head_update": head_update}
    for fn in fns.values():  # warm-up: compiles every variant
        fn()
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(REPS):
        for k, fn in fns.items():
            times[k].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "arch": arch,
        "batch": {"prompts": prompts, "n": n, "mini_prompts": mini, "response_tokens": int(batch[K.RESPONSE_MASK].sum())},
        "median_s": med,
        "all_s": times,
        "saving_s": med["off"] - med["on"],
    }
    for k, v in med.items():
        print(f"{k:18s} median {v:.3f} s  (min {min(times[k]):.3f}, max {max(times[k]):.3f})", flush=True)
    print(f"on saves {res['saving_s']:.3f} s per step vs off", flush=True)
    Path(out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
