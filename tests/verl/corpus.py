"""The verl command lines under tests/verl/scripts/, and verl's own batch normalization to check
hybridrl's batch plan against (written from verl's fsdp_workers.py, not from hybridrl's code)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from hybridrl.config import Config
from hybridrl.config.schema import walk

SCRIPTS = Path(__file__).parent / "scripts"
_KNOWN = {e.path for e in walk(Config())}


@dataclass
class Script:
    name: str
    argv: list[str]

    @property
    def entry(self) -> str:
        return "dapo" if self.name.startswith("recipe__dapo") else "ppo"

    def value(self, key: str, default=None) -> str | None:
        """The raw text of the last `key=` override (Hydra: the last one wins)."""
        found = [a.split("=", 1)[1] for a in self.argv if a.split("=", 1)[0].lstrip("+") == key]
        return found[-1] if found else default

    def int(self, key: str, default: int) -> int:
        v = self.value(key)
        return default if v in (None, "null") else int(v)


def scripts() -> list[Script]:
    out = []
    for path in sorted(SCRIPTS.glob("*.args")):
        lines = [ln.strip() for ln in path.read_text().splitlines()]
        out.append(Script(path.stem, [ln for ln in lines if ln and not ln.startswith("#")]))
    return out


def params():
    """One pytest param per script."""
    return [pytest.param(s, id=s.name) for s in scripts()]


@dataclass
class VerlPlan:
    """Per-GPU sizes as verl's FSDP workers compute them (fsdp_workers.py, ActorRolloutRefWorker
    and CriticWorker __init__): mini x n // (world // sp); a global micro size // (world // sp)."""

    world: int
    sp: int
    critic_sp: int
    actor_mini_per_gpu: int
    actor_micro_per_gpu: int | None
    critic_mini_per_gpu: int
    critic_micro_per_gpu: int | None


def verl_plan(s: Script) -> VerlPlan:
    world = s.int("trainer.nnodes", 1) * s.int("trainer.n_gpus_per_node", 8)
    n = s.int("actor_rollout_ref.rollout.n", 1)
    sp = s.int("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1)
    csp = s.int("critic.ulysses_sequence_parallel_size", 1)
    mini = s.int("actor_rollout_ref.actor.ppo_mini_batch_size", 256)
    cmini = s.int("critic.ppo_mini_batch_size", mini)

    def micro(prefix: str, dp: int) -> int | None:
        per_gpu, glob = s.value(f"{prefix}.ppo_micro_batch_size_per_gpu"), s.value(f"{prefix}.ppo_micro_batch_size")
        if per_gpu not in (None, "null"):
            return int(per_gpu)
        return int(glob) // dp if glob not in (None, "null") else None

    return VerlPlan(
        world,
        sp,
        csp,
        mini * n // (world // sp),
        micro("actor_rollout_ref.actor", world // sp),
        cmini * n // (world // csp),
        micro("critic", world // csp),
    )


def tiny_overrides(s: Script, model_dir: str, data: dict, out) -> list[str]:
    """Appended to a script (Hydra: the last value wins): the tiny model, the arithmetic task, 2 CPU
    steps of 4 prompts. Micro-batch sizes are set in the spelling the script uses (verl refuses a
    global and a per-GPU size together)."""
    o = {
        "actor_rollout_ref.model.path": model_dir,
        "critic.model.path": model_dir,
        "data.train_files": data["train"],
        "data.val_files": data["test"],
        "data.train_batch_size": 4,
        "data.max_prompt_length": 8,
        "data.max_response_length": 4,
        "data.val_max_samples": 8,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.optim.lr": 1e-3,
        "critic.optim.lr": 1e-3,
        "trainer.n_gpus_per_node": 1,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,  # one device: one rank per replica
        "trainer.nnodes": 1,
        "trainer.device": "cpu",
        "trainer.total_training_steps": 2,
        "trainer.default_local_dir": str(out),
        "trainer.logger": "console",
        "trainer.val_before_train": "false",
        "trainer.test_freq": 2,
        "trainer.save_freq": 2,
    }
    for prefix, per_gpu in (
        ("actor_rollout_ref.actor.ppo", "micro_batch_size"),
        ("actor_rollout_ref.rollout.log_prob", "micro_batch_size"),
        ("actor_rollout_ref.ref.log_prob", "micro_batch_size"),
        ("critic.ppo", "micro_batch_size"),
    ):
        key = f"{prefix}_{per_gpu}"
        o[key if s.value(key) not in (None, "null") else f"{key}_per_gpu"] = 2
    return s.argv + [f"{k}={v}" for k, v in o.items()]
