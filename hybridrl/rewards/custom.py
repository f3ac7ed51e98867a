"""Load a user's reward function from a Python file (``custom_reward_function.path``)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Callable


def load_custom_reward_fn(path: str, name: str = "compute_score") -> Callable:
    """Import the file at ``path`` and return its callable ``name``.

    The function is called as ``fn(data_source=..., solution_str=...,
    ground_truth=..., extra_info=...)`` and returns a float or a dict with a
    numeric ``"score"``.

    The module is registered in ``sys.modules`` under a name derived from the
    absolute path: dataclasses and pickling (e.g. to ship the function to a
    worker process) look a function's module up there by name.
    """
    if not path:
        raise ValueError("custom_reward_function.path is empty; give the path of a Python file")
    full = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(full):
        raise FileNotFoundError(f"custom reward file not found: {path!r} (resolved to {full}); check custom_reward_function.path")

    digest = hashlib.sha1(full.encode()).hexdigest()[:12]
    module_name = f"hybridrl_custom_reward_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, full)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {full} as Python (custom_reward_function.path); expected a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    cwd = os.getcwd()
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    finally:
        # A module that changes directory at import would move every relative path of the run
        # (model.path, data files, the run directory) under the trainer's feet.
        if os.getcwd() != cwd:
            os.chdir(cwd)

    if not hasattr(module, name):
        defined = sorted(
            attr for attr, value in vars(module).items() if callable(value) and getattr(value, "__module__", None) == module_name
        )
        raise AttributeError(
            f"{full} defines no {name!r} (custom_reward_function.name); "
            f"callables defined there: {', '.join(defined) if defined else 'none'}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(
            f"{name!r} in {full} is a {type(fn).__name__}, not a function; custom_reward_function.name must name a callable"
        )
    return fn
