"""Prompt datasets (parquet / JSONL in verl's row format) and a resumable prompt loader.

A row: `{"prompt": [{"role": "user", "content": ...}] or "text", "data_source": str,
"reward_model": {"ground_truth": ...}, "extra_info": {...}}`. Every row is checked and
tokenized once, up front, so that a malformed row stops the run before any training happens,
with its file and index.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.chat_template import check_chat_template
from hybridrl.data.converters import read_rows
from hybridrl.data.errors import DataError

__all__ = ["DataError", "PromptLoader", "PromptRecord", "collate_prompts", "load_prompt_records", "render_prompt"]

TRUNCATION_MODES = ("error", "left", "right", "middle")
# Chat roles the templates of the Llama/Qwen family know; anything else is most often a typo
# ("User", "human", "gpt" from a ShareGPT export) that a template would silently drop or reject.
ROLES = ("system", "user", "assistant", "tool")

logger = logging.getLogger("hybridrl.data")


@dataclass
class PromptRecord:
    prompt_ids: list[int]
    raw_prompt: str
    data_source: str
    ground_truth: Any
    extra_info: dict
    chat: list | None = None  # the prompt's chat messages (None for a plain-string prompt): a reward model re-renders them


def render_prompt(tokenizer, prompt, tools: list[dict] | None = None) -> str:
    """Chat messages go through the tokenizer's chat template (with the tools' schemas when
    given: multi-turn hermes format); a plain string is used as is."""
    if isinstance(prompt, str):
        return prompt
    if getattr(tokenizer, "chat_template", None) is None:
        # No template (a base model): join the contents, the common fallback.
        return "\n".join(m["content"] for m in prompt)
    check_chat_template(tokenizer)  # once per template: it must not hang or flood the run (data/chat_template.py)
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False, **kwargs)


def check_text(text: str, where: str) -> str:
    """`text` unchanged, or a DataError when it cannot be written as UTF-8 (a lone surrogate such as
    "\\ud800", left by a broken JSON export), which the tokenizer would meet as a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(
            f"{where}: the text holds {text[e.start : e.end]!r} at character {e.start}, a lone UTF-16 surrogate that is not "
            "valid Unicode text; fix the row (re-export the file with valid UTF-8) or remove it"
        ) from None
    return text


def row_field(row: dict, key: str):
    """`row[key]`; a dotted key that is no column reaches into dict columns (`extra_info.question` is
    `row["extra_info"]["question"]`: verl's SFT `prompt_dict_keys`). None when it is not there.

    >>> row_field({"extra_info": {"question": "2+2?"}, "a.b": 1}, "extra_info.question"), row_field({"a.b": 1}, "a.b")
    ('2+2?', 1)
    """
    if key in row or "." not in key:
        return row.get(key)
    node = row
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def check_ground_truth(value: Any, where: str) -> None:
    """DataError when a ground truth (a value, or lists and mappings of them) holds NaN or an
    infinity (no answer compares equal to NaN: every reward would silently be 0) or text that is
    not valid Unicode (a lone surrogate)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise DataError(f"{where} holds {v}, which no answer can equal; give the answer as a finite number or a string")
        if isinstance(v, str):
            check_text(v, where)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, np.ndarray)):
            stack.extend(v.tolist() if isinstance(v, np.ndarray) else v)


def check_prompt(prompt, where: str):
    """A prompt cell (a string or a list of chat messages) as the loaders keep it, or a `DataError` at `where`."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{where}: the prompt is an empty string; remove the row or fill it in")
        return check_text(prompt, where)
    if isinstance(prompt, np.ndarray):  # parquet lists of structs come back as arrays
        prompt = list(prompt)
    if isinstance(prompt, list) and prompt:
        for j, msg in enumerate(prompt):
            if not isinstance(msg, dict) or "content" not in msg or "role" not in msg:
                raise DataError(f"{where}: prompt message {j} must be a dict with 'role' and 'content', got {msg!r:.120}")
            if not isinstance(msg["content"], str):
                raise DataError(f"{where}: prompt message {j} 'content' must be a string, got {msg['content']!r:.60}")
            if msg["role"] not in ROLES:
                raise DataError(f"{where}: prompt message {j} has role {msg['role']!r:.40}; use one of {', '.join(ROLES)}")
            if not msg["content"].strip() and not msg.get("tool_calls"):
                raise DataError(f"{where}: prompt message {j} ({msg['role']}) has empty content; fill it in or drop the message")
            check_text(msg["content"], f"{where}: prompt message {j}")
        return [dict(m) for m in prompt]
    raise DataError(f"{where}: the prompt must be a string or a non-empty list of chat messages, got {prompt!r:.120}")


def _data_source(row: dict, key: str, where: str) -> str:
    """The scorer's name; an integer id (a common export artefact) is accepted as its string."""
    source = row.get(key)
    if isinstance(source, (int, np.integer)) and not isinstance(source, bool):
        return str(source)
    if source is None:
        raise DataError(f"{where}: missing {key!r} (data.reward_fn_key), which picks the reward function; row has {sorted(row)}")
    if not isinstance(source, str) or not source:
        raise DataError(f"{where}: {key!r} (data.reward_fn_key) must be a non-empty string naming the scorer, got {source!r:.60}")
    return source


def _extra_info(row: dict, where: str) -> dict:
    extra = row.get("extra_info")
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise DataError(
            f"{where}: 'extra_info' must be a mapping (a JSON object) or absent, got {type(extra).__name__} {extra!r:.60}"
        )
    return dict(extra)


def load_prompt_records(
    files,
    tokenizer,
    *,
    prompt_key: str = "prompt",
    reward_fn_key: str = "data_source",
    max_prompt_length: int,
    truncation: str = "error",
    require_ground_truth=lambda data_source: True,
    max_rows: int | None = None,
    filter_overlong: bool = False,
    tools: list[dict] | None = None,
) -> list[PromptRecord]:
    """Read, check and tokenize every row of `files` (a path or list of paths).

    A prompt over `max_prompt_length` tokens is dropped when `filter_overlong` (the count is
    logged, as data.filter_overlong_prompts asks), else cut per `truncation`. `tools`: function
    schemas the chat template shows the model (multi-turn, hermes format).
    """
    if truncation not in TRUNCATION_MODES:
        raise DataError(f"data.truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")
    files = [files] if isinstance(files, str) else list(files)
    records: list[PromptRecord] = []
    dropped = 0
    for path in files:
        rows = read_rows(path)
        for i, row in enumerate(rows):
            if max_rows is not None and len(records) >= max_rows:
                return records
            where = f"{path}, row {i}"
            if not isinstance(row, dict):
                raise DataError(f"{where}: a row must be a mapping, got {type(row).__name__}")
            prompt = row_field(row, prompt_key)
            if prompt is None:
                raise DataError(f"{where}: missing the prompt field {prompt_key!r} (data.prompt_key); row has {sorted(row)}")
            prompt = check_prompt(prompt, where)
            source = _data_source(row, reward_fn_key, where)
            reward_model = row.get("reward_model") or {}
            ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
            if ground_truth is None and require_ground_truth(source):
                raise DataError(f"{where}: missing reward_model.ground_truth, which the {source!r} scorer needs")
            check_ground_truth(ground_truth, f"{where}: reward_model.ground_truth")
            text = check_text(render_prompt(tokenizer, prompt, tools), where)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > max_prompt_length and filter_overlong:
                dropped += 1
                continue
            if len(ids) > max_prompt_length:
                if truncation == "error":
                    raise DataError(
                        f"{where}: prompt has {len(ids)} tokens > data.max_prompt_length={max_prompt_length}; "
                        f"raise it, set data.truncation=left|right|middle, or drop such prompts with "
                        f"data.filter_overlong_prompts=true"
                    )
                ids = truncate(ids, max_prompt_length, truncation)
                text = tokenizer.decode(ids)  # what the model sees, for samples.jsonl and eval outputs
            chat = None if isinstance(prompt, str) else list(prompt)
            records.append(PromptRecord(ids, text, source, ground_truth, _extra_info(row, where), chat))
    if dropped:
        logger.warning(
            "data: dropped %d prompt(s) longer than data.max_prompt_length=%d tokens from %s "
            "(data.filter_overlong_prompts=true); %d remain",
            dropped,
            max_prompt_length,
            files,
            len(records),
        )
    if not records:
        if dropped:
            raise DataError(
                f"every prompt in {files} is longer than data.max_prompt_length={max_prompt_length} tokens and "
                f"data.filter_overlong_prompts=true dropped them all; raise data.max_prompt_length"
            )
        raise DataError(f"{', '.join(map(str, files))}: no rows (the file is empty); give a file with at least one row")
    return records


def truncate(ids: list[int], max_length: int, truncation: str) -> list[int]:
    """Cut a token list to `max_length`: keep the last (left), first (right), or the first half and
    the last half (middle: the first max_length // 2 and the last max_length - max_length // 2).

    >>> truncate([1, 2, 3, 4, 5, 6, 7], 4, "middle")
    [1, 2, 6, 7]
    >>> truncate([1, 2, 3, 4, 5, 6, 7], 3, "middle")
    [1, 6, 7]
    """
    if truncation == "left":
        return ids[-max_length:]
    if truncation == "right":
        return ids[:max_length]
    head = max_length // 2
    return ids[:head] + ids[len(ids) - (max_length - head) :]


def collate_prompts(records: list[PromptRecord], pad_token_id: int, uids: list[str]) -> Batch:
    """Left-pad prompts into a Batch (the layout generation wants)."""
    width = max(len(r.prompt_ids) for r in records)
    ids = torch.full((len(records), width), pad_token_id, dtype=torch.long)  # (B, P)
    mask = torch.zeros((len(records), width), dtype=torch.long)
    for i, r in enumerate(records):
        n = len(r.prompt_ids)
        ids[i, width - n :] = torch.tensor(r.prompt_ids, dtype=torch.long)
        mask[i, width - n :] = 1
    return Batch(
        {K.PROMPTS: ids, K.PROMPT_MASK: mask},
        {
            K.UID: uids,
            K.DATA_SOURCE: [r.data_source for r in records],
            K.GROUND_TRUTH: [r.ground_truth for r in records],
            K.EXTRA_INFO: [r.extra_info for r in records],
            K.RAW_PROMPT: [r.raw_prompt for r in records],
            K.RAW_CHAT: [r.chat for r in records],
        },
        {K.PAD_TOKEN_ID: pad_token_id},
    )


class PromptLoader:
    """Shuffled epochs of fixed-size prompt batches, resumable from `state_dict()`.

    The order of epoch e is a permutation drawn from `seed + e` alone, so the position
    (epoch, batch index) is all a checkpoint needs to continue with the very same batches.
    The last incomplete batch of an epoch is dropped (as verl does) so every step has
    `batch_size` prompts.
    """

    def __init__(self, records: list[PromptRecord], batch_size: int, pad_token_id: int, *, shuffle=True, seed=0):
        if batch_size > len(records):
            raise DataError(
                f"data.train_batch_size={batch_size} is larger than the training set ({len(records)} prompts); "
                f"use at most {len(records)}"
            )
        self.records, self.batch_size, self.pad_token_id = records, batch_size, pad_token_id
        self.shuffle, self.seed = shuffle, seed
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.records) // self.batch_size

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.records))
        return np.random.default_rng(self.seed + epoch).permutation(len(self.records))

    def next_batch(self) -> Batch:
        if self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        order = self._order(self.epoch)
        start = self.position * self.batch_size
        idx = order[start : start + self.batch_size]
        self.position += 1
        uids = [f"e{self.epoch}-p{int(i)}" for i in idx]
        return collate_prompts([self.records[i] for i in idx], self.pad_token_id, uids)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
