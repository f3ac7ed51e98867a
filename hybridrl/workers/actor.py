"""The actor + rollout + reference role, composed from three parts on one device.

- `policy`: the trainable causal LM with its optimizer (the PPO/GRPO update lives here);
- `rollout`: a generation engine that samples from the same weights;
- `ref`: a frozen copy of the initial policy, built only when a KL term needs it.

Public methods take and return a `Batch` (fields from `hybridrl.data.keys`) and are registered
with a dispatch mode so the in-process and Ray worker groups call them the same way.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from pathlib import Path

import torch

from hybridrl.algorithms import agg_loss, compute_entropy_loss, compute_policy_loss, dpo_loss, kl_penalty, kto_loss, sft_loss
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.preference import MASK_OF
from hybridrl.distributed import checkpoint as dckpt
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.distributed.fsdp import clip_grad_norm, copy_weights, dp_normalizer, dp_size, full_weights, is_sharded, place
from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.models.logprobs import entropy_from_logits, log_probs_from_logits, response_logits
from hybridrl.rollout import SamplingParams, make_rollout_engine
from hybridrl.workers.optim import build_optimizer, build_scheduler, guarded_step

SEQ_KEYS = (K.PROMPTS, K.PROMPT_MASK, K.RESPONSES, K.RESPONSE_MASK)
LOSS_SHARE_KEYS = ("actor/pg_loss", "actor/kl_loss")


def autocast_dtype(device: torch.device):
    """bf16 autocast over fp32 master weights on GPUs; plain fp32 on CPU."""
    return torch.bfloat16 if device.type == "cuda" else None


class ActorRolloutRefWorker:
    def __init__(self, cfg, plan, device: torch.device):
        self.cfg, self.plan, self.device = cfg, plan, device
        self.arr = cfg.actor_rollout_ref
        self.amp = autocast_dtype(device)
        rollout_temp = self.arr.rollout.temperature
        # Log-probs are those of the distribution the rollout sampled from (temperature-scaled).
        self.temperature = rollout_temp if rollout_temp > 0 else 1.0
        self.nonfinite_in_a_row = 0

    # -- setup ---------------------------------------------------------------------------------
    @register(Dispatch.ALL)
    def init_model(self, model_path: str, random_init: bool, total_optimizer_steps: int, need_ref: bool, ref_path=None):
        """Load the policy (and reference); `ref_path=None` means a copy of the initial policy."""
        m = self.arr.model
        self.tokenizer = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code)
        model = load_causal_lm(
            model_path, random_init=random_init, override_config=m.override_config, trust_remote_code=m.trust_remote_code
        )
        if m.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = place(model, self.device, self.arr.actor.fsdp_config.param_offload)  # FSDP2 on several ranks
        self.model.train()
        self.optimizer = build_optimizer(self.model.parameters(), self.arr.actor.optim)
        self.scheduler = build_scheduler(self.optimizer, self.arr.actor.optim, total_optimizer_steps)
        self.rollout = make_rollout_engine(
            self.arr.rollout.name, self.model, self.tokenizer, max_num_seqs=self.arr.rollout.max_num_seqs, autocast_dtype=self.amp
        )
        self.need_ref, self._ref_path = need_ref, ref_path
        self.ref = None
        if need_ref and ref_path is not None:
            self.ref = self._load_ref(ref_path)

    def _load_ref(self, path: str, random_init: bool = False):
        ref = load_causal_lm(path, random_init=random_init, trust_remote_code=self.arr.model.trust_remote_code)
        return self._freeze(place(ref, self.device, self.arr.ref.fsdp_config.param_offload))

    @register(Dispatch.ALL)
    def freeze_reference(self) -> None:
        """Take the current weights as the reference policy (after loading or a warm-up)."""
        if self.need_ref and self.ref is None:
            if not is_sharded(self.model):
                self.ref = self._freeze(copy.deepcopy(self.model))
                return
            # An FSDP module cannot be deep-copied: build the same sharded model, copy the shards.
            from transformers import AutoModelForCausalLM

            ref = AutoModelForCausalLM.from_config(self.model.config, dtype=torch.float32,
                                                   trust_remote_code=self.arr.model.trust_remote_code)
            self.ref = self._freeze(place(ref, self.device, self.arr.ref.fsdp_config.param_offload))
            copy_weights(self.model, self.ref)

    @staticmethod
    def _freeze(model):
        model.eval()
        model.requires_grad_(False)
        return model

    # -- generation ----------------------------------------------------------------------------
    @register(Dispatch.DP)
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """PROMPTS -> the batch × n with RESPONSES, RESPONSE_MASK, ROLLOUT_LOG_PROBS, RESPONSE_TEXT."""
        with full_weights(self.model):  # under FSDP: this rank's prompts, the gathered weights
            return self.rollout.generate(prompts, sampling)

    # -- log-probs -----------------------------------------------------------------------------
    @torch.no_grad()
    def _log_probs(self, model, batch: Batch, micro_batch: int) -> torch.Tensor:
        out = []
        for micro in batch.select(SEQ_KEYS).split(micro_batch):
            micro = micro.to(self.device)
            with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                logits = response_logits(model, *(micro[k] for k in SEQ_KEYS), temperature=self.temperature)
            out.append(log_probs_from_logits(logits, micro[K.RESPONSES]).cpu())
        return torch.cat(out) * batch[K.RESPONSE_MASK]

    @register(Dispatch.DP)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """Adds OLD_LOG_PROBS: the current policy's log-probs of the sampled tokens."""
        was_training = self.model.training
        self.model.eval()  # no dropout: old log-probs must be deterministic
        try:
            batch[K.OLD_LOG_PROBS] = self._log_probs(self.model, batch, self.plan.rollout_log_prob_micro_batch)
        finally:
            self.model.train(was_training)
        return batch

    @register(Dispatch.DP)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """Adds REF_LOG_PROBS from the frozen reference policy."""
        if self.ref is None:
            raise RuntimeError("no reference policy: it is built only when a KL term is configured")
        batch[K.REF_LOG_PROBS] = self._log_probs(self.ref, batch, self.plan.ref_log_prob_micro_batch)
        return batch

    # -- update --------------------------------------------------------------------------------
    @register(Dispatch.DP)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO-clip update over mini-batches and micro-batches; returns averaged metrics.

        Reads SEQ_KEYS, OLD_LOG_PROBS, ADVANTAGES (and REF_LOG_PROBS with use_kl_loss).
        Micro-batch losses are normalized by the mini-batch's token/sequence count, so the
        accumulated gradient equals the mini-batch's whatever the micro-batch size.
        """
        a = self.arr.actor
        metrics: dict[str, list[float]] = defaultdict(list)
        for _ in range(a.ppo_epochs):
            order = torch.randperm(len(batch)) if a.shuffle else torch.arange(len(batch))
            for mini in batch.index(order).split(self.plan.actor.per_device_mini_batch):
                # Normalizers over the whole mini-batch on every rank (see dp_normalizer).
                global_tokens, global_seqs = dp_normalizer(float(mini[K.RESPONSE_MASK].sum())), dp_normalizer(len(mini))
                shares: dict[str, float] = defaultdict(float)
                for micro in mini.split(self.plan.actor.micro_batch):
                    loss, m = self._policy_loss(micro.to(self.device), global_tokens, global_seqs)
                    loss.backward()
                    for k, v in m.items():
                        # Loss terms are this micro-batch's share of the mini-batch loss: add them.
                        if k in LOSS_SHARE_KEYS:
                            shares[k] += v
                        else:
                            metrics[k].append(v)
                for k, v in shares.items():
                    metrics[k].append(v)
                grad_norm, stepped = guarded_step(self.model, self.optimizer, self.scheduler, a.grad_clip, a.fsdp_config.optimizer_offload)
                self.nonfinite_in_a_row = 0 if stepped else self.nonfinite_in_a_row + 1
                metrics["actor/grad_norm"].append(grad_norm)
                metrics["actor/nonfinite_skipped"].append(0.0 if stepped else 1.0)
        out = {k: sum(v) / len(v) for k, v in metrics.items()}
        out["actor/nonfinite_skipped"] = sum(metrics["actor/nonfinite_skipped"])
        out["actor/nonfinite_in_a_row"] = self.nonfinite_in_a_row
        out["actor/lr"] = self.scheduler.get_last_lr()[0]
        return out

    def _policy_loss(self, micro: Batch, global_tokens: float, global_seqs: float):
        a = self.arr.actor
        mask = micro[K.RESPONSE_MASK]
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            logits = response_logits(self.model, *(micro[k] for k in SEQ_KEYS), temperature=self.temperature)
        log_prob = log_probs_from_logits(logits, micro[K.RESPONSES])  # (b, R)
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
        with torch.no_grad() if a.entropy_coeff == 0 else torch.enable_grad():
            entropy = entropy_from_logits(logits)  # (b, R)
        entropy_loss = compute_entropy_loss(entropy, mask, **norm)
        if a.entropy_coeff != 0:
            loss = loss - a.entropy_coeff * entropy_loss
        metrics = {
            "actor/pg_loss": float(pg["pg_loss"].detach()),
            "actor/pg_clipfrac": float(pg["pg_clipfrac"]),
            "actor/pg_clipfrac_lower": float(pg["pg_clipfrac_lower"]),
            "actor/ppo_kl": float(pg["ppo_kl"]),
            "actor/entropy": float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1)),
        }
        if a.use_kl_loss:
            kl = kl_penalty(log_prob, micro[K.REF_LOG_PROBS], a.kl_loss_type)
            kl_loss = agg_loss(kl, mask, **norm)
            loss = loss + a.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = float(kl_loss.detach())
        return loss, metrics

    # -- supervised warm-up ------------------------------------------------------------------
    @register(Dispatch.DP)
    def sft_step(self, batch: Batch, lr: float) -> dict[str, float]:
        """One supervised step: mean negative log-likelihood of the response tokens (incl. EOS).

        Uses its own AdamW (created on the first call) so the RL optimizer's state stays clean.
        """
        if getattr(self, "_sft_optimizer", None) is None:
            self._sft_optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        loss, correct, tokens = self._sft_backward(batch)
        clip_grad_norm(list(self.model.parameters()), 1.0)
        self._sft_optimizer.step()
        self._sft_optimizer.zero_grad(set_to_none=True)
        return {"warmup/loss": loss, "warmup/token_acc": correct / max(tokens, 1.0)}

    def _sft_backward(self, batch: Batch) -> tuple[float, float, float]:
        """Backward of the token-mean NLL of RESPONSES over the whole batch, micro-batch by
        micro-batch; returns (loss, correctly predicted tokens, response tokens)."""
        tokens = dp_normalizer(float(batch[K.RESPONSE_MASK].sum()))  # global / dp: see dp_normalizer
        loss_sum, correct = 0.0, 0.0
        for micro in batch.split(self.plan.actor.micro_batch):
            micro = micro.to(self.device)
            log_prob, logits = self._completion_log_probs(self.model, micro, K.RESPONSES)
            loss = sft_loss(log_prob, micro[K.RESPONSE_MASK], global_tokens=tokens)
            loss.backward()
            loss_sum += float(loss.detach())
            hit = (logits.argmax(-1) == micro[K.RESPONSES]).float() * micro[K.RESPONSE_MASK]
            correct += float(hit.sum())
        return loss_sum, correct, tokens

    # -- checkpoints ---------------------------------------------------------------------------
    @register(Dispatch.RANK0)
    def save_checkpoint(self, path: str, save_ref: bool) -> None:
        """Sharded (DCP) weights, optimizer and scheduler under `path/actor` (and `path/ref`);
        every rank writes its shards. `hybridrl export` makes an HF directory of it."""
        path = Path(path)
        dckpt.save_model(self.model, path / "actor", self.model.config, self.tokenizer)
        dckpt.save_optimizer(self.model, self.optimizer, self.scheduler, path / "actor")
        if save_ref and self.ref is not None:
            dckpt.save_model(self.ref, path / "ref", self.ref.config)

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        """Weights, optimizer and scheduler from `path/actor`, saved at any world size; the
        reference from `path/ref` when it was saved (random init or warm-up)."""
        path = Path(path)
        dckpt.load_model(self.model, path / "actor")
        dckpt.load_optimizer(self.model, self.optimizer, self.scheduler, path / "actor")
        if self.need_ref and self.ref is None and (path / "ref").exists():
            self.ref = self._load_ref(str(path / "ref"), random_init=True)
            dckpt.load_model(self.ref, path / "ref")

    # -- preference and supervised updates (algorithm.name = dpo | kto | sft) -----------------
    # Rows are pairs (DPO) or examples (KTO, SFT) as laid out by hybridrl.data.preference. Each
    # update is one optimizer step over the whole batch; every micro-batch's loss is divided by
    # the batch's row (DPO, KTO) or token (SFT) count, so gradient accumulation is exact.
    def _completion_log_probs(self, model, micro: Batch, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Token log-probs of completion field `key` after the prompt, masked: (b, R); and the logits."""
        mask = micro[MASK_OF[key]]
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            logits = response_logits(model, micro[K.PROMPTS], micro[K.PROMPT_MASK], micro[key], mask)  # (b, R, V)
        return log_probs_from_logits(logits, micro[key]) * mask, logits

    @register(Dispatch.DP)
    def sequence_log_probs(self, batch: Batch, outputs: dict[str, str], reference: bool = True) -> Batch:
        """For each `completion field -> output field` in `outputs`, adds the output (B,): the
        completion's log-prob summed over its tokens, under the frozen reference or (with
        `reference=False`) the current policy in eval mode, without gradients."""
        model = self.ref if reference else self.model
        if model is None:
            raise RuntimeError("no reference policy: it is built only for KL terms and algorithm.name=dpo|kto")
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for key, out in outputs.items():
                    sums = [self._completion_log_probs(model, micro.to(self.device), key)[0].sum(-1).cpu()
                            for micro in batch.split(self.plan.ref_log_prob_micro_batch)]  # fmt: skip
                    batch[out] = torch.cat(sums)  # (B,)
        finally:
            self.model.train(was_training)
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
                parts[k].append(v.detach().cpu())
        s = {k: torch.cat(v) for k, v in parts.items()}
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
                                         self.arr.actor.fsdp_config.optimizer_offload)
        self.nonfinite_in_a_row = 0 if stepped else self.nonfinite_in_a_row + 1
        return {"actor/grad_norm": grad_norm, "actor/lr": self.scheduler.get_last_lr()[0],
                "actor/nonfinite_skipped": 0.0 if stepped else 1.0, "actor/nonfinite_in_a_row": self.nonfinite_in_a_row}  # fmt: skip
