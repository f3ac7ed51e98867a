"""What a run keeps of its generations, for reading them later (the report's rollout inspector).

`samples.jsonl` holds one line per *prompt group*: a prompt with all n of its responses, their
scores and advantages, the ground truth and the data source, for `trainer.log_samples` prompts
of every training step and `trainer.log_val_samples` prompts of every validation:

    {"step": 12, "kind": "train", "uid": "7", "data_source": "arith", "prompt": "3+4=",
     "ground_truth": "7", "responses": ["7", "8"], "scores": [1.0, 0.0], "advantages": [0.7, -0.7],
     "response_lengths": [2, 2]}

`trainer.rollout_data_dir` / `trainer.validation_data_dir` (verl's keys) additionally dump every
sample of a step to `<dir>/<step>.jsonl`, one line per response with verl's field names
(`input`, `output`, `gts`, `score`, `step`) plus `advantage`, `data_source` and `uid`; each
step's file is written whole and renamed into place.

Every write appends whole lines and flushes them, so a crash loses at most the line being
written; `tracking/runlog.py` skips (and reports) such a partial line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def prompt_groups(
    step: int,
    kind: str,
    *,
    prompts,
    responses,
    scores,
    uids=None,
    ground_truths=None,
    data_sources=None,
    advantages=None,
    lengths=None,
    limit: int | None = None,
) -> list[dict]:
    """Per-sample lists (the n samples of a prompt share its uid) -> one dict per prompt, in
    order of first appearance; the first `limit` prompts (None = all)."""
    n = len(responses)
    uids = list(uids) if uids is not None else [str(p) for p in prompts]
    groups: dict[str, dict] = {}
    for i in range(n):
        uid = str(uids[i])
        g = groups.get(uid)
        if g is None:
            if limit is not None and len(groups) >= limit:
                continue
            g = groups[uid] = {
                "step": int(step),
                "kind": kind,
                "uid": uid,
                "data_source": str(data_sources[i]) if data_sources is not None else "",
                "prompt": str(prompts[i]),
                "ground_truth": _jsonable(ground_truths[i]) if ground_truths is not None else None,
                "responses": [],
                "scores": [],
                "advantages": [],
                "response_lengths": [],
            }
        g["responses"].append(str(responses[i]))
        g["scores"].append(float(scores[i]))
        g["advantages"].append(float(advantages[i]) if advantages is not None else None)
        g["response_lengths"].append(int(lengths[i]) if lengths is not None else None)
    return list(groups.values())


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """Append whole lines and flush them to disk: a crash keeps every line written before it."""
    if not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
    with path.open("a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_dump(path: Path, rows: list[dict]) -> None:
    """One step's dump file, written whole under a temporary name and renamed into place: a crash
    leaves the previous file or none, and a resumed run rewrites the steps it repeats."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    os.replace(tmp, path)


def dump_rows(groups: list[dict]) -> list[dict]:
    """Prompt groups -> verl's per-sample dump rows (`input`, `output`, `gts`, `score`, `step`)."""
    rows = []
    for g in groups:
        for j, resp in enumerate(g["responses"]):
            rows.append(
                {
                    "input": g["prompt"],
                    "output": resp,
                    "gts": g["ground_truth"],
                    "score": g["scores"][j],
                    "step": g["step"],
                    "advantage": g["advantages"][j],
                    "data_source": g["data_source"],
                    "uid": g["uid"],
                }
            )
    return rows


def group_dump_rows(rows: list[dict], kind: str) -> list[dict]:
    """verl-style dump rows (ours or verl's own) back into prompt groups."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        key = (int(r.get("step", 0)), str(r.get("uid", r.get("input", ""))))
        g = groups.get(key)
        if g is None:
            g = groups[key] = {
                "step": key[0],
                "kind": kind,
                "uid": key[1],
                "data_source": str(r.get("data_source", "")),
                "prompt": str(r.get("input", "")),
                "ground_truth": r.get("gts"),
                "responses": [],
                "scores": [],
                "advantages": [],
                "response_lengths": [],
            }
        g["responses"].append(str(r.get("output", "")))
        g["scores"].append(_float(r.get("score")))
        g["advantages"].append(_float(r.get("advantage")))
        g["response_lengths"].append(None)
    return list(groups.values())


def normalize_group(row: dict) -> dict:
    """A samples.jsonl line as a prompt group; lines of the older one-response format too."""
    if "responses" in row:
        g = dict(row)
    else:  # {"step", "prompt", "response", "score"}
        g = {
            "step": row.get("step", 0),
            "prompt": row.get("prompt", ""),
            "responses": [row.get("response", "")],
            "scores": [row.get("score")],
            "advantages": [row.get("advantage")],
        }
    g.setdefault("kind", "train")
    g.setdefault("uid", g.get("prompt", ""))
    g.setdefault("data_source", "")
    g.setdefault("ground_truth", None)
    n = len(g.get("responses", []))
    for k in ("scores", "advantages", "response_lengths"):
        vals = list(g.get(k) or [])
        g[k] = [_float(v) if k != "response_lengths" else v for v in vals] + [None] * (n - len(vals))
    g["step"] = int(g.get("step", 0))
    return g


def _float(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _jsonable(v):
    try:
        json.dumps(v)
        return v
    except TypeError:
        return str(v)
