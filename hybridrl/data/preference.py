"""Preference and supervised datasets: DPO pairs, unpaired KTO examples, SFT rows.

Rows (parquet or JSONL; TRL's column names, `prompt` renamed by `data.prompt_key`):

    DPO  {"prompt": P, "chosen": C, "rejected": C}
    RM   {"prompt": P, "chosen": C, "rejected": C, "margin": m}   margin optional (default 0)
    KTO  {"prompt": P, "completion": C, "label": true | false}
    SFT  {"messages": [..., {"role": "assistant", "content": ...}]}   or   {"prompt": P, "response": C}

P is a string or a list of chat messages; C is a string or a list of (assistant) messages. A
string completion gets the tokenizer's EOS appended; a message completion is rendered with the
chat template (the text the template adds after the prompt's generation prompt), and gets EOS
only if the template did not emit it. SFT trains on the last assistant message only.

Like the prompt datasets, every row is checked and tokenized up front; a malformed row stops
the run with its file, its index and what is missing or wrong.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.chat_template import check_chat_template
from hybridrl.data.converters import read_rows
from hybridrl.data.dataset import (
    TRUNCATION_MODES,
    DataError,
    PromptLoader,
    check_prompt,
    check_text,
    render_prompt,
    row_field,
    truncate,
)

KINDS = ("dpo", "kto", "sft", "rm")
# The completions a row of each kind carries, as batch fields.
COMPLETIONS = {
    "dpo": (K.CHOSEN, K.REJECTED),
    "rm": (K.CHOSEN, K.REJECTED),
    "kto": (K.RESPONSES, K.KL_RESPONSES),
    "sft": (K.RESPONSES,),
}
MASK_OF = {K.CHOSEN: K.CHOSEN_MASK, K.REJECTED: K.REJECTED_MASK, K.RESPONSES: K.RESPONSE_MASK, K.KL_RESPONSES: K.KL_RESPONSE_MASK}
REF_OF = {
    K.CHOSEN: K.REF_CHOSEN_LOGPS,
    K.REJECTED: K.REF_REJECTED_LOGPS,
    K.RESPONSES: K.REF_LOGPS,
    K.KL_RESPONSES: K.REF_KL_LOGPS,
}
_REQUIRED = {"dpo": ("chosen", "rejected"), "rm": ("chosen", "rejected"), "kto": ("completion", "label")}


@dataclass
class Record:
    """One training row, tokenized: the prompt and its completions by batch field."""

    prompt_ids: list[int]
    completions: dict[str, list[int]]  # e.g. {K.CHOSEN: [...], K.REJECTED: [...]}
    label: bool | None = None  # KTO only
    ref_logps: dict[str, float] = field(default_factory=dict)  # REF_OF[...] -> value, when precomputed
    margin: float | None = None  # reward-model pairs only


@dataclass
class _Limits:
    max_prompt_length: int
    max_response_length: int
    truncation: str


def load_preference_records(
    files,
    tokenizer,
    kind: str,
    *,
    prompt_key: str = "prompt",
    response_key: str | None = None,
    max_prompt_length: int,
    max_response_length: int,
    truncation: str = "error",
    seed: int = 0,
) -> list[Record]:
    """Read, check and tokenize every row of `files` (a path or list of paths) as `kind` rows."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if truncation not in TRUNCATION_MODES:
        raise DataError(f"data.truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")
    limits = _Limits(max_prompt_length, max_response_length, truncation)
    files = [files] if isinstance(files, str) else list(files)
    records = []
    for path in files:
        for i, row in enumerate(read_rows(path)):
            where = f"{path}, row {i}"
            if not isinstance(row, dict):
                raise DataError(f"{where}: a row must be a mapping, got {type(row).__name__}")
            records.append(_parse_row(row, kind, prompt_key, tokenizer, limits, where, response_key))
    if not records:
        raise DataError(f"{', '.join(map(str, files))}: no rows (the file is empty); give a file with at least one row")
    if kind in ("dpo", "rm"):
        _warn_ties(records, files)
    if kind == "kto":
        _pair_mismatched(records, seed)
    return records


def _parse_row(
    row: dict, kind: str, prompt_key: str, tok, limits: _Limits, where: str, sft_response_key: str | None = None
) -> Record:
    if kind == "sft" and "messages" in row:
        if not isinstance(row["messages"], (list, np.ndarray)):
            got = f"{type(row['messages']).__name__} {row['messages']!r:.60}"
            raise DataError(
                f"{where}: 'messages' must be a list of chat messages ending with the assistant's, got {got}; "
                "for plain text use 'prompt' and 'response'"
            )
        messages = check_prompt(row["messages"], f"{where}: 'messages'")
        if len(messages) < 2 or messages[-1]["role"] != "assistant":
            raise DataError(
                f"{where}: 'messages' must end with an assistant message after at least one other "
                f"message (the response to train on); got roles {[m['role'] for m in messages]}"
            )
        prompt, completions = messages[:-1], {K.RESPONSES: messages[-1:]}
    else:
        response_key = sft_response_key or next((k for k in ("response", "completion") if k in row), "response")
        needed = _REQUIRED.get(kind, (response_key,))
        missing = [k for k in (prompt_key, *needed) if row_field(row, k) is None]
        if missing:
            hint = {
                "dpo": f"pairwise rows need {prompt_key!r}, 'chosen' and 'rejected'",
                "rm": f"reward-model pairs need {prompt_key!r}, 'chosen' and 'rejected' (and optionally 'margin')",
                "kto": f"KTO rows need {prompt_key!r}, 'completion' and 'label'",
                "sft": f"SFT rows need 'messages', or {prompt_key!r} and {response_key!r}",
            }[kind]
            raise DataError(f"{where}: missing {', '.join(map(repr, missing))} ({hint}); row has {sorted(row)}")
        prompt = check_prompt(row_field(row, prompt_key), f"{where}: {prompt_key!r}")
        fields = {
            "dpo": {K.CHOSEN: "chosen", K.REJECTED: "rejected"},
            "rm": {K.CHOSEN: "chosen", K.REJECTED: "rejected"},
            "kto": {K.RESPONSES: "completion"},
            "sft": {K.RESPONSES: response_key},
        }[kind]
        completions = {key: row_field(row, col) for key, col in fields.items()}
    prompt_text = render_prompt(tok, prompt)
    prompt_ids = _fit(
        tok(prompt_text, add_special_tokens=False)["input_ids"],
        limits.max_prompt_length,
        limits.truncation,
        f"{where}: the prompt",
        "data.max_prompt_length",
        keep_end=True,
    )
    ids = {}
    for key, value in completions.items():
        name = {K.CHOSEN: "'chosen'", K.REJECTED: "'rejected'"}.get(key, "the response")
        # an empty completion (EOS alone) is a response a reward model must learn to rank, not a data error
        text = "" if kind == "rm" and value == "" else _completion_text(tok, prompt, prompt_text, value, f"{where}: {name}")
        tokens = tok(text, add_special_tokens=False)["input_ids"]
        if tok.eos_token_id not in tokens:
            tokens.append(tok.eos_token_id)
        ids[key] = _fit(
            tokens, limits.max_response_length, limits.truncation, f"{where}: {name}", "data.max_response_length", keep_end=False
        )
    label = None
    if kind == "kto":
        label = row["label"]
        if isinstance(label, (int, np.integer)) and not isinstance(label, bool) and label in (0, 1):
            label = bool(label)
        if not isinstance(label, (bool, np.bool_)):
            raise DataError(f"{where}: 'label' must be true (desirable) or false (undesirable), got {label!r:.60}")
    margin = None
    if kind == "rm":
        margin = row.get("margin")
        margin = 0.0 if margin is None else margin
        number = isinstance(margin, (int, float, np.integer, np.floating)) and not isinstance(margin, bool)
        if not (number and np.isfinite(margin)):
            raise DataError(f"{where}: 'margin' must be a finite number (chosen's required lead), got {margin!r:.60}")
    return Record(prompt_ids, ids, None if label is None else bool(label), margin=None if margin is None else float(margin))


def _warn_ties(records: list[Record], files) -> None:
    """DPO pairs whose chosen and rejected tokens are equal carry no preference (their loss is a
    constant log 2): say so once, with the first rows, rather than train on them in silence."""
    ties = [i for i, r in enumerate(records) if r.completions[K.CHOSEN] == r.completions[K.REJECTED]]
    if ties:
        first = ", ".join(map(str, ties[:5])) + (", ..." if len(ties) > 5 else "")
        print(
            f"hybridrl: warning: {', '.join(map(str, files))}: {len(ties)} of {len(records)} pairs have chosen == rejected "
            f"(rows {first}); they teach nothing, drop them from the data",
            file=sys.stderr,
        )


def load_warmup_pairs(files, tokenizer, *, prompt_key: str, max_prompt_length: int, truncation: str):
    """(prompt_ids, response_ids) of the supervised warm-up rows (`prompt_key` and `response`),
    checked like SFT rows; prompts are cut to data.max_prompt_length as the RL prompts are."""
    files = [files] if isinstance(files, str) else list(files)
    for path in files:
        if not read_rows(path):
            raise DataError(
                f"{path}: no rows (the file is empty); warmup.files needs rows with {prompt_key!r} and "
                "'response', or set warmup.steps=0 to skip the warm-up"
            )
    records = load_preference_records(
        files,
        tokenizer,
        "sft",
        prompt_key=prompt_key,
        max_prompt_length=max_prompt_length,
        max_response_length=1 << 30,
        truncation=truncation,
    )
    return [(r.prompt_ids, r.completions[K.RESPONSES]) for r in records]


def _completion_text(tok, prompt, prompt_text: str, value, where: str) -> str:
    if isinstance(value, str):
        if not value:
            raise DataError(f"{where} is an empty string")
        return check_text(value, where)
    if not isinstance(value, (list, np.ndarray)) or len(value) == 0:
        raise DataError(f"{where} must be a string or a non-empty list of chat messages, got {value!r:.120}")
    messages = check_prompt(value, where)
    if isinstance(prompt, str):
        raise DataError(f"{where} is a list of chat messages but the prompt is plain text; use one format for both")
    if getattr(tok, "chat_template", None) is None:
        return "\n".join(m["content"] for m in messages)
    check_chat_template(tok)
    full = tok.apply_chat_template(prompt + messages, tokenize=False)
    if not full.startswith(prompt_text):
        raise DataError(
            f"{where}: the chat template renders prompt + completion with a different prefix than the "
            "prompt alone; pass the completion as a plain string instead"
        )
    return full[len(prompt_text) :]


def _fit(ids: list[int], limit: int, truncation: str, what: str, key: str, keep_end: bool) -> list[int]:
    if len(ids) <= limit:
        return ids
    if truncation == "error":
        raise DataError(f"{what} has {len(ids)} tokens > {key}={limit}; raise it or set data.truncation=left|right|middle")
    if not keep_end:  # a completion keeps its beginning whatever the mode
        return ids[:limit]
    return truncate(ids, limit, truncation)


def _pair_mismatched(records: list[Record], seed: int) -> None:
    """KTO's KL estimate pairs each prompt with another row's completion; the pairing is a fixed
    cycle over a seeded permutation of the dataset, so it can be precomputed and resumed."""
    order = np.random.default_rng(seed).permutation(len(records))
    for j, i in enumerate(order):
        records[i].completions[K.KL_RESPONSES] = records[order[(j + 1) % len(records)]].completions[K.RESPONSES]


def collate_records(records: list[Record], pad_token_id: int) -> Batch:
    """Left-padded PROMPTS and right-padded completions (all to one width R), with their masks,
    LABEL for KTO, and the REF_* log-probs when they were precomputed."""
    n = len(records)
    P = max(len(r.prompt_ids) for r in records)
    R = max(len(ids) for r in records for ids in r.completions.values())
    prompts = torch.full((n, P), pad_token_id, dtype=torch.long)  # (B, P)
    prompt_mask = torch.zeros((n, P), dtype=torch.long)
    tensors = {K.PROMPTS: prompts, K.PROMPT_MASK: prompt_mask}
    for key in records[0].completions:
        tensors[key] = torch.full((n, R), pad_token_id, dtype=torch.long)  # (B, R)
        tensors[MASK_OF[key]] = torch.zeros((n, R), dtype=torch.float32)
    for i, r in enumerate(records):
        prompts[i, P - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
        prompt_mask[i, P - len(r.prompt_ids) :] = 1
        for key, ids in r.completions.items():
            tensors[key][i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            tensors[MASK_OF[key]][i, : len(ids)] = 1
    if records[0].label is not None:
        tensors[K.LABEL] = torch.tensor([r.label for r in records], dtype=torch.bool)  # (B,)
    if records[0].margin is not None:
        tensors[K.MARGIN] = torch.tensor([r.margin for r in records], dtype=torch.float32)  # (B,)
    for key in records[0].ref_logps:
        tensors[key] = torch.tensor([r.ref_logps[key] for r in records], dtype=torch.float32)  # (B,)
    return Batch(tensors)


class RecordLoader(PromptLoader):
    """`PromptLoader`'s resumable shuffled epochs over preference / SFT records."""

    def __init__(self, records: list[Record], batch_size: int, pad_token_id: int, *, shuffle=True, seed=0):
        if batch_size > len(records):
            raise DataError(
                f"data.train_batch_size={batch_size} is larger than the training set ({len(records)} rows); "
                f"use at most {len(records)}"
            )
        super().__init__(records, batch_size, pad_token_id, shuffle=shuffle, seed=seed)

    def next_batch(self) -> Batch:
        if self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        idx = self._order(self.epoch)[start : start + self.batch_size]
        self.position += 1
        return collate_records([self.records[i] for i in idx], self.pad_token_id)


def rm_pairs_from_samples(samples, output, *, pairs_per_prompt: int = 1, seed: int = 0) -> tuple[int, int]:
    """Reward-model pairs from scored samples (`hybridrl eval --n K --temperature T --output`: rows with
    `index`, `prompt`, `response`, `score`): for each prompt whose samples scored differently, up to
    `pairs_per_prompt` pairs of a best-scored response (chosen) and a worst-scored one (rejected), drawn
    without repeats. The prompt is the text the policy read (its chat template applied), so the reward
    model trains on the same text it scores during RL. Writes `output` (rm rows); returns (pairs, prompts).
    """
    import random

    from hybridrl.data.converters import write_rows

    groups: dict = {}
    for i, row in enumerate(read_rows(samples)):
        missing = [k for k in ("index", "prompt", "response", "score") if k not in row]
        if missing:
            raise DataError(f"{samples}, row {i}: missing {missing}; give the per-sample rows of `hybridrl eval --output`")
        groups.setdefault(row["index"], []).append(row)
    rng, pairs, used = random.Random(seed), [], 0
    for rows in groups.values():
        best, worst = max(r["score"] for r in rows), min(r["score"] for r in rows)
        if best == worst:
            continue
        chosen = sorted({r["response"] for r in rows if r["score"] == best})
        rejected = sorted({r["response"] for r in rows if r["score"] == worst})
        combos = [(c, r) for c in chosen for r in rejected]
        used += 1
        for c, r in rng.sample(combos, min(pairs_per_prompt, len(combos))):
            pairs.append({"prompt": rows[0]["prompt"], "chosen": c, "rejected": r})
    if not pairs:
        raise DataError(f"{samples}: no prompt has samples with different scores; sample more (--n) at a higher --temperature")
    rng.shuffle(pairs)
    write_rows(pairs, output)
    return len(pairs), used
