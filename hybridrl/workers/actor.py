"""The actor + rollout + reference role, composed from three parts on one device.

- `policy`: the trainable causal LM with its optimizer (the PPO/GRPO update lives here);
- `rollout`: a generation engine that samples from the same weights;
- `ref`: a frozen copy of the initial policy, built only when a KL term needs it.

Public methods take and return a `Batch` (fields from `hybridrl.data.keys`) and are registered
with a dispatch mode so the in-process and Ray worker groups call them the same way.
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from hybridrl.algorithms import agg_loss, compute_entropy_loss, compute_policy_loss, dpo_loss, kl_penalty, kto_loss, sft_loss
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.preference import MASK_OF
from hybridrl.data.token_batching import micro_batches, restore_order, sequence_lengths
from hybridrl.distributed import checkpoint as dckpt
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.distributed.fsdp import (clip_grad_norm, copy_weights, dp_max_min, dp_normalizer, dp_size,
                                       full_named_parameters, full_weights, is_sharded, place, run_as_forward)  # fmt: skip
from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.tracking.profiler import ProfiledWorker
from hybridrl.models import lora
from hybridrl.models.logprobs import entropy_from_logits, log_probs_from_logits, response_logits
from hybridrl.models.packing import pack, packed_log_probs
from hybridrl.models.prepare import compile_decoder_layers, drop_compiled, eager_layers, prepare_model
from hybridrl.rollout import SamplingParams, make_rollout_engine
from hybridrl.tracking import perf
from hybridrl.workers.optim import build_optimizer, build_scheduler, guarded_step, summarize_steps

SEQ_KEYS = (K.PROMPTS, K.PROMPT_MASK, K.RESPONSES, K.RESPONSE_MASK)
LOSS_SHARE_KEYS = ("actor/pg_loss", "actor/kl_loss")


def autocast_dtype(device: torch.device):
    """bf16 autocast over fp32 master weights on GPUs; plain fp32 on CPU."""
    return torch.bfloat16 if device.type == "cuda" else None


def to_floats(values: list[torch.Tensor]) -> list[float]:
    """0-dim tensors as Python floats with one device sync for all of them (exact: the stack
    promotes to the widest dtype). A `float()` per micro-batch metric would make the host wait
    for each forward pass before it could queue the backward."""
    return torch.stack([v.detach() for v in values]).tolist() if values else []


@contextmanager
def eval_mode(model):
    """`model` in eval mode inside (no dropout: log-probs and values must be deterministic),
    back in its previous mode after, also when the pass raises."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def dp_micro_batches(batch: Batch, *, micro_size: int, dynamic: bool, max_tokens: int, what: str):
    """`micro_batches`, with the same number of micro-batches on every data-parallel rank: FSDP
    gathers weights in every forward (and reduces gradients in every backward), so the ranks
    must run as many passes. Fixed splits agree already (every rank has as many rows); token
    budgets are raised to the largest count over the ranks, until all ranks agree (a split into
    more parts never fails: one row per part always fits)."""
    micros, order = micro_batches(batch, micro_size=micro_size, dynamic=dynamic, max_tokens=max_tokens, what=what)
    if not dynamic:
        return micros, order
    while True:
        most, fewest = dp_max_min(len(micros))
        if most == fewest:
            return micros, order
        if most > len(batch):
            raise RuntimeError(f"{what}: another rank needs {most} micro-batches but this one has {len(batch)} rows")
        micros, order = micro_batches(batch, micro_size=micro_size, dynamic=True, max_tokens=max_tokens, what=what,
                                      min_parts=most)  # fmt: skip


def mini_batch_norms(mini: Batch) -> dict[str, float]:
    """The loss normalizers of one optimizer step (actor and critic): response tokens and
    sequences of the whole mini-batch, passed to every micro-batch's loss so that the sum over
    micro-batches is the mini-batch loss whatever the split. Under data parallelism they are the
    counts of the mini-batch over all ranks / dp (`dp_normalizer`, an all-reduce): FSDP averages
    the ranks' gradients, and the average is then the single-device one for every loss_agg_mode.
    ("seq-mean-token-sum-norm" also divides by the response width R, which every micro-batch and
    every rank keeps since they are row subsets of the step's batch.)"""
    return {"global_tokens": dp_normalizer(float(mini[K.RESPONSE_MASK].sum())), "global_seqs": dp_normalizer(float(len(mini)))}


class ActorRolloutRefWorker(ProfiledWorker):
    profile_role = "actor"

    def __init__(self, cfg, plan, device: torch.device):
        self.cfg, self.plan, self.device = cfg, plan, device
        self.arr = cfg.actor_rollout_ref
        self.amp = autocast_dtype(device)
        rollout_temp = self.arr.rollout.temperature
        # Log-probs are those of the distribution the rollout sampled from (temperature-scaled).
        self.temperature = rollout_temp if rollout_temp > 0 else 1.0
        self.nonfinite_in_a_row = 0
        self._slots = 0  # token slots computed (padding included) since the last reset: actor/pad_fraction

    # -- setup ---------------------------------------------------------------------------------
    @register(Dispatch.ALL)
    def init_model(self, model_path: str, random_init: bool, total_optimizer_steps: int, need_ref: bool, ref_path=None):
        """Load the policy (and reference); `ref_path=None` means a copy of the initial policy."""
        m = self.arr.model
        self.tokenizer = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code)
        model = self._load_policy(model_path, random_init)
        # Hooks and compiled layers first, then FSDP2 around them (torchtitan's order): fully_shard
        # adds its own hooks to the blocks; compiled blocks run them eagerly (dynamo skips FSDP hooks).
        self.packing = self._prepare(model, checkpointing=m.enable_gradient_checkpointing)
        self.model = place(model, self.device, self.arr.actor.fsdp_config.param_offload)  # FSDP2 on several ranks
        self.model.train()
        self.optimizer = build_optimizer(self.model.parameters(), self.arr.actor.optim)
        self.scheduler = build_scheduler(self.optimizer, self.arr.actor.optim, total_optimizer_steps)
        r, data = self.arr.rollout, self.cfg.data
        self.rollout = make_rollout_engine(
            r.name, self.model, self.tokenizer, max_num_seqs=r.max_num_seqs, autocast_dtype=self.amp, rollout=r,
            max_model_len=data.max_prompt_length + data.max_response_length,
            # LoRA: an engine with its own weights starts from the merged policy and never aliases the base;
            # FSDP: from the gathered full tensors (it cannot alias shards)
            named_weights=self._policy_weights() if self.lora or is_sharded(self.model) else None,
        )  # fmt: skip
        self.weights_dirty = False  # the engine holds the current weights until an optimizer step
        self.need_ref, self._ref_path = need_ref, ref_path
        self.ref = None
        if need_ref and ref_path is not None and not self.lora:
            self.ref = self._load_ref(ref_path)

    def _load_ref(self, path: str, random_init: bool = False):
        return self._place_ref(load_causal_lm(path, random_init=random_init, trust_remote_code=self.arr.model.trust_remote_code))

    def _place_ref(self, ref):
        """A freshly built reference: the same (packed, compiled) passes as the policy, placed
        (sharded) like it, frozen."""
        self._prepare(ref)
        return self._freeze(place(ref, self.device, self.arr.ref.fsdp_config.param_offload))

    def _prepare(self, model, checkpointing: bool = False) -> str | None:
        m = self.arr.model
        return prepare_model(model, self.device, remove_padding=m.use_remove_padding, attn_backend=m.packed_attn_backend,
                             checkpointing=checkpointing, compile_layers=self.arr.actor.use_torch_compile)  # fmt: skip

    def _load_policy(self, model_path: str, random_init: bool):
        """The policy; with lora_rank > 0 the base wrapped in peft LoRA adapters (a checkpoint's
        `actor/adapter` is loaded onto its base: model.path, or the saved random-init base)."""
        m = self.arr.model
        adapter = Path(model_path) / lora.ADAPTER_DIR
        self.lora = m.lora_rank > 0 or bool(m.lora_adapter_path)
        if self.lora and adapter.is_dir():
            saved_base = Path(model_path).parent / lora.BASE_DIR
            base_path, random_init = (str(saved_base), False) if saved_base.is_dir() else (m.path, m.random_init)
        else:
            base_path = model_path
        model = load_causal_lm(
            base_path, random_init=random_init, override_config=m.override_config, trust_remote_code=m.trust_remote_code
        )  # moved to the device (or sharded) by `place`
        if not self.lora:
            return model
        if adapter.is_dir():
            return lora.load_lora(model, adapter)
        if m.lora_adapter_path:  # verl's lora_adapter_path: start from a saved peft adapter
            return lora.load_lora(model, lora.check_adapter_dir(m.lora_adapter_path))
        return lora.apply_lora(model, m.lora_rank, m.lora_alpha, m.target_modules)

    @register(Dispatch.ALL)
    def freeze_reference(self) -> None:
        """Take the current weights as the reference policy (after loading or a warm-up).
        With LoRA the reference is the base model, adapters disabled: nothing to copy."""
        if not (self.need_ref and self.ref is None and not self.lora):
            return
        if is_sharded(self.model):
            # An FSDP module cannot be deep-copied: build the same sharded model, copy the shards.
            from transformers import AutoModelForCausalLM

            ref = AutoModelForCausalLM.from_config(self.model.config, dtype=torch.float32,
                                                   trust_remote_code=self.arr.model.trust_remote_code)  # fmt: skip
            self.ref = self._place_ref(ref)
            copy_weights(self.model, self.ref)
            return
        ref = copy.deepcopy(self.model)
        drop_compiled(ref)  # copied wrappers would call the *policy's* layers
        if self.arr.actor.use_torch_compile and self.device.type == "cuda":
            compile_decoder_layers(ref)
        self.ref = self._freeze(ref)

    def _reference(self):
        """Context giving the reference policy: the frozen copy, or the LoRA base."""
        if self.lora:
            return lora.reference_view(self.model)
        if self.ref is None:
            raise RuntimeError("no reference policy: it is built only for KL terms and algorithm.name=dpo|kto")
        return nullcontext(self.ref)

    @staticmethod
    def _freeze(model):
        model.eval()
        model.requires_grad_(False)
        return model

    # -- generation ----------------------------------------------------------------------------
    @register(Dispatch.DP)
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """PROMPTS -> the batch × n with RESPONSES, RESPONSE_MASK, ROLLOUT_LOG_PROBS, RESPONSE_TEXT;
        meta[ROLLOUT_METRICS] holds the engine's metrics and the weight-sync time."""
        metrics = {}
        if self.weights_dirty:  # the policy moved since the engine last saw it
            t0 = time.perf_counter()
            self.rollout.load_weights(self._policy_weights())
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            metrics["timing_s/update_weights"] = time.perf_counter() - t0
            self.weights_dirty = False
        self.rollout.wake()
        # The hf engine runs on the policy module itself: under FSDP it needs the gathered weights
        # for the whole generate (ranks may decode different numbers of steps, no collectives).
        # Engines with their own weights got them through load_weights above.
        on_policy = getattr(self.rollout, "model", None) is self.model
        with full_weights(self.model) if on_policy else nullcontext(), eager_layers(self.model):
            out = self.rollout.generate(prompts, sampling)
        if self.arr.rollout.free_cache_engine:
            self.rollout.sleep()
        metrics.update(getattr(self.rollout, "last_metrics", {}))
        out.meta[K.ROLLOUT_METRICS] = metrics
        return out

    def _policy_weights(self):
        """(HF name, tensor) of the current policy for engines that hold weights: with LoRA the
        merged W + scale * B @ A under the base names (the HF engine runs on this module itself);
        under FSDP the full tensors, gathered one at a time (every rank consumes it in step)."""
        return lora.merged_named_parameters(self.model) if self.lora else full_named_parameters(self.model)

    # -- log-probs -----------------------------------------------------------------------------
    def _forward(self, model, micro: Batch, key: str = K.RESPONSES, with_entropy: bool = False, temperature=None,
                 entropy_grad: bool = False):  # fmt: skip
        """Log-probs (b, R) of completion field `key` after the prompt, entropy (b, R) or None,
        and argmax hits (b, R); packed (padding-free, fused LM head) unless disabled."""
        mask = micro[MASK_OF[key]]
        seqs = (micro[K.PROMPTS], micro[K.PROMPT_MASK], micro[key], mask)
        temp = self.temperature if temperature is None else temperature
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            if self.packing:
                packed = pack(*seqs)
                self._slots += packed.num_tokens
                # Under FSDP2 as a forward of the root, which gathers the embeddings and the LM head.
                return run_as_forward(model, packed_log_probs, packed, temperature=temp, with_entropy=with_entropy)
            logits = response_logits(model, *seqs, temperature=temp)  # (b, R, V)
        self._slots += micro[K.PROMPTS].numel() + micro[key].numel()
        with nullcontext() if entropy_grad else torch.no_grad():  # a (b, R, V) float32 graph only when needed
            entropy = entropy_from_logits(logits) if with_entropy else None
        return log_probs_from_logits(logits, micro[key]), entropy, logits.argmax(-1) == micro[key]

    @torch.no_grad()
    def _log_probs(self, model, batch: Batch, micro_batch: int, dynamic: bool = False, budget: int = 0, key: str = "") -> torch.Tensor:
        """Response log-probs (B, R) in the batch's row order, by micro-batch or token budget."""
        out = []
        micros, order = dp_micro_batches(batch.select(SEQ_KEYS), micro_size=micro_batch, dynamic=dynamic,
                                         max_tokens=budget, what=key)  # fmt: skip
        for micro in micros:
            out.append(self._forward(model, micro.to(self.device))[0].float().cpu())
        return restore_order(torch.cat(out), order) * batch[K.RESPONSE_MASK]

    @register(Dispatch.DP)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """Adds OLD_LOG_PROBS: the current policy's log-probs of the sampled tokens."""
        r = self.arr.rollout
        with eval_mode(self.model):
            batch[K.OLD_LOG_PROBS] = self._log_probs(
                self.model, batch, self.plan.rollout_log_prob_micro_batch, r.log_prob_use_dynamic_bsz,
                r.log_prob_max_token_len_per_gpu, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu")  # fmt: skip
        return batch

    @register(Dispatch.DP)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """Adds REF_LOG_PROBS from the frozen reference policy (the LoRA base, adapters off)."""
        r = self.arr.ref
        with eval_mode(self.model), self._reference() as ref:
            batch[K.REF_LOG_PROBS] = self._log_probs(
                ref, batch, self.plan.ref_log_prob_micro_batch, r.log_prob_use_dynamic_bsz,
                r.log_prob_max_token_len_per_gpu, "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu")  # fmt: skip
        return batch

    # -- update --------------------------------------------------------------------------------
    @register(Dispatch.DP)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO-clip update over mini-batches and micro-batches; returns averaged metrics.

        Reads SEQ_KEYS, OLD_LOG_PROBS, ADVANTAGES (and REF_LOG_PROBS with use_kl_loss).
        Micro-batch losses are normalized by the mini-batch's token/sequence count
        (`mini_batch_norms`), so the accumulated gradient equals the mini-batch's whatever the
        micro-batch split (fixed or by token budget).
        """
        a = self.arr.actor
        # Only the fields the loss reads are shuffled and copied to the device, micro-batch by micro-batch.
        batch = batch.select([*SEQ_KEYS, K.OLD_LOG_PROBS, K.ADVANTAGES, *([K.REF_LOG_PROBS] if a.use_kl_loss else [])])
        metrics: dict[str, list[float]] = defaultdict(list)
        self._slots = 0
        start = self._perf_start()
        for _ in range(a.ppo_epochs):
            order = torch.randperm(len(batch)) if a.shuffle else torch.arange(len(batch))
            for mini in batch.index(order).split(self.plan.actor.per_device_mini_batch):
                for k, v in self._mini_batch_backward(mini).items():
                    metrics[k].extend(v)
                grad_norm, stepped = guarded_step(self.model, self.optimizer, self.scheduler, a.grad_clip,
                                                  a.fsdp_config.optimizer_offload)  # fmt: skip
                self.weights_dirty |= stepped  # a skipped (non-finite) step leaves the engine's weights current
                self.nonfinite_in_a_row = 0 if stepped else self.nonfinite_in_a_row + 1
                metrics["actor/grad_norm"].append(grad_norm)
                metrics["actor/nonfinite_skipped"].append(0.0 if stepped else 1.0)
        out = summarize_steps(metrics, "actor", self.nonfinite_in_a_row, self.scheduler)
        out.update(self._perf_metrics(batch, start, a.ppo_epochs))
        return out

    def _mini_batch_backward(self, mini: Batch) -> dict[str, list[float]]:
        """Accumulate one optimizer step's gradient, micro-batch by micro-batch; its metrics."""
        a, metrics = self.arr.actor, defaultdict(list)
        norms = mini_batch_norms(mini)
        shares: dict[str, float] = defaultdict(float)
        micros, _ = dp_micro_batches(mini, micro_size=self.plan.actor.micro_batch, dynamic=a.use_dynamic_bsz,
                                     max_tokens=a.ppo_max_token_len_per_gpu,
                                     what="actor_rollout_ref.actor.ppo_max_token_len_per_gpu")  # fmt: skip
        pending: list[tuple[str, torch.Tensor]] = []
        for micro in micros:
            loss, m = self._policy_loss(micro.to(self.device), norms["global_tokens"], norms["global_seqs"])
            loss.backward()
            pending.extend(m.items())
        for (k, _), v in zip(pending, to_floats([t for _, t in pending])):
            # Loss terms are this micro-batch's share of the mini-batch loss: add them.
            if k in LOSS_SHARE_KEYS:
                shares[k] += v
            else:
                metrics[k].append(v)
        for k, v in shares.items():
            metrics[k].append(v)
        return metrics

    def _perf_start(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        return time.perf_counter()

    def _perf_metrics(self, batch: Batch, start: float, epochs: int) -> dict[str, float]:
        """perf/mfu/actor (useful model FLOPs, tracking/perf.py), peak memory, actor/pad_fraction."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        passes = (2.0 if self.lora else 3.0) * epochs  # forward + backward (LoRA: no weight gradients of the base)
        lengths = sequence_lengths(batch)  # (B,) real tokens; every epoch passes every row once
        out = perf.update_metrics(self.model, lengths, int(batch[K.RESPONSE_MASK].sum()), passes,
                                  seconds, self.device, role="actor")  # fmt: skip
        out["actor/pad_fraction"] = 1.0 - epochs * float(lengths.sum()) / max(self._slots, 1)
        return out

    def _policy_loss(self, micro: Batch, global_tokens: float, global_seqs: float):
        """The micro-batch's share of the mini-batch loss, and its metrics as 0-dim tensors."""
        a = self.arr.actor
        mask = micro[K.RESPONSE_MASK]
        log_prob, entropy, _ = self._forward(self.model, micro, with_entropy=True, entropy_grad=a.entropy_coeff != 0)  # (b, R)
        norm = dict(loss_agg_mode=a.loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
        pg = compute_policy_loss(
            old_log_prob=micro[K.OLD_LOG_PROBS],
            log_prob=log_prob,
            advantages=micro[K.ADVANTAGES],
            response_mask=mask,
            clip_ratio_low=a.clip_ratio_low,
            clip_ratio_high=a.clip_ratio_high,
            clip_ratio_c=a.clip_ratio_c,
            **norm,
        )
        loss = pg["pg_loss"]
        if a.entropy_coeff == 0:
            entropy = entropy.detach()
        entropy_loss = compute_entropy_loss(entropy, mask, **norm)
        if a.entropy_coeff != 0:
            loss = loss - a.entropy_coeff * entropy_loss
        metrics = {
            "actor/pg_loss": pg["pg_loss"].detach(),
            "actor/pg_clipfrac": pg["pg_clipfrac"],
            "actor/pg_clipfrac_lower": pg["pg_clipfrac_lower"],
            "actor/ppo_kl": pg["ppo_kl"],
            "actor/entropy": (entropy.detach() * mask).sum() / mask.sum().clamp(min=1),
        }
        if a.use_kl_loss:
            kl = kl_penalty(log_prob, micro[K.REF_LOG_PROBS], a.kl_loss_type)
            kl_loss = agg_loss(kl, mask, **norm)
            loss = loss + a.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
        return loss, metrics

    # -- supervised warm-up ------------------------------------------------------------------
    @register(Dispatch.DP)
    def sft_step(self, batch: Batch, lr: float) -> dict[str, float]:
        """One supervised step: mean negative log-likelihood of the response tokens (incl. EOS).

        Uses its own AdamW (created on the first call) so the RL optimizer's state stays clean.
        """
        if getattr(self, "_sft_optimizer", None) is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self._sft_optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        loss, correct, tokens = self._sft_backward(batch)
        clip_grad_norm(list(self.model.parameters()), 1.0)
        self._sft_optimizer.step()
        self.weights_dirty = True
        self._sft_optimizer.zero_grad(set_to_none=True)
        return {"warmup/loss": loss, "warmup/token_acc": correct / max(tokens, 1.0)}

    def _sft_backward(self, batch: Batch) -> tuple[float, float, float]:
        """Backward of the token-mean NLL of RESPONSES over the whole batch, micro-batch by
        micro-batch; returns (loss, correctly predicted tokens, response tokens)."""
        tokens = dp_normalizer(float(batch[K.RESPONSE_MASK].sum()))  # global / dp: see dp_normalizer
        losses, hits = [], []
        for micro in batch.split(self.plan.actor.micro_batch):
            micro = micro.to(self.device)
            log_prob, hit = self._completion_log_probs(self.model, micro, K.RESPONSES)
            loss = sft_loss(log_prob, micro[K.RESPONSE_MASK], global_tokens=tokens)
            loss.backward()
            losses.append(loss.detach())
            hits.append((hit.float() * micro[K.RESPONSE_MASK]).sum())
        values = to_floats(losses + hits)  # one sync, summed in the same order as before
        return sum(values[: len(losses)], 0.0), sum(values[len(losses) :], 0.0), tokens

    # -- checkpoints ---------------------------------------------------------------------------
    @register(Dispatch.RANK0)
    def save_checkpoint(self, path: str, save_ref: bool) -> None:
        """Sharded (DCP) weights, optimizer and scheduler under `path/actor` (and `path/ref`);
        every rank writes its shards; `hybridrl export` makes an HF directory of it. LoRA (one
        device): `actor/` is the merged HF model with the adapter in `actor/adapter` (models/lora.py)."""
        path = Path(path)
        if self.lora:
            base = path / lora.BASE_DIR if self.arr.model.random_init else None
            lora.save_lora_checkpoint(self.model, path / "actor", base)
            self.tokenizer.save_pretrained(path / "actor")
        else:
            dckpt.save_model(self.model, path / "actor", self.model.config, self.tokenizer)
        dckpt.save_optimizer(self.model, self.optimizer, self.scheduler, path / "actor")
        if save_ref and self.ref is not None:
            dckpt.save_model(self.ref, path / "ref", self.ref.config)

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        """Weights, optimizer and scheduler from `path/actor`, saved at any world size; the
        reference from `path/ref` when it was saved (random init or warm-up). With LoRA the
        weights (base + adapter) were loaded by `init_model(path/actor)` already."""
        path = Path(path)
        if not self.lora:
            dckpt.load_model(self.model, path / "actor")
        dckpt.load_optimizer(self.model, self.optimizer, self.scheduler, path / "actor")
        self.weights_dirty = True  # an engine with its own weights still holds the initial ones
        if self.need_ref and self.ref is None and (path / "ref").exists():
            self.ref = self._load_ref(str(path / "ref"), random_init=True)
            dckpt.load_model(self.ref, path / "ref")

    @register(Dispatch.RANK0)
    def save_model(self, path: str) -> None:
        """The current policy as a plain HF model directory (LoRA: merged, adapter in path/adapter)."""
        if self.lora:
            lora.save_lora_checkpoint(self.model, Path(path), None)
            self.tokenizer.save_pretrained(path)
        else:
            dckpt.save_hf(self.model, path, self.tokenizer)

    # -- preference and supervised updates (algorithm.name = dpo | kto | sft) -----------------
    # Rows are pairs (DPO) or examples (KTO, SFT) as laid out by hybridrl.data.preference. Each
    # update is one optimizer step over the whole batch; every micro-batch's loss is divided by
    # the batch's row (DPO, KTO) or token (SFT) count, so gradient accumulation is exact.
    def _completion_log_probs(self, model, micro: Batch, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Token log-probs of completion field `key` after the prompt, masked: (b, R); and the
        argmax hits (b, R). No temperature: offline objectives score the model's own distribution."""
        log_prob, _, hit = self._forward(model, micro, key, temperature=1.0)
        return log_prob * micro[MASK_OF[key]], hit

    @register(Dispatch.DP)
    def sequence_log_probs(self, batch: Batch, outputs: dict[str, str], reference: bool = True) -> Batch:
        """For each `completion field -> output field` in `outputs`, adds the output (B,): the
        completion's log-prob summed over its tokens, under the frozen reference or (with
        `reference=False`) the current policy in eval mode, without gradients."""
        with torch.no_grad(), eval_mode(self.model), (self._reference() if reference else nullcontext(self.model)) as model:
            for key, out in outputs.items():
                sums = [self._completion_log_probs(model, micro.to(self.device), key)[0].sum(-1).cpu()
                        for micro in batch.split(self.plan.ref_log_prob_micro_batch)]  # fmt: skip
                batch[out] = torch.cat(sums)  # (B,)
        return batch

    @register(Dispatch.ALL)
    def release_reference(self) -> None:
        """Free the reference model (its log-probs were precomputed)."""
        self.ref = None

    @register(Dispatch.DP)
    def update_preference(self, batch: Batch, kl_ref_point: float = 0.0) -> dict[str, float]:
        """One DPO or KTO optimizer step (by algorithm.name) with TRL's metric names.

        DPO reads PROMPTS, CHOSEN, REJECTED (+ masks), REF_CHOSEN_LOGPS, REF_REJECTED_LOGPS;
        KTO reads PROMPTS, RESPONSES (+ mask), LABEL, REF_LOGPS and the step's KL reference point.
        """
        p, kind = self.cfg.preference, self.cfg.algorithm.name
        parts: dict[str, list[torch.Tensor]] = defaultdict(list)
        for micro in batch.split(self.plan.actor.micro_batch):
            micro, b = micro.to(self.device), len(micro)
            if kind == "dpo":
                # chosen and rejected in one forward pass: (2b, R)
                pair = Batch({K.PROMPTS: micro[K.PROMPTS].repeat(2, 1), K.PROMPT_MASK: micro[K.PROMPT_MASK].repeat(2, 1),
                              K.RESPONSES: torch.cat([micro[K.CHOSEN], micro[K.REJECTED]]),
                              K.RESPONSE_MASK: torch.cat([micro[K.CHOSEN_MASK], micro[K.REJECTED_MASK]])})  # fmt: skip
                logps = self._completion_log_probs(self.model, pair, K.RESPONSES)[0].sum(-1)  # (2b,)
                out = dpo_loss(logps[:b], logps[b:], micro[K.REF_CHOSEN_LOGPS], micro[K.REF_REJECTED_LOGPS],
                               p.beta, p.loss_type, p.label_smoothing)  # fmt: skip
                out.update(chosen_logps=logps[:b], rejected_logps=logps[b:])
            else:
                logps = self._completion_log_probs(self.model, micro, K.RESPONSES)[0].sum(-1)  # (b,)
                out = kto_loss(logps, micro[K.REF_LOGPS], micro[K.LABEL], kl_ref_point, p.beta,
                               p.desirable_weight, p.undesirable_weight)  # fmt: skip
                out.update(logps=logps, labels=micro[K.LABEL])
            (out["losses"].sum() / dp_normalizer(len(batch))).backward()
            for k, v in out.items():
                parts[k].append(v.detach())  # moved to the host once, after the loop: no sync per micro-batch
        s = {k: torch.cat(v).cpu() for k, v in parts.items()}
        metrics = {"loss": float(s["losses"].mean())}
        if kind == "dpo":
            metrics.update({
                "rewards/chosen": float(s["chosen_rewards"].mean()),
                "rewards/rejected": float(s["rejected_rewards"].mean()),
                "rewards/accuracies": float((s["chosen_rewards"] > s["rejected_rewards"]).float().mean()),
                "rewards/margins": float((s["chosen_rewards"] - s["rejected_rewards"]).mean()),
                "logps/chosen": float(s["chosen_logps"].mean()),
                "logps/rejected": float(s["rejected_logps"].mean()),
            })  # fmt: skip
        else:
            good, z0 = s["labels"], max(float(kl_ref_point), 0.0) * p.beta
            # KTO's "accuracy": the share of examples on the right side of the reference point.
            right = torch.where(good, s["rewards"] > z0, s["rewards"] < z0)
            metrics.update({"kl": max(float(kl_ref_point), 0.0), "rewards/accuracies": float(right.float().mean())})
            for name, sel in (("chosen", good), ("rejected", ~good)):
                if sel.any():  # a batch may hold only one kind
                    metrics[f"rewards/{name}"] = float(s["rewards"][sel].mean())
                    metrics[f"logps/{name}"] = float(s["logps"][sel].mean())
            if good.any() and (~good).any():
                metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
        return {**metrics, **self._offline_step()}

    @register(Dispatch.DP)
    def update_sft(self, batch: Batch) -> dict[str, float]:
        """One supervised optimizer step: token-mean NLL of RESPONSES (prompt tokens carry no loss)."""
        loss_sum, correct, tokens = self._sft_backward(batch)
        return {"loss": loss_sum, "mean_token_accuracy": correct / max(tokens, 1.0), "num_tokens": tokens * dp_size(),
                **self._offline_step()}  # fmt: skip

    def _offline_step(self) -> dict[str, float]:
        grad_norm, stepped = guarded_step(self.model, self.optimizer, self.scheduler, self.arr.actor.grad_clip,
                                          self.arr.actor.fsdp_config.optimizer_offload)  # fmt: skip
        self.weights_dirty |= stepped
        self.nonfinite_in_a_row = 0 if stepped else self.nonfinite_in_a_row + 1
        return {"actor/grad_norm": grad_norm, "actor/lr": self.scheduler.get_last_lr()[0],
                "actor/nonfinite_skipped": 0.0 if stepped else 1.0, "actor/nonfinite_in_a_row": self.nonfinite_in_a_row}  # fmt: skip
