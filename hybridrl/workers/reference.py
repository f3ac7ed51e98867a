"""The frozen reference policy of the KL terms and of DPO/KTO: an engine of its own (built only
when needed) holding a copy of the initial (or warmed-up) policy or a saved reference, placed and
passed like the policy; with LoRA the policy's base, adapters off, and no second model."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

from hybridrl.distributed.fsdp import copy_weights, is_sharded
from hybridrl.models import moe_block
from hybridrl.models.loading import load_causal_lm
from hybridrl.models.prepare import compile_decoder_layers, drop_compiled
from hybridrl.workers import forward
from hybridrl.workers.engine import TrainEngine
from hybridrl.workers.moe_passes import MoEPasses


class Reference:
    def __init__(self, arr, device: torch.device, policy):
        self.arr, self.policy = arr, policy  # actor_rollout_ref config, PolicyWeights
        self.engine = TrainEngine(device, "ref", forward.log_probs)

    @property
    def model(self):
        return self.engine.model

    def _place(self, model):
        """A freshly built reference: the same (packed, compiled) passes as the policy, placed
        (sharded) like it, frozen."""
        m = self.arr.model
        return self.engine.place(
            model,
            remove_padding=m.use_remove_padding,
            attn_backend=m.packed_attn_backend,
            share_prompts=m.share_prompts,
            compile_layers=self.arr.actor.use_torch_compile,
            param_offload=self.arr.ref.fsdp_config.param_offload,
            train=False,
            cuda_graph=self.arr.actor.use_cuda_graph,
            expert_parallel=self.arr.actor.fsdp_config.expert_parallel_size,  # split as the policy's
        )

    def load(self, path: str, random_init: bool = False) -> None:
        self._place(load_causal_lm(path, random_init=random_init, trust_remote_code=self.arr.model.trust_remote_code))

    def copy_of(self, policy) -> None:
        """Take the policy engine's current weights as the reference."""
        policy_model = policy.model
        if is_sharded(policy_model):
            # An FSDP module cannot be deep-copied: build the same sharded model, copy the shards.
            from transformers import AutoModelForCausalLM

            ref = AutoModelForCausalLM.from_config(
                policy_model.config, dtype=torch.float32, trust_remote_code=self.arr.model.trust_remote_code
            )
            copy_weights(policy_model, self._place(ref))
            return
        ref = copy.deepcopy(policy_model)
        drop_compiled(ref)  # copied wrappers would call the *policy's* layers
        if self.arr.actor.use_torch_compile and self.engine.device.type == "cuda":
            compile_decoder_layers(ref)
        self.engine.model, self.engine.packing = ref, policy.packing  # the copy has the policy's hooks
        self.engine.share_prompts = policy.share_prompts
        self.engine.moe = MoEPasses(moe_block.state_of(ref))  # its own sparse blocks, routing themselves
        self.engine.freeze()
        if self.arr.actor.use_cuda_graph:
            self.engine.enable_graphs()

    @contextmanager
    def passes(self, policy_engine):
        """(engine, model) that compute the reference's passes: this engine and its model, or the
        policy's engine over the LoRA base (adapters off)."""
        view = self.policy.reference_view(policy_engine.model)
        if view is not None:
            with view as model:
                yield policy_engine, model
            return
        if self.model is None:
            raise RuntimeError("no reference policy: it is built only for KL terms and algorithm.name=dpo|kto")
        yield self.engine, self.model

    def release(self) -> None:
        self.engine.model = None
