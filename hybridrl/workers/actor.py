"""The actor + rollout + reference role, composed from parts on one device.

- `engine`: the policy's `TrainEngine` (placement, the update loop, the optimizer, checkpoints);
- `objectives`: what each update minimizes (PPO policy loss, SFT, DPO, KTO), handed to the engine;
- `policy`: how the weights are held (all trainable, or LoRA adapters over a frozen base);
- `reference`: the frozen reference policy, built only when a KL term or DPO/KTO needs it;
- `rollout` + `sync`: a generation engine sampling from the same weights, kept current.

Public methods take and return a `Batch` (fields from `hybridrl.data.keys`) and are registered
with a dispatch mode so the in-process and Ray worker groups call them the same way; each is a
short delegation to the parts.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path

import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.distributed.layout import rollout_tp_group
from hybridrl.models.loading import load_tokenizer
from hybridrl.rollout.base import Hooks, SamplingParams
from hybridrl.rollout.factory import build_rollout
from hybridrl.workers import forward
from hybridrl.workers.engine import Split, TrainEngine, eval_mode, perf_metrics, perf_start
from hybridrl.workers.forward import log_probs_and_routes, summed_log_probs, token_log_probs
from hybridrl.workers.objectives import DPOLoss, KTOLoss, PPOPolicyLoss, SFTLoss
from hybridrl.workers.policy import PolicyWeights
from hybridrl.workers.profiled import ProfiledWorker
from hybridrl.workers.reference import Reference
from hybridrl.workers.weight_sync import WeightSync


def log_prob_split(part, micro_size: int, name: str) -> Split:
    """The micro-batches of a log-prob pass, by `actor_rollout_ref.<name>` (rollout or ref)."""
    return Split(
        micro_size,
        part.log_prob_use_dynamic_bsz,
        part.log_prob_max_token_len_per_gpu,
        f"actor_rollout_ref.{name}.log_prob_max_token_len_per_gpu",
    )


def offline_step(engine: TrainEngine, batch: Batch, objective, micro_size: int, optimizer: str | None = None) -> dict:
    """One optimizer step over the whole batch (DPO, KTO, SFT; the warm-up with its named
    `optimizer`), fixed micro-batches: the objective's metrics, then the step's."""
    m = engine.update(batch, objective, Split(micro_size), optimizer=optimizer)
    out = {k: v[0] for k, v in m.items() if not k.startswith("actor/")}
    if optimizer is not None:  # the warm-up reports its loss only
        return out
    step = {
        "actor/grad_norm": m["actor/grad_norm"][0],
        "actor/lr": engine.scheduler.get_last_lr()[0],
        "actor/nonfinite_skipped": m["actor/nonfinite_skipped"][0],
    }
    return {**out, **step, "actor/nonfinite_in_a_row": engine.nonfinite_in_a_row}


def replay_mode(actor_cfg, engine: TrainEngine, model) -> str:
    """actor.router_replay.mode; a dense model refuses R2/R3 (there is no routing to replay)."""
    mode = actor_cfg.router_replay.mode
    if mode != "disabled" and not engine.moe.active:
        arch = (getattr(model.config, "architectures", None) or ["?"])[0]
        raise ValueError(
            f"actor_rollout_ref.actor.router_replay.mode={mode} replays a mixture of experts' routing, and {arch} "
            "has no sparse layers; set router_replay.mode=disabled"
        )
    return mode


class ActorRolloutRefWorker(ProfiledWorker):
    profile_role = "actor"

    def __init__(self, cfg, plan, device: torch.device):
        self.cfg, self.plan, self.device = cfg, plan, device
        self.arr = cfg.actor_rollout_ref
        rollout_temp = self.arr.rollout.temperature
        # Log-probs are those of the distribution the rollout sampled from (temperature-scaled).
        self.temperature = rollout_temp if rollout_temp > 0 else 1.0

    # -- setup ---------------------------------------------------------------------------------
    @register(Dispatch.ALL)
    def init_model(self, model_path: str, random_init: bool, total_optimizer_steps: int, need_ref: bool, ref_path=None):
        """Load the policy (and reference); `ref_path=None` means a copy of the initial policy."""
        m, a = self.arr.model, self.arr.actor
        self.tokenizer = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code)
        self.policy = PolicyWeights(m)
        self.engine = TrainEngine(self.device, "actor", forward.log_probs)
        self.model = self.engine.place(
            self.policy.load(model_path, random_init),
            remove_padding=m.use_remove_padding,
            attn_backend=m.packed_attn_backend,
            share_prompts=m.share_prompts,
            checkpointing=m.enable_gradient_checkpointing,
            compile_layers=a.use_torch_compile,
            param_offload=a.fsdp_config.param_offload,
            cuda_graph=a.use_cuda_graph,
            fsdp_config=a.fsdp_config,
            expert_parallel=a.fsdp_config.expert_parallel_size,
        )
        self.engine.moe.replay = (
            replay_mode(self.arr.actor, self.engine, self.model) != "disabled"
        )  # a mixture of experts: router replay R2/R3
        self.engine.build_optimizer(a.optim, total_optimizer_steps, a.grad_clip, a.fsdp_config.optimizer_offload)
        self.optimizer = self.engine.optimizer
        self.need_ref = need_ref
        self.reference = Reference(self.arr, self.device, self.policy)
        if need_ref and ref_path is not None and not self.policy.lora:
            self.reference.load(ref_path)
        pool = self.cfg.resource_pool.rollout  # generation runs on a pool of its own (workers/rollout.py)
        tp_group = None if pool else rollout_tp_group()  # None at tp=1: each rank its own replica
        # the engine holds the current weights until an optimizer step
        self.sync = WeightSync(self.engine, self.policy, tp_group)
        self.rollout = None
        if pool:
            return
        self.rollout = build_rollout(
            self.arr.rollout,
            self.model,
            self.tokenizer,
            max_model_len=self.cfg.data.max_prompt_length + self.cfg.data.max_response_length,
            autocast_dtype=self.engine.amp,
            named_weights=self.sync.start_weights(),
            tp_group=tp_group,
            record_routing=replay_mode(self.arr.actor, self.engine, self.model) == "R3",
        )

    @register(Dispatch.ALL)
    def freeze_reference(self) -> None:
        """Take the current weights as the reference policy (after loading or a warm-up).
        With LoRA the reference is the base model, adapters disabled: nothing to copy."""
        if self.need_ref and self.reference.model is None and not self.policy.lora:
            self.reference.copy_of(self.engine)

    @register(Dispatch.ALL)
    def release_reference(self) -> None:
        """Free the reference model (its log-probs were precomputed)."""
        self.reference.release()

    # -- generation ----------------------------------------------------------------------------
    @register(Dispatch.DP, mesh="rollout")
    def generate(self, prompts: Batch, sampling: SamplingParams, on_finish=None) -> Batch:
        """PROMPTS -> the batch × n with RESPONSES, RESPONSE_MASK, ROLLOUT_LOG_PROBS, RESPONSE_TEXT;
        meta[ROLLOUT_METRICS] holds the engine's metrics and the weight-sync time. `on_finish`
        (in-process callers only: it is called, not sent): `Hooks.on_finish`, the per-sequence
        report of an engine that streams them (the native one, single-turn)."""
        if self.rollout is None:
            raise RuntimeError("resource_pool.rollout is set: the rollout pool generates (RolloutWorker.generate)")
        metrics = self.sync.push(self.rollout)
        t0 = time.perf_counter()
        self.rollout.wake()
        metrics["rollout/wake_s"] = time.perf_counter() - t0
        with self.sync.serving(self.rollout):
            out = self.rollout.generate(prompts, sampling, Hooks(on_finish=on_finish))
        if self.arr.rollout.free_cache_engine:
            t0 = time.perf_counter()
            self.rollout.sleep()
            metrics["rollout/sleep_s"] = time.perf_counter() - t0
        metrics.update(self.rollout.last_metrics)
        out.meta[K.ROLLOUT_METRICS] = metrics
        return out

    # -- a rollout pool of its own (resource_pool.rollout, workers/rollout.py) -----------------
    @register(Dispatch.RANK0)
    def host_weight_channel(self, addr: str) -> int:
        """Rank 0 hosts the store of the weight channel to the rollout pool: its port."""
        return self.sync.host_channel(addr)

    @register(Dispatch.ALL)
    def join_weight_channel(self, addr: str, port: int, members: int) -> None:
        """Rank 0 is the channel's sender; the first send carries the whole policy."""
        r = self.arr.rollout
        self.sync.join_channel(
            addr, port, members, r.update_weights_bucket_megabytes, r.weight_checksum_interval, r.update_weights_staging
        )

    @register(Dispatch.RANK0)
    def send_weights(self) -> dict[str, float]:
        """The pair of the rollout pool's next generate (`WeightSync.send`); returns once staged,
        the broadcasts run in the background."""
        return self.sync.send()

    # -- log-probs -----------------------------------------------------------------------------
    @register(Dispatch.DP)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """Adds OLD_LOG_PROBS: the current policy's log-probs of the sampled tokens."""
        split = log_prob_split(self.arr.rollout, self.plan.rollout_log_prob_micro_batch, "rollout")
        with eval_mode(self.model):
            if (
                replay_mode(self.arr.actor, self.engine, self.model) == "R2"
            ):  # the update replays this pass's routing (ROUTED_EXPERTS)
                batch[K.OLD_LOG_PROBS], batch[K.ROUTED_EXPERTS] = log_probs_and_routes(
                    self.engine, self.model, batch, split, self.temperature
                )
            else:  # R3: replays the engine's routing, which the batch carries
                batch[K.OLD_LOG_PROBS] = token_log_probs(self.engine, self.model, batch, split, self.temperature)
        return batch

    @register(Dispatch.DP)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """Adds REF_LOG_PROBS from the frozen reference policy (the LoRA base, adapters off)."""
        split = log_prob_split(self.arr.ref, self.plan.ref_log_prob_micro_batch, "ref")
        # the reference routes itself (with LoRA it runs on the policy's engine, adapters off)
        with eval_mode(self.model), self.reference.passes(self.engine) as (engine, model), engine.moe.replaying(False):
            batch[K.REF_LOG_PROBS] = token_log_probs(engine, model, batch, split, self.temperature)
        return batch

    @register(Dispatch.DP)
    def sequence_log_probs(self, batch: Batch, outputs: dict[str, str], reference: bool = True) -> Batch:
        """For each `completion field -> output field` in `outputs`, adds the output (B,): the
        completion's log-prob summed over its tokens, under the frozen reference or (with
        `reference=False`) the current policy in eval mode, without gradients."""
        parts = self.reference.passes(self.engine) if reference else nullcontext((self.engine, self.model))
        with eval_mode(self.model), parts as (engine, model):
            for key, out in outputs.items():
                batch[out] = summed_log_probs(engine, model, batch, key, Split(self.plan.ref_log_prob_micro_batch))
        return batch

    # -- updates ------------------------------------------------------------------------------
    @register(Dispatch.DP)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO-clip update over mini-batches and micro-batches (`PPOPolicyLoss`); averaged metrics.

        Reads SEQ_KEYS, OLD_LOG_PROBS, ADVANTAGES (REF_LOG_PROBS with use_kl_loss, ROLLOUT_IS_WEIGHTS when set).
        """
        a = self.arr.actor
        loss = PPOPolicyLoss(a, self.temperature)
        batch = loss.select(batch)
        mini = self.plan.actor.per_device_mini_batch
        parts = loss.passes(batch, mini, lambda rest: self.compute_log_prob(rest)[K.OLD_LOG_PROBS])
        start = perf_start(self.engine)
        key = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
        split = Split(self.plan.actor.micro_batch, a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, key)
        metrics: dict[str, list[float]] = defaultdict(list)
        for part in parts:
            for k, v in self.engine.update(part, loss, split, epochs=a.ppo_epochs, shuffle=a.shuffle, mini_size=mini).items():
                metrics[k].extend(v)
        out = self.engine.summarize(metrics)
        out.update(perf_metrics(self.engine, batch, start, a.ppo_epochs, self.policy.train_passes))
        out.update(self.engine.moe.metrics())  # a mixture of experts: moe/aux_loss, moe/expert_load_max_over_mean, ...
        return out

    @register(Dispatch.DP)
    def sft_step(self, batch: Batch, lr: float) -> dict[str, float]:
        """One supervised warm-up step: the SFT objective with its own AdamW (created on the first
        call, no weight decay, gradients clipped to 1.0) so the RL optimizer's state stays clean."""
        self.engine.add_optimizer("warmup", lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=0.0), max_norm=1.0)
        m = offline_step(self.engine, batch, SFTLoss(), self.plan.actor.micro_batch, optimizer="warmup")
        return {"warmup/loss": m["loss"], "warmup/token_acc": m["mean_token_accuracy"]}

    # Rows are pairs (DPO) or examples (KTO, SFT) as laid out by hybridrl.data.preference. Each
    # update is one optimizer step over the whole batch; every micro-batch's loss is divided by
    # the batch's row (DPO, KTO) or token (SFT) count, so gradient accumulation is exact.
    @register(Dispatch.DP)
    def update_preference(self, batch: Batch, kl_ref_point: float = 0.0) -> dict[str, float]:
        """One DPO or KTO optimizer step (by algorithm.name) with TRL's metric names
        (`DPOLoss`, `KTOLoss` say what each reads)."""
        p = self.cfg.preference
        objective = DPOLoss(p) if self.cfg.algorithm.name == "dpo" else KTOLoss(p, kl_ref_point)
        return offline_step(self.engine, batch, objective, self.plan.actor.micro_batch)

    @register(Dispatch.DP)
    def update_sft(self, batch: Batch) -> dict[str, float]:
        """One supervised optimizer step: token-mean NLL of RESPONSES (prompt tokens carry no loss)."""
        return offline_step(self.engine, batch, SFTLoss(), self.plan.actor.micro_batch)

    # -- checkpoints ---------------------------------------------------------------------------
    @register(Dispatch.RANK0)
    def save_checkpoint(self, path: str, save_ref: bool) -> None:
        """Sharded (DCP) weights, optimizer and scheduler under `path/actor` (and `path/ref`);
        every rank writes its shards; `hybridrl export` makes an HF directory of it. LoRA (one
        device): `actor/` is the merged HF model with the adapter in `actor/adapter` (models/lora.py)."""
        self.policy.save(self.engine, Path(path) / "actor", self.tokenizer)
        if save_ref and self.reference.model is not None:
            self.reference.engine.save(Path(path) / "ref")

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        """Weights, optimizer and scheduler from `path/actor`, saved at any world size; the
        reference from `path/ref` when it was saved (random init or warm-up)."""
        path = Path(path)
        self.policy.load_checkpoint(self.engine, path / "actor")
        self.sync.mark_stale()  # an engine with its own weights still holds the initial ones
        if self.need_ref and self.reference.model is None and (path / "ref").exists():
            self.reference.load(str(path / "ref"), random_init=True)
            self.reference.engine.load(path / "ref")

    @register(Dispatch.RANK0)
    def save_model(self, path: str) -> None:
        """The current policy as a plain HF model directory (LoRA: merged, adapter in path/adapter)."""
        self.policy.save_model(self.model, path, self.tokenizer)
