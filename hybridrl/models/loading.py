"""Load a Hugging Face causal LM (or build one from its config) and its tokenizer."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

import torch
from torch import nn

from hybridrl.config.hub import ALLOW_HUB_ENV, download_command

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


class ModelLoadError(ValueError):
    """A model or tokenizer directory that cannot be used, or a device that is not there; the
    message names the key and the fix. The CLI prints it as one line and exits with status 2."""


def hub_offline_by_default() -> None:
    """Keep the Hugging Face libraries off the network unless HYBRIDRL_ALLOW_HUB=1.

    A model path that is not a local directory would otherwise be taken for a Hub repo id and
    retried for about a minute before failing. Must run before `huggingface_hub` is imported
    (it reads HF_HUB_OFFLINE once); an explicit HF_HUB_OFFLINE in the environment wins.
    """
    if os.environ.get(ALLOW_HUB_ENV, "") not in ("1", "true", "yes"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def check_dir(path: str, what: str, need: str = "config.json") -> Path:
    """`path` as a model (or tokenizer) directory that exists, or a `ModelLoadError` naming key `what` and the fix."""
    if not path:
        raise ModelLoadError(f"{what} is empty: set it to a local Hugging Face model directory")
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(
            f"{what}={path!r} does not exist. hybridrl loads local model directories only (config.json + weights); "
            f"download one first (e.g. `{download_command('Qwen/Qwen2.5-0.5B-Instruct')}`, "
            f"docs/models.md) and set {what}=DIR"
        )
    if not p.is_dir():
        raise ModelLoadError(f"{what}={path!r} is a file, not a model directory; give the directory that holds config.json")
    if need == "config.json" and not (p / "config.json").exists():
        what_is_there = "it is empty" if not any(p.iterdir()) else "not a Hugging Face model directory"
        raise ModelLoadError(
            f"{what}={path!r} has no config.json ({what_is_there}); give a directory written by "
            "save_pretrained or downloaded from the Hub"
        )
    return p


def has_weights(path: str) -> bool:
    return any((Path(path) / f).exists() for f in WEIGHT_FILES)


def load_tokenizer(path: str, trust_remote_code: bool = False, what: str = "actor_rollout_ref.model.path"):
    """The tokenizer in the local directory `path` (`what` names the key it came from, for errors)."""
    from transformers import AutoTokenizer

    p = check_dir(path, what, need="tokenizer")
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any((p / f).exists() for f in tokenizer_files):
        state = "it is empty" if not any(p.iterdir()) else ", ".join(tokenizer_files)
        raise ModelLoadError(
            f"{what}={path!r} has no tokenizer ({state}); save the tokenizer there "
            "(tokenizer.save_pretrained) or set actor_rollout_ref.model.tokenizer_path"
        )
    try:
        tok = AutoTokenizer.from_pretrained(str(p), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(
            f"{what}={path!r}: the tokenizer does not load ({first}); re-save it with tokenizer.save_pretrained"
        ) from e
    if tok.pad_token_id is None:
        # Decoder-only models often ship without a pad token; padding is masked everywhere.
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(
    path: str,
    *,
    random_init: bool = False,
    override_config: dict | None = None,
    trust_remote_code: bool = False,
    what: str = "actor_rollout_ref.model.path",
    backbone_only: bool = False,
) -> nn.Module:
    """A float32 model from a local directory; `random_init` builds it from config.json alone.

    `backbone_only` returns the base model without the LM head (for a critic).
    """
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    p = check_dir(path, what)
    try:
        config = AutoConfig.from_pretrained(p, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"{what}={path!r}: config.json does not load ({first}); fix or re-save it") from e
    for k, v in (override_config or {}).items():
        setattr(config, k, v)
    cls = AutoModel if backbone_only else AutoModelForCausalLM
    if random_init:
        model = cls.from_config(config, trust_remote_code=trust_remote_code, dtype=torch.float32)
    else:
        if not has_weights(str(p)):
            raise ModelLoadError(
                f"{what}={path!r} has a config.json but no weights ({', '.join(WEIGHT_FILES[::2])}); "
                f"set actor_rollout_ref.model.random_init=true to build it with random weights"
            )
        with _without_lm_head_report() if backbone_only else contextlib.nullcontext():
            model = cls.from_pretrained(p, config=config, trust_remote_code=trust_remote_code, dtype=torch.float32)
    return model


class _DropLmHeadReport(logging.Filter):
    """transformers' load report when the only keys left unused are the LM head's: expected when a
    critic loads the backbone of a causal LM, so it would only alarm. Any other report passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = re.sub(r"\x1b\[[0-9;]*m", "", str(record.getMessage()))
        if "LOAD REPORT" not in msg:
            return True
        rows = [ln.split("|") for ln in msg.splitlines() if ln.count("|") >= 2 and not ln.startswith(("Key", "-"))]
        return not rows or not all(r[0].strip().startswith("lm_head.") and "UNEXPECTED" in r[1] for r in rows)


@contextlib.contextmanager
def _without_lm_head_report():
    log = logging.getLogger("transformers.modeling_utils")
    f = _DropLmHeadReport()
    log.addFilter(f)
    try:
        yield
    finally:
        log.removeFilter(f)


def pick_device(device: str) -> torch.device:
    """`auto` = the current CUDA device if there is one, else CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(
            "trainer.device=cuda but torch sees no CUDA device (a CPU-only torch, or no GPU visible); "
            "use trainer.device=cpu or auto"
        )
    if device == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device(device)
