"""Reward functions written for TRL's GRPOTrainer, scored as one batched reward function.

TRL's form is batched and reads the dataset's columns by name:

    def reward(prompts, completions, **columns) -> list[float | None]

`prompts[i]` is the row's prompt as given (a string, or chat messages); `completions[i]` is the
model's text, or `[{"role": "assistant", "content": text}]` when the prompt is chat messages;
every other column of the row arrives as a keyword holding one value per completion. Several
functions are summed with `weights` (default 1 each); a `None` entry (the function does not
apply to that sample) counts as 0 in the sum, as TRL's nansum does. `async def` functions of one
batch run concurrently.

The rows reach the scorer through hybridrl's verl-format data: `trl_row` puts the prompt and
the columns under `extra_info["trl"]`, and `TRLRewards` reads them back from there.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .pool import WorkerPool
from .scorer import function_name

# Names TRL passes besides the columns; hybridrl passes prompts and completions.
_TRL_ARGS = ("prompts", "completions")
_NOT_PASSED = {
    "completion_ids": "hybridrl passes completion text only; tokenize `completions` in the function",
    "trainer_state": "hybridrl passes no trainer state; read the step from a callback (on_step_end)",
}
EXTRA_KEY = "trl"


def is_trl_reward(fn: Any) -> bool:
    """A function in TRL's form: it takes `completions` (by name, or through **kwargs with `prompts`).

    >>> is_trl_reward(lambda prompts, completions, **kw: [0.0] * len(completions))
    True
    >>> is_trl_reward(lambda data_source, solution_str, ground_truth, extra_info: 0.0)
    False
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "completions" in params


def _accepts(fn: Callable) -> tuple[set[str], set[str], bool]:
    """(required keyword names, optional ones, whether it takes **kwargs), prompts/completions excluded."""
    required, optional, var = set(), set(), False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            var = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in _TRL_ARGS:
            (required if p.default is p.empty else optional).add(p.name)
    return required, optional, var


def trl_row(row: Mapping, default_source: str = "reward_fn") -> dict:
    """A TRL dataset row -> a hybridrl (verl-format) row carrying the prompt and every column.

    >>> trl_row({"prompt": "2+2=", "answer": "4"})
    {'prompt': '2+2=', 'data_source': 'reward_fn', 'extra_info': {'trl': {'prompt': '2+2=', 'columns': {'answer': '4'}}}}
    """
    columns = {k: v for k, v in row.items() if k != "prompt"}
    source = row.get("data_source")
    return {
        "prompt": row.get("prompt"),
        "data_source": source if isinstance(source, str) and source else default_source,
        "extra_info": {EXTRA_KEY: {"prompt": row.get("prompt"), "columns": columns}},
    }


class TRLRewards:
    """One or several TRL-form reward functions as one batched hybridrl reward function.

    Called by the `batch` reward manager with verl's lists; returns one dict per completion:
    `score` (the weighted sum) and each function's own value under its name (logged as
    `reward/<name>/mean`).

    >>> def exact(prompts, completions, answer, **kw):
    ...     return [float(c.strip() == a) for c, a in zip(completions, answer)]
    >>> def short(prompts, completions, **kw):
    ...     return [-0.1 * len(c) for c in completions]
    >>> rewards = TRLRewards([exact, short], weights=[1.0, 0.5])
    >>> rows = [trl_row({"prompt": "2+2=", "answer": "4"})] * 2
    >>> rewards(["reward_fn"] * 2, ["4", "5"], [None] * 2, [r["extra_info"] for r in rows])
    [{'score': 0.95, 'exact': 1.0, 'short': -0.1}, {'score': -0.05, 'exact': 0.0, 'short': -0.1}]
    """

    batched = True  # called once per batch with lists, in the worker pool (`BatchScorer`, hybridrl/rewards/scorer.py)

    def __init__(self, funcs: Sequence[Callable], weights: Sequence[float] | None = None):
        funcs = list(funcs)
        if not funcs:
            raise ValueError("reward_funcs: give at least one reward function")
        for f in funcs:
            if isinstance(f, str):
                raise ValueError(
                    f"reward function {f!r}: a model id as a reward is TRL's; pass the model as reward_models=[model] "
                    f"(a sequence classifier), or a function"
                )
            if not callable(f):
                raise ValueError(f"reward function: expected a function, got {type(f).__name__}")
        if weights is None:
            weights = [1.0] * len(funcs)
        weights = [float(w) for w in weights]
        if len(weights) != len(funcs):
            raise ValueError(f"reward_weights has {len(weights)} weights for {len(funcs)} reward functions; give one each")
        names = [function_name(f) for f in funcs]
        self.names = [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]
        self.funcs, self.weights = funcs, weights
        self.__name__ = "+".join(self.names)

    def check_columns(self, columns: set[str], where: str) -> None:
        """Every name a function requires is a column, and every column reaches some function."""
        wanted_by_any, takes_all = set(), False
        for name, f in zip(self.names, self.funcs):
            required, optional, var = _accepts(f)
            for missing in sorted(required - columns):
                why = _NOT_PASSED.get(missing, f"the rows have no column {missing!r} (columns: {sorted(columns)})")
                raise ValueError(f"reward function {name} takes {missing!r}, but {why}; add the column or give it a default")
            wanted_by_any |= required | optional
            takes_all |= var
        unused = sorted(columns - wanted_by_any) if not takes_all else []
        if unused:
            raise ValueError(
                f"{where}: column(s) {unused} reach no reward function ({', '.join(self.names)} take "
                f"{sorted(wanted_by_any) or 'no columns'}); add **kwargs to a reward function or drop the column(s)"
            )

    def __call__(self, data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> list[dict]:
        n = len(solution_strs)
        rows = [(info or {}).get(EXTRA_KEY) for info in extra_infos]
        if any(r is None for r in rows):
            raise ValueError("a TRL-form reward function needs rows converted by hybridrl.rewards.trl.trl_row")
        prompts = [r["prompt"] for r in rows]
        completions = [s if isinstance(p, str) else [{"role": "assistant", "content": s}] for p, s in zip(prompts, solution_strs)]
        columns = {k: [r["columns"].get(k) for r in rows] for k in dict.fromkeys(k for r in rows for k in r["columns"])}
        values = self._call_all(prompts, completions, columns, kwargs)
        out = []
        for i in range(n):
            total, sample = 0.0, {}
            for name, w, vals in zip(self.names, self.weights, values):
                v = vals[i]
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    continue  # this function does not apply to this sample: 0 in the sum (TRL's nansum)
                sample[name] = float(v)
                total += w * float(v)
            out.append({"score": total, **sample})
        return out

    def _call_all(self, prompts, completions, columns, kwargs) -> list[list]:
        results: list = [None] * len(self.funcs)
        pending = []
        for j, f in enumerate(self.funcs):
            args = self._arguments(f, columns, kwargs)
            if inspect.iscoroutinefunction(f):
                pending.append((j, f(prompts=prompts, completions=completions, **args)))
            else:
                results[j] = f(prompts=prompts, completions=completions, **args)
        if pending:
            for (j, _), value in zip(pending, _run_coroutines([c for _, c in pending])):
                results[j] = value
        for name, vals in zip(self.names, results):
            if isinstance(vals, (str, bytes)) or not isinstance(vals, Sequence) and not hasattr(vals, "tolist"):
                raise ValueError(
                    f"reward function {name} returned {type(vals).__name__}; return a list of floats, one per completion"
                )
            if len(vals) != len(prompts):
                raise ValueError(f"reward function {name} returned {len(vals)} values for {len(prompts)} completions")
        return [list(v.tolist() if hasattr(v, "tolist") else v) for v in results]

    @staticmethod
    def _arguments(f: Callable, columns: dict, kwargs: dict) -> dict:
        _, _, var = _accepts(f)
        if var:
            return {**columns, **kwargs}
        names = set(inspect.signature(f).parameters)
        return {k: v for k, v in {**columns, **kwargs}.items() if k in names}

    def probe(self, row: Mapping, timeout_s: float = 10.0, memory_limit_mb: int | None = None) -> None:
        """Call every function once on one converted row before any model work, so that a wrong
        signature or a bug fails in one line at start (in training, a failing batch scores 0). The
        call is isolated as in training (a forked worker, `timeout_s`, `memory_limit_mb`): one that
        hangs, exits or runs out of memory fails here too, in one line."""
        info = row["extra_info"][EXTRA_KEY]
        columns = info["columns"]
        guess = next((str(v) for k, v in columns.items() if isinstance(v, (str, int, float))), "")
        call = dict(
            data_sources=[row["data_source"]], solution_strs=[guess], ground_truths=[None], extra_infos=[row["extra_info"]]
        )
        with WorkerPool(self, kind="fork", num_workers=1, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb) as pool:
            outcome = pool.map([call])[0]
        if outcome.error is not None:
            last = (outcome.error.strip().splitlines() or ["failed"])[-1]
            raise ValueError(
                f"reward function(s) {self.__name__} on the first row (completion {guess!r}) failed: "
                f"{last}; TRL's form is f(prompts, completions, **columns) -> list[float]"
            )


def _run_coroutines(coros: list) -> list:
    """Run the coroutines concurrently to the end, also from a thread whose event loop runs (Jupyter)."""

    async def together():
        return await asyncio.gather(*coros)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(together())
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(together())
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
