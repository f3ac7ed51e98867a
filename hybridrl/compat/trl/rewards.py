"""TRL's reward functions and rows for the Python API: `f(prompts, completions, **columns) -> list[float]`
(one, or a list summed with `reward_weights`) over rows `{"prompt": text or chat messages, <any columns>}`.

The functions become one `hybridrl.rewards.trl.TRLRewards`, and each row carries its columns to them
untouched (`trl_row`). A lone function of hybridrl's own form, `(data_source, solution_str, ground_truth,
extra_info)`, is kept as it is (hybridrl/inputs.py gives its rows a data_source).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hybridrl import inputs


def adapt_reward(reward: Any, weights: Sequence[float] | None, train_data: Any, val_data: Any, what: str = "reward_fn"):
    """(reward function for the trainer, train rows, val rows). Raises ValueError with the one line to show."""
    from hybridrl.rewards.trl import TRLRewards, is_trl_reward

    if reward is None:
        if weights is not None:
            raise ValueError("reward_weights without reward functions; pass reward_funcs=[f, g] with them")
        return None, train_data, val_data
    funcs = list(reward) if isinstance(reward, (list, tuple)) else [reward]
    trl = [f for f in funcs if is_trl_reward(f)]
    if len(funcs) == 1 and not trl:  # hybridrl's (and verl's) form: (data_source, solution_str, ground_truth, extra_info)
        if weights is not None:
            raise ValueError("reward_weights weighs several TRL-form functions f(prompts, completions, **columns)")
        fn = funcs[0]
        return fn, inputs.with_source(train_data, "train_data", fn), inputs.with_source(val_data, "val_data", fn)
    if len(trl) != len(funcs):
        names = [getattr(f, "__name__", "?") for f in funcs if f not in trl]
        raise ValueError(
            f"{what}: several reward functions must all take TRL's form f(prompts, completions, **columns); "
            f"{', '.join(names)} do(es) not"
        )
    rewards = TRLRewards(funcs, weights)
    converted = []
    for name, data in (("train_data", train_data), ("val_data", val_data)):
        rows = None if data is None else [_trl_row(r, name, i) for i, r in enumerate(inputs.rows(data, name))]
        if rows is not None:
            rewards.check_columns({k for r in rows for k in r["extra_info"]["trl"]["columns"]}, name)
        converted.append(rows)
    return rewards, converted[0], converted[1]


def _trl_row(row: Any, name: str, i: int) -> dict:
    from hybridrl.rewards.trl import trl_row

    if not isinstance(row, Mapping) or "prompt" not in row:
        got = sorted(row) if isinstance(row, Mapping) else type(row).__name__
        raise ValueError(f"{name}, row {i}: a row needs a 'prompt' column (text or chat messages); got {got}")
    return trl_row(row)
