"""The critic role: a value model (LM backbone + scalar head) and its clipped-value update."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

from hybridrl.algorithms import compute_value_loss
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.token_batching import restore_order
from hybridrl.distributed import checkpoint as dckpt
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.distributed.fsdp import place
from hybridrl.tracking.profiler import ProfiledWorker
from hybridrl.models.loading import load_causal_lm
from hybridrl.models.packing import pack
from hybridrl.models.prepare import prepare_model
from hybridrl.models.value_model import ValueModel
from hybridrl.workers.actor import SEQ_KEYS, autocast_dtype, dp_micro_batches, eval_mode, mini_batch_norms, to_floats
from hybridrl.workers.optim import build_optimizer, build_scheduler, guarded_step, summarize_steps


class CriticWorker(ProfiledWorker):
    profile_role = "critic"

    def __init__(self, cfg, plan, device: torch.device):
        self.cfg, self.plan, self.device = cfg, plan, device
        self.amp = autocast_dtype(device)
        self.nonfinite_in_a_row = 0

    @register(Dispatch.ALL)
    def init_model(self, backbone_path: str, random_init: bool, total_optimizer_steps: int):
        c, m = self.cfg.critic, self.cfg.actor_rollout_ref.model
        backbone = load_causal_lm(
            backbone_path,
            random_init=random_init,
            override_config=m.override_config,
            trust_remote_code=m.trust_remote_code,
            what="critic.model.path",
            backbone_only=True,
        )
        # Not compiled: unlike the actor's, the critic's layers were not measured compiled.
        self.packing = prepare_model(backbone, self.device, remove_padding=c.model.use_remove_padding,
                                     attn_backend=m.packed_attn_backend, checkpointing=c.model.enable_gradient_checkpointing)  # fmt: skip
        # FSDP2 on several ranks; the critic is run through its response-value methods, not forward.
        self.model = place(ValueModel(backbone), self.device, c.model.fsdp_config.param_offload,
                           ("response_values", "packed_response_values"))  # fmt: skip
        self.model.train()
        self.optimizer = build_optimizer(self.model.parameters(), c.optim)
        self.scheduler = build_scheduler(self.optimizer, c.optim, total_optimizer_steps)

    def _values(self, micro: Batch) -> torch.Tensor:
        """V (b, R) of a micro-batch; packed (padding-free) unless use_remove_padding=false."""
        seqs = [micro[k] for k in SEQ_KEYS]
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            if self.packing:
                return self.model.packed_response_values(pack(*seqs))
            return self.model.response_values(*seqs)

    def _micro_batches(self, batch: Batch, budget: int, key: str):
        c = self.cfg.critic
        return dp_micro_batches(batch, micro_size=self.plan.critic.micro_batch, dynamic=c.use_dynamic_bsz,
                                max_tokens=budget, what=key)  # fmt: skip

    @register(Dispatch.DP)
    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        """Adds VALUES (B, R), zero outside the response."""
        micros, order = self._micro_batches(batch.select(SEQ_KEYS), self.cfg.critic.forward_max_token_len_per_gpu,
                                            "critic.forward_max_token_len_per_gpu")  # fmt: skip
        with eval_mode(self.model):
            out = [self._values(micro.to(self.device)).cpu() for micro in micros]
        batch[K.VALUES] = restore_order(torch.cat(out), order) * batch[K.RESPONSE_MASK]
        return batch

    @register(Dispatch.DP)
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """Clipped value regression onto RETURNS; reads SEQ_KEYS, VALUES, RETURNS."""
        c = self.cfg.critic
        batch = batch.select([*SEQ_KEYS, K.VALUES, K.RETURNS])  # only these are copied to the device
        metrics: dict[str, list[float]] = defaultdict(list)
        for _ in range(self.plan.critic.epochs):
            for mini in batch.split(self.plan.critic.per_device_mini_batch):
                norms = mini_batch_norms(mini)  # the actor's normalizers (global over dp), see there
                losses, clipfracs = [], []
                micros, _ = self._micro_batches(mini, c.ppo_max_token_len_per_gpu, "critic.ppo_max_token_len_per_gpu")
                for micro in micros:
                    micro = micro.to(self.device)
                    vpreds = self._values(micro)
                    out = compute_value_loss(
                        vpreds=vpreds,
                        values=micro[K.VALUES],
                        returns=micro[K.RETURNS],
                        response_mask=micro[K.RESPONSE_MASK],
                        cliprange_value=c.cliprange_value,
                        loss_agg_mode=c.loss_agg_mode,
                        **norms,
                    )
                    out["vf_loss"].backward()
                    losses.append(out["vf_loss"].detach())
                    clipfracs.append(out["vf_clipfrac"])
                values = to_floats(losses + clipfracs)  # one sync per mini-batch
                loss, clipfrac = values[: len(losses)], values[len(losses) :]
                grad_norm, stepped = guarded_step(self.model, self.optimizer, self.scheduler, c.grad_clip, c.model.fsdp_config.optimizer_offload)
                self.nonfinite_in_a_row = 0 if stepped else self.nonfinite_in_a_row + 1
                metrics["critic/vf_loss"].append(sum(loss, 0.0))  # the micro-batches' shares of the loss
                metrics["critic/vf_clipfrac"].append(sum(clipfrac) / len(clipfrac))
                metrics["critic/grad_norm"].append(grad_norm)
                metrics["critic/nonfinite_skipped"].append(0.0 if stepped else 1.0)
        return summarize_steps(metrics, "critic", self.nonfinite_in_a_row, self.scheduler)

    @register(Dispatch.RANK0)
    def save_checkpoint(self, path: str) -> None:
        """Sharded (DCP) backbone + value head, optimizer and scheduler under `path/critic`."""
        role = Path(path) / "critic"
        dckpt.save_model(self.model, role, self.model.config)
        dckpt.save_optimizer(self.model, self.optimizer, self.scheduler, role)

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        role = Path(path) / "critic"
        dckpt.load_model(self.model, role)
        dckpt.load_optimizer(self.model, self.optimizer, self.scheduler, role)
