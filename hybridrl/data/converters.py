"""Turn raw datasets into prompt files in verl's row format, and make the
quickstart arithmetic task.

A row is ``{"data_source", "prompt": [chat messages], "ability",
"reward_model": {"style", "ground_truth"}, "extra_info": {...}}``; files are
JSONL or parquet, chosen by extension, so verl's prepared parquet files load
here unchanged and ours load there.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from hybridrl.data.errors import DataError, DataFileNotFound

GSM8K_INSTRUCTION = ' Let\'s think step by step and output the final answer after "####".'

_SUFFIXES = (".jsonl", ".parquet")

# GSM8K reference solutions end with "#### <number>"; the same pattern the
# reward extracts from responses, so the two always agree on the format.
_GSM8K_ANSWER = re.compile(r"#### (-?[0-9.,]+)")


def _suffix(path: str | os.PathLike) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        hint = " (convert it, e.g. pandas.read_csv(f).to_parquet(...))" if suffix in (".csv", ".tsv") else ""
        hint = hint or (" (one JSON object per line: rename it .jsonl)" if suffix == ".json" else "")
        raise DataError(
            f"{os.fspath(path)}: unsupported file type {suffix or '(none)'!r}; use one of {', '.join(_SUFFIXES)}{hint}"
        )
    return suffix


def write_rows(rows: Iterable[dict[str, Any]], path: str | os.PathLike) -> int:
    """Write dict rows to ``.jsonl`` or ``.parquet``; create the parent
    directory. Returns the number of rows."""
    suffix = _suffix(path)
    rows = list(rows)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".jsonl":
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows)


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read the rows of a ``.jsonl`` or ``.parquet`` file as dicts.

    Raises DataError naming the file (and line) for a missing, unreadable, non-UTF-8, truncated
    or corrupt file. A UTF-8 byte-order mark is valid and skipped.
    """
    name = os.fspath(path)
    suffix = _suffix(path)
    if not os.path.exists(path):
        raise DataFileNotFound(f"{name}: data file not found; check the path (relative paths start from {os.getcwd()})")
    if os.path.isdir(path):
        raise DataError(f"{name}: is a directory, not a data file; give the .jsonl or .parquet file inside it")
    if not os.path.isfile(path):  # a FIFO would block the read, a device never end it
        raise DataError(f"{name}: is not a regular file (a FIFO or a device); give a .jsonl or .parquet file")
    if suffix == ".parquet":
        return _read_parquet(name)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"{name}: cannot read the data file ({e.strerror or e}); check its permissions") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        lineno = data[: e.start].count(b"\n") + 1
        raise DataError(
            f"{name}:{lineno}: not valid UTF-8 (byte {data[e.start]:#04x} at offset {e.start}); "
            "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    rows = []
    lines = text.split("\n")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if lineno == len(lines) and not text.endswith("\n"):
                raise DataError(
                    f"{name}:{lineno}: the last line is cut off (invalid JSON: {e.msg}, and no newline at "
                    "the end): the file looks truncated, e.g. by an interrupted copy; re-create it or "
                    "delete that line"
                ) from None
            raise DataError(
                f"{name}:{lineno}: invalid JSON ({e.msg}, column {e.colno}); each line must be one JSON object"
            ) from None
        except RecursionError:
            raise DataError(f"{name}:{lineno}: JSON nested too deep to be a row; each line must be one JSON object") from None
        except ValueError as e:  # an integer of more digits than Python converts (4,300)
            raise DataError(f"{name}:{lineno}: {e}; write such a number as a string") from None
    return rows


def _read_parquet(name: str) -> list[dict[str, Any]]:
    if os.path.getsize(name) == 0:
        raise DataError(f"{name}: empty file (0 bytes), not a parquet file; re-create it")
    try:
        return pq.read_table(name).to_pylist()
    except (pa.ArrowException, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(
            f"{name}: not a readable parquet file ({first}); re-create it, "
            "e.g. with `hybridrl data` or pandas.DataFrame.to_parquet"
        ) from None


def _guess_split(path: str | os.PathLike) -> str:
    name = Path(path).name.lower()
    return "test" if "test" in name else "train"


# The system message of the tool recipe (`--tools python`): the model may run code in the code
# format of the agent loop (multi_turn.format=code), sees what it prints, then answers.
GSM8K_TOOL_SYSTEM = (
    "You are a helpful assistant that solves math problems. You can run Python: write code in a ```python "
    "block and print() what you need; you will see its output before you answer. Finish with the final "
    "answer on its own line as '#### <number>'."
)
GSM8K_TOOLS = ("python",)
GSM8K_INTERACTIONS = ("gsm8k",)


def _gsm8k_row(
    record: Any, index: int, split: str, where: str, tools: tuple[str, ...] = (), interaction: str | None = None
) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in ("question", "answer"):
        if not isinstance(record.get(key), str):
            raise ValueError(f"{where}: missing string field {key!r}")
    question, answer = record["question"], record["answer"]
    match = _GSM8K_ANSWER.search(answer)
    if match is None:
        raise ValueError(f"{where}: 'answer' has no final '#### <number>'")
    truth = match.group(1).replace(",", "")
    prompt = [{"role": "user", "content": question + GSM8K_INSTRUCTION}]
    extra = {"split": split, "index": index, "answer": answer, "question": question}
    if tools:  # verl's multi-turn row fields: per-tool creation arguments
        prompt.insert(0, {"role": "system", "content": GSM8K_TOOL_SYSTEM})
        extra["need_tools_kwargs"] = True
        extra["tools_kwargs"] = {t: {"create_kwargs": {"ground_truth": truth}} for t in tools}
    if interaction:
        extra["interaction_kwargs"] = {"name": interaction, "query": question, "ground_truth": truth}
    return {
        "data_source": "openai/gsm8k",
        "prompt": prompt,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": extra,
    }


def convert_gsm8k(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    split: str | None = None,
    tools: tuple[str, ...] | list[str] = (),
    interaction: str | None = None,
) -> int:
    """Convert GSM8K JSONL (``{"question", "answer": "... #### 72"}`` per line)
    into prompt rows at ``output_path`` (.jsonl or .parquet). ``split`` defaults
    to "test" if the input file name contains "test", else "train". Returns the
    number of rows written.

    ``tools=("python",)``: the multi-turn tool recipe's rows (a system message that offers a
    ```python block, ``extra_info.tools_kwargs``); ``interaction="gsm8k"``: rows for the gsm8k
    interaction (``extra_info.interaction_kwargs``), verl's multi-turn row shapes."""
    _suffix(output_path)  # fail on a bad extension before reading anything
    tools = tuple(tools)
    for t in tools:
        if t not in GSM8K_TOOLS:
            raise ValueError(f"--tools {t}: the GSM8K recipe knows the tool(s) {', '.join(GSM8K_TOOLS)}")
    if interaction is not None and interaction not in GSM8K_INTERACTIONS:
        raise ValueError(f"--interaction {interaction}: the GSM8K recipe knows {', '.join(GSM8K_INTERACTIONS)}")
    split = split or _guess_split(input_path)
    rows = []
    with open(input_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{os.fspath(input_path)}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e})") from None
            rows.append(_gsm8k_row(record, len(rows), split, where, tools, interaction))
    return write_rows(rows, output_path)


_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


def make_arith(
    output_dir: str | os.PathLike,
    n_train: int = 1000,
    n_test: int = 200,
    seed: int = 0,
    max_operand: int = 49,
    *,
    ops: str = "+",
    n_sft: int = 1000,
) -> dict[str, str]:
    """Write the quickstart task: prompts like ``"37+45="`` with operands in
    ``0..max_operand`` and operators from ``ops`` ("+", "-" or "+-").

    Three JSONL files with no problem in common: ``sft.jsonl`` (rows also carry
    ``response``, the bare answer, for a supervised warm-up; the tokenizer adds
    EOS), ``train.jsonl`` (RL prompts) and ``test.jsonl``. The same seed gives
    the same files. Returns ``{"sft": path, "train": path, "test": path}``.
    """
    if not ops or set(ops) - set(_OPS):
        raise ValueError(f"ops must be made of {''.join(_OPS)!r}, got {ops!r}")
    ops = "".join(dict.fromkeys(ops))
    counts = {"sft": n_sft, "train": n_train, "test": n_test}
    if min(counts.values()) < 0 or max_operand < 0:
        raise ValueError(f"sizes and max_operand must be >= 0, got {counts}, {max_operand}")
    side = max_operand + 1
    space = side * side * len(ops)
    total = sum(counts.values())
    if total > space:
        raise ValueError(
            f"asked for {total} distinct problems but only {space} exist with "
            f"max_operand={max_operand} and ops={ops!r}; raise max_operand or lower the sizes"
        )

    # Sampling problem ids without replacement is what makes the splits disjoint.
    ids = iter(random.Random(seed).sample(range(space), total))
    paths = {}
    for split, count in counts.items():
        rows = []
        for index in range(count):
            op_index, rest = divmod(next(ids), side * side)
            a, b = divmod(rest, side)
            op = ops[op_index]
            answer = str(_OPS[op](a, b))
            row = {
                "data_source": "arith",
                "prompt": [{"role": "user", "content": f"{a}{op}{b}="}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index},
            }
            if split == "sft":
                row["response"] = answer
            rows.append(row)
        path = os.path.join(os.fspath(output_dir), f"{split}.jsonl")
        write_rows(rows, path)
        paths[split] = path
    return paths


def make_arith_preferences(
    output_dir: str | os.PathLike,
    n: int = 1000,
    seed: int = 0,
    max_operand: int = 49,
) -> dict[str, str]:
    """Write a synthetic preference set from the arithmetic task, one problem per row
    (``"37+45="``, operands in ``0..max_operand``):

    - ``pairs.jsonl``: DPO rows, ``chosen`` the correct sum, ``rejected`` a wrong one (the sum
      off by 1 to 9, so that the two always differ in the last digit, which the model can learn to check);
    - ``kto.jsonl``: KTO rows, each problem once with its correct sum (``label: true``) and once
      with the wrong one (``label: false``), shuffled;
    - ``sft.jsonl``: SFT rows as chat ``messages`` ending with the assistant's correct sum.

    Prompts are chat messages, completions plain strings. Returns ``{"pairs", "kto", "sft"}`` paths.
    """
    side = max_operand + 1
    if not 0 < n <= side * side:
        raise ValueError(f"n must be in 1..{side * side} with max_operand={max_operand}, got {n}")
    rng = random.Random(seed)
    pairs, kto, sft = [], [], []
    for problem in rng.sample(range(side * side), n):
        a, b = divmod(problem, side)
        prompt = [{"role": "user", "content": f"{a}+{b}="}]
        right = a + b
        wrong = right + rng.choice([d for d in range(-9, 10) if d != 0 and right + d >= 0])
        pairs.append({"prompt": prompt, "chosen": str(right), "rejected": str(wrong)})
        kto += [
            {"prompt": prompt, "completion": str(right), "label": True},
            {"prompt": prompt, "completion": str(wrong), "label": False},
        ]
        sft.append({"messages": [*prompt, {"role": "assistant", "content": str(right)}]})
    rng.shuffle(kto)
    paths = {}
    for name, rows in (("pairs", pairs), ("kto", kto), ("sft", sft)):
        paths[name] = os.path.join(os.fspath(output_dir), f"{name}.jsonl")
        write_rows(rows, paths[name])
    return paths
