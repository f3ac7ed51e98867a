"""How the policy's weights are held: every parameter trainable, or LoRA adapters over a frozen
base (`actor_rollout_ref.model.lora_rank > 0`, `hybridrl.models.lora`). Everything that differs
between the two lives here, so the actor worker has no LoRA branch: loading (a checkpoint's
adapter onto its base), the weights the rollout engine gets, the reference, checkpoints."""

from __future__ import annotations

from pathlib import Path

from hybridrl.distributed import checkpoint as dckpt
from hybridrl.distributed.fsdp import full_named_parameters
from hybridrl.models import lora
from hybridrl.models.loading import load_causal_lm


class PolicyWeights:
    def __init__(self, model_cfg):
        self.cfg = model_cfg
        self.lora = model_cfg.lora_rank > 0 or bool(model_cfg.lora_adapter_path)
        # forward + backward per row; LoRA computes no weight gradients of the base (perf/mfu)
        self.train_passes = 2.0 if self.lora else 3.0

    def load(self, model_path: str, random_init: bool):
        """The policy on the host; with LoRA the base wrapped in peft adapters (a checkpoint's
        `actor/adapter` is loaded onto its base: model.path, or the saved random-init base)."""
        m = self.cfg
        adapter = Path(model_path) / lora.ADAPTER_DIR
        base_path = model_path
        if self.lora and adapter.is_dir():
            saved_base = Path(model_path).parent / lora.BASE_DIR
            base_path, random_init = (str(saved_base), False) if saved_base.is_dir() else (m.path, m.random_init)
        model = load_causal_lm(
            base_path, random_init=random_init, override_config=m.override_config, trust_remote_code=m.trust_remote_code
        )
        if not self.lora:
            return model
        if adapter.is_dir():
            return lora.load_lora(model, adapter)
        if m.lora_adapter_path:  # verl's lora_adapter_path: start from a saved peft adapter
            return lora.load_lora(model, lora.check_adapter_dir(m.lora_adapter_path))
        return lora.apply_lora(model, m.lora_rank, m.lora_alpha, m.target_modules)

    def named_weights(self, model):
        """(HF name, tensor) of the current policy for engines that hold weights: with LoRA the
        merged W + scale * B @ A under the base names (the HF engine runs on this module itself);
        under FSDP the full tensors, gathered one at a time (every rank consumes it in step)."""
        return lora.merged_named_parameters(model) if self.lora else full_named_parameters(model)

    def reference_view(self, model):
        """With LoRA the reference policy is the base, adapters off (a context giving the module);
        None when the reference is a model of its own."""
        return lora.reference_view(model) if self.lora else None

    def save(self, engine, actor_dir: Path, tokenizer) -> None:
        """The policy engine's checkpoint under `actor_dir`: sharded weights, optimizer and
        scheduler; LoRA (one device): the merged HF model with the adapter in `adapter/` (and a
        random-init base beside `actor_dir`) instead of the weights."""
        if self.lora:
            base = actor_dir.parent / lora.BASE_DIR if self.cfg.random_init else None
            lora.save_lora_checkpoint(engine.model, actor_dir, base)
            tokenizer.save_pretrained(actor_dir)
        engine.save(actor_dir, tokenizer, weights=not self.lora)

    def load_checkpoint(self, engine, actor_dir: Path) -> None:
        """What `save` wrote; LoRA weights (base + adapter) were loaded by `load` already."""
        engine.load(actor_dir, weights=not self.lora)

    def save_model(self, model, path: str, tokenizer) -> None:
        """The current policy as a plain HF model directory (LoRA: merged, adapter in path/adapter)."""
        if self.lora:
            lora.save_lora_checkpoint(model, Path(path), None)
            tokenizer.save_pretrained(path)
        else:
            dckpt.save_hf(model, path, tokenizer)
