"""The critic role: a value model (LM backbone + scalar head) in a `TrainEngine`, updated with the
clipped value loss (`objectives.ValueLoss`)."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.models.loading import load_causal_lm
from hybridrl.models.value_model import ValueModel
from hybridrl.workers import forward
from hybridrl.workers.engine import Split, TrainEngine, eval_mode
from hybridrl.workers.forward import seq_keys
from hybridrl.workers.objectives import ValueLoss
from hybridrl.workers.profiled import ProfiledWorker


class CriticWorker(ProfiledWorker):
    profile_role = "critic"

    def __init__(self, cfg, plan, device: torch.device):
        self.cfg, self.plan, self.device = cfg, plan, device

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
        self.engine = TrainEngine(self.device, "critic", forward.values)
        # Not compiled: unlike the actor's, the critic's layers were not measured compiled. The critic
        # is run through its response-value methods, not forward (FSDP gathers around those too).
        self.model = self.engine.place(
            ValueModel(backbone),
            hooks_on=backbone,
            remove_padding=c.model.use_remove_padding,
            attn_backend=m.packed_attn_backend,
            share_prompts=c.model.share_prompts,
            checkpointing=c.model.enable_gradient_checkpointing,
            param_offload=c.model.fsdp_config.param_offload,
            forward_methods=("response_values", "packed_response_values"),
            fsdp_config=c.model.fsdp_config,
        )
        self.engine.build_optimizer(c.optim, total_optimizer_steps, c.grad_clip, c.model.fsdp_config.optimizer_offload)

    def _split(self, budget: int, what: str) -> Split:
        c = self.cfg.critic
        return Split(self.plan.critic.micro_batch, c.use_dynamic_bsz, budget, what)

    @register(Dispatch.DP)
    def compute_values(self, batch: Batch) -> Batch:
        """Adds VALUES (B, R), zero outside the response."""
        split = self._split(self.cfg.critic.forward_max_token_len_per_gpu, "critic.forward_max_token_len_per_gpu")
        with eval_mode(self.model):
            values = self.engine.infer(batch.select(seq_keys(batch)), split)
        batch[K.VALUES] = values * batch[K.RESPONSE_MASK]
        return batch

    @register(Dispatch.DP)
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """Clipped value regression onto RETURNS; reads SEQ_KEYS, VALUES, RETURNS."""
        batch = batch.select([*seq_keys(batch), K.VALUES, K.RETURNS])  # only these are copied to the device
        split = self._split(self.cfg.critic.ppo_max_token_len_per_gpu, "critic.ppo_max_token_len_per_gpu")
        metrics = self.engine.update(
            batch,
            ValueLoss(self.cfg.critic),
            split,
            epochs=self.plan.critic.epochs,
            mini_size=self.plan.critic.per_device_mini_batch,
        )
        return self.engine.summarize(metrics)

    @register(Dispatch.RANK0)
    def save_checkpoint(self, path: str) -> None:
        """Sharded (DCP) backbone + value head, optimizer and scheduler under `path/critic`."""
        self.engine.save(Path(path) / "critic")

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        self.engine.load(Path(path) / "critic")
