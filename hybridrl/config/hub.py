"""Hugging Face Hub model ids, allowed only when asked for (`--allow-hub` or HYBRIDRL_ALLOW_HUB=1).

By default every model path must be a local directory: a typo would otherwise be taken for a Hub
repo id and retried for about a minute. With the flag, a path that is no local directory but has
the shape of a repo id (`org/name`) is downloaded once, before any model loads, and the config
then names the local snapshot, so the workers, the frozen reference, checkpoints and resume all
read a directory as they always do.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

ALLOW_HUB_ENV = "HYBRIDRL_ALLOW_HUB"
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# The model path keys a run may name.
MODEL_KEYS = (
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.tokenizer_path",
    "critic.model.path",
    "reward_model.model.path",
)


def hub_allowed() -> bool:
    return os.environ.get(ALLOW_HUB_ENV, "") in ("1", "true", "yes")


def download_command(repo: str = "<repo>", local_dir: str = "DIR") -> str:
    """The download command of the huggingface_hub client installed here: `hf download` since 0.34
    (`huggingface-cli` is gone from 1.0 on), `huggingface-cli download` before."""
    try:
        major, minor = (int(x) for x in metadata.version("huggingface_hub").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        major, minor = 1, 0
    cli = "hf" if (major, minor) >= (0, 34) else "huggingface-cli"
    return f"{cli} download {repo} --local-dir {local_dir}"


def looks_like_repo_id(path: str | None) -> bool:
    return bool(path) and not Path(path).exists() and bool(_REPO_ID.fullmatch(str(path)))


def fetch_repo_ids(cfg) -> list[str]:
    """With the Hub allowed, download every model path of `cfg` that is a repo id and point the config at
    the local snapshot (in place). Returns the keys it changed."""
    if not hub_allowed():
        return []
    changed, local = [], {}  # one download per repo (the tokenizer and critic inherit the actor's path)
    for key in MODEL_KEYS:
        section, attr = key.rsplit(".", 1)
        node = cfg
        for part in section.split("."):
            node = getattr(node, part)
        value = getattr(node, attr)
        if looks_like_repo_id(value):
            if value not in local:
                from huggingface_hub import snapshot_download

                print(f"[hybridrl] {key}={value}: downloading from the Hugging Face Hub ({ALLOW_HUB_ENV}=1)", flush=True)
                local[value] = snapshot_download(str(value))
            setattr(node, attr, local[value])
            changed.append(key)
    return changed
