"""Checkpoint directories: written atomically, found again by `resume_mode=auto`.

Layout of `<run>/checkpoints/step_N/` (the role directories: hybridrl/distributed/checkpoint.py):
  actor/            HF config + tokenizer; model/ and optim/ sharded by torch.distributed.checkpoint
                    (any world size loads them); scheduler.pt. `hybridrl export` makes an HF dir of it.
                    LoRA (one device): actor/ is the merged HF model itself, actor/adapter/ the peft
                    adapter, optim/ + scheduler.pt beside them (hybridrl/models/lora.py)
  lora_base/        LoRA with a random-init base only: that base, so resume can rebuild it
  critic/           the same for the value model, when there is a critic
  ref/              only when the reference policy is not `model.path` (random init, warm-up)
  trainer_state.json  step, data position, KL controller, counters
  rng.pt            the controller's python / numpy / torch / cuda RNG states
  rng_<pool>_<rank>.pt  each Ray worker process's RNG states

A checkpoint is written into `.tmp_step_N` and renamed into place only when complete, and
`latest` is replaced atomically after that: a crash mid-save never leaves a broken latest.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from hybridrl.distributed.checkpoint import CheckpointError, load_plain, open_regular

LATEST = "latest"
_MAX_STATE_BYTES = 1 << 20  # a trainer_state.json is a few hundred bytes


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step}"


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    pointer = root / LATEST
    if pointer.exists():
        try:
            with open_regular(pointer) as f:
                name = f.read(4096).decode().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{pointer} cannot be read ({e})") from None
        # `latest` names one of root's own step directories; anything else (an absolute path, `..`,
        # a link out) would make auto-resume load whatever directory it points at.
        if not re.fullmatch(r"step_\d+", name) or (root / name).is_symlink():
            raise CheckpointError(
                f"{pointer} holds {name[:80]!r}, not the name of a step_N directory in {root}; "
                "delete the file to resume from the highest complete step"
            )
        path = root / name
        if path.is_dir() and (path / "trainer_state.json").exists():
            return path
    # The pointer is missing or stale: fall back to the highest complete step directory.
    steps = []
    for p in root.glob("step_*") if root.exists() else []:
        m = re.fullmatch(r"step_(\d+)", p.name)
        if m and not p.is_symlink() and (p / "trainer_state.json").exists():
            steps.append((int(m.group(1)), p))
    return max(steps)[1] if steps else None


def begin_save(root: Path, step: int) -> Path:
    tmp = root / f".tmp_step_{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def finish_save(root: Path, tmp: Path, step: int, trainer_state: dict, keep: int | None) -> Path:
    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))
    torch.save(rng_state(), tmp / "rng.pt")
    final = step_dir(root, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer_tmp = root / f".{LATEST}.tmp"
    pointer_tmp.write_text(final.name)
    os.replace(pointer_tmp, root / LATEST)
    if keep:
        _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints. Each is first renamed to `.trash_step_N`
    (atomic), so a kill mid-delete never leaves a half-deleted directory under a step name;
    leftovers of such a kill are removed the next time."""
    steps = sorted((int(m.group(1)), p) for p in root.glob("step_*") if (m := re.fullmatch(r"step_(\d+)", p.name)))
    for trash in root.glob(".trash_step_*"):
        shutil.rmtree(trash, ignore_errors=True)
    for _, p in steps[:-keep]:
        trash = root / f".trash_{p.name}"
        os.replace(p, trash)
        shutil.rmtree(trash, ignore_errors=True)


def load_trainer_state(path: Path) -> dict:
    file = path / "trainer_state.json"
    try:
        with open_regular(file) as f:
            text = f.read(_MAX_STATE_BYTES + 1)
        if len(text) > _MAX_STATE_BYTES:
            raise ValueError(f"over {_MAX_STATE_BYTES >> 10} KiB, not a trainer state")
        state = json.loads(text)
    except RecursionError:
        raise CheckpointError(f"{file} is not a valid checkpoint file: nested too deep") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: JSON errors, a 5,000-digit number
        raise CheckpointError(f"{file} is not a valid checkpoint file: {e}") from None
    problem = _trainer_state_problem(state)
    if problem:
        raise CheckpointError(f"{file} is not a valid checkpoint file: {problem}")
    return state


def _trainer_state_problem(state) -> str | None:
    """What is wrong with a trainer_state.json's content (the keys resume reads), or None."""
    if not isinstance(state, dict):
        return "a JSON object was expected"

    def count(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    if not count(state.get("global_step")):
        return f"global_step is {state.get('global_step')!r}, not a step number"
    data = state.get("data")
    if not (isinstance(data, dict) and count(data.get("epoch")) and count(data.get("position"))):
        return f"data is {str(data)[:80]!r}, not {{epoch, position}} counts"
    kl = state.get("kl_ctrl")
    if kl is not None and not (isinstance(kl, dict) and isinstance(kl.get("value"), (int, float))):
        return f"kl_ctrl is {str(kl)[:80]!r}, not {{value: number}}"
    return None


def check_resumable(path: Path) -> Path:
    """Read what resume reads before any worker starts, so a corrupt or crafted checkpoint is one
    CheckpointError: trainer_state.json, rng.pt, and each role's config.json against its weights."""
    from hybridrl.distributed.checkpoint import check_files, check_role_config, is_sharded_checkpoint, load_scheduler_state

    check_files(path)  # no FIFO or device under a name a loader opens, no link out of it
    load_trainer_state(path)
    load_plain(path / "rng.pt")
    for role in ("actor", "ref", "critic"):
        if is_sharded_checkpoint(path / role):
            check_role_config(path / role, backbone_only=role == "critic")
        if (path / role / "scheduler.pt").exists():
            load_scheduler_state(path / role / "scheduler.pt")
    return path


# -- RNG --------------------------------------------------------------------------------------
def rng_state() -> dict:
    """All RNG states as tensors and plain Python values, so weights_only loading works."""
    py = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [
            np_state[0],
            torch.from_numpy(np_state[1].astype(np.int64)),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(path: Path) -> None:
    restore_rng_file(path / "rng.pt")


def restore_rng_file(file: Path) -> None:
    state = load_plain(file)
    try:  # read every part before setting any: a malformed file changes nothing
        version, internal, gauss = state["python"]
        py = (version, tuple(internal), gauss)
        name, keys, pos, has_gauss, cached = state["numpy"]
        np_state = (name, keys.numpy().astype(np.uint32), pos, has_gauss, cached)
        torch_state = state["torch"]
        if not (isinstance(torch_state, torch.Tensor) and torch_state.dtype == torch.uint8):
            raise TypeError("torch: not a byte tensor")
        old_py = random.getstate()
        random.setstate(py)
        try:
            np.random.set_state(np_state)
        except BaseException:
            random.setstate(old_py)
            raise
        torch.set_rng_state(torch_state)
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as e:
        raise CheckpointError(f"{file} is not a valid checkpoint file: malformed RNG states ({type(e).__name__}: {e})") from None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resume_config(cfg, checkpoint):
    """The config that continues from `checkpoint` (None: from the start)."""
    cfg = copy.deepcopy(cfg)
    if checkpoint is None:  # start over; the failed attempt's files are moved aside (trainer/rundir.py)
        cfg.trainer.resume_mode, cfg.trainer.overwrite = "disable", True
    else:
        cfg.trainer.resume_mode, cfg.trainer.resume_from_path = "resume_path", str(checkpoint)
    return cfg
