"""Checks on the names and files a config points at, run by `validate` (so `explain` and `train`
give one verdict): run names that stay inside the runs folder.
"""

from __future__ import annotations

from typing import Any


def file_problems(cfg: Any, problem: type) -> list:
    """Every problem found here, as `problem(message, keys)` (validate.Problem)."""
    return _run_name_problems(cfg, problem)


def _run_name_problems(cfg: Any, problem: type) -> list:
    out = []
    for name in ("project_name", "experiment_name"):
        value, key = getattr(cfg.trainer, name), f"trainer.{name}"
        # One path component, so that runs/<project_name>/<experiment_name> stays inside runs/.
        if not isinstance(value, str) or value in ("", ".", "..") or any(c in value for c in "/\\\0"):
            out.append(
                problem(
                    f"{key}={value!r} must be one plain name (no '/', not '.' or '..'): the run is written to "
                    "runs/<project_name>/<experiment_name>; to write elsewhere set trainer.default_local_dir",
                    (key,),
                )
            )
    return out
