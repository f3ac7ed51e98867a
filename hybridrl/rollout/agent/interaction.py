"""Interactive environments: an `Interaction` plays the user's turn of a multi-turn rollout.

After each model turn that calls no tool, the agent loop asks the trajectory's interaction for
the next user message (`respond`): it returns the text, whether the conversation is over, and
a reward that adds to the trajectory's score. Configured by verl's `interaction_config_path`
shape:

    interaction:
      - name: gsm8k                 # what data rows name in extra_info.interaction_kwargs.name
        class_name: gsm8k           # a registered interaction, or a dotted path pkg.module.Class
        config: {max_retries: 1}

A row picks its interaction by `extra_info.interaction_kwargs.name` (the only one configured
when it names none). verl's `verl.interactions.gsm8k_interaction.Gsm8kInteraction` maps to the
`gsm8k` example below; other verl class paths are refused with the registered names.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from hybridrl.config import yamlio

_INTERACTIONS: dict[str, type["Interaction"]] = {}
VERL_ALIASES = {"verl.interactions.gsm8k_interaction.Gsm8kInteraction": "gsm8k"}


@dataclass
class InteractionTurn:
    text: str  # the next user message ("" when done)
    done: bool  # end the trajectory (no more model turns)
    reward: float = 0.0  # added to the trajectory's final reward
    metrics: dict[str, float] = field(default_factory=dict)


class Interaction:
    """Subclass and implement `respond`. `state` is one dict per trajectory: it starts with the
    row's `ground_truth`, `data_source`, `extra_info` and `interaction_kwargs`, and the interaction
    may keep its own fields in it. `messages` holds the conversation after the prompt
    ({"role": "assistant" | "tool" | "user", "content": str}); the last one is the model's turn."""

    name: str = ""

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = dict(config or {})

    async def start(self, state: dict[str, Any]) -> None:
        """Once per trajectory, before its first turn."""

    async def respond(self, messages: list[dict[str, str]], state: dict[str, Any]) -> InteractionTurn:
        raise NotImplementedError

    async def finish(self, state: dict[str, Any]) -> None:
        """Once, when the trajectory ends."""


def register_interaction(name: str) -> Callable[[type[Interaction]], type[Interaction]]:
    """Class decorator: make an Interaction subclass available by `name` in interaction configs."""

    def wrap(cls: type[Interaction]) -> type[Interaction]:
        if not (isinstance(cls, type) and issubclass(cls, Interaction)):
            raise TypeError(f"@register_interaction({name!r}) expects a subclass of Interaction, got {cls!r}")
        if name in _INTERACTIONS and _INTERACTIONS[name] is not cls:
            raise ValueError(f"interaction name {name!r} is already registered by {_INTERACTIONS[name].__qualname__}")
        cls.name = cls.name or name
        _INTERACTIONS[name] = cls
        return cls

    return wrap


def registered_interactions() -> dict[str, type[Interaction]]:
    return dict(_INTERACTIONS)


def load_interaction_config(path: str | Path) -> dict[str, Interaction]:
    """Name -> constructed interaction, from a config file; ValueError naming the file, the
    entry and the fix for anything malformed."""
    path = Path(path)
    try:
        doc = yamlio.load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("interaction"), list) or not doc["interaction"]:
        raise ValueError(f"{path}: an interaction config is a mapping with an `interaction:` list ([{{name, class_name}}])")
    out: dict[str, Interaction] = {}
    for i, entry in enumerate(doc["interaction"]):
        where = f"{path}, interaction[{i}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ValueError(f"{where}: each entry is a mapping with name, class_name and (optionally) config")
        unknown = sorted(set(entry) - {"name", "class_name", "config"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; an entry has name, class_name and config")
        cls = _interaction_class(entry["class_name"], where)
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"{where}: config must be a mapping")
        name = entry.get("name") or cls.name
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: name must be a non-empty string")
        if name in out:
            raise ValueError(f"{where}: a second interaction named {name!r}; names must differ")
        try:
            out[name] = cls(config)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
    return out


def _interaction_class(name: Any, where: str) -> type[Interaction]:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: class_name must be a string")
    name = VERL_ALIASES.get(name, name)
    if name in _INTERACTIONS:
        return _INTERACTIONS[name]
    known = ", ".join(sorted(_INTERACTIONS))
    if name.startswith("verl."):
        raise ValueError(f"{where}: {name!r} is verl's and cannot run here; use one of hybridrl's ({known}) or your own")
    module, _, attr = name.rpartition(".")
    if not module:
        raise ValueError(f"{where}: unknown interaction {name!r}; registered: {known}, or give pkg.module.Class")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{where}: cannot import {name!r} ({type(e).__name__}: {e})") from None
    if not (isinstance(cls, type) and issubclass(cls, Interaction)):
        raise ValueError(f"{where}: {name!r} is not a subclass of hybridrl.rollout.agent.interaction.Interaction")
    return cls


@register_interaction("gsm8k")
class GSM8KInteraction(Interaction):
    """A teacher for GSM8K. After each answer (a model turn without a tool call) it checks the
    `#### N` answer against the row's ground truth (hybridrl.rewards.gsm8k, strict): right ends
    the conversation with reward 1; wrong gets feedback asking to re-check and answer again, and
    after `max_retries` wrong answers (default 1) the conversation ends with reward 0. The
    interaction's reward is on top of the reward function's score of the final text."""

    FEEDBACK = "That answer is not right. Check your reasoning step by step and give the final answer again as '#### <number>'."

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        self.max_retries = int(self.config.get("max_retries", 1))
        if self.max_retries < 0:
            raise ValueError(f"gsm8k interaction: max_retries must be >= 0, got {self.max_retries}")

    async def start(self, state: dict[str, Any]) -> None:
        state["gsm8k_tries"] = 0

    async def respond(self, messages: list[dict[str, str]], state: dict[str, Any]) -> InteractionTurn:
        from hybridrl.rewards import gsm8k

        truth = state.get("interaction_kwargs", {}).get("ground_truth", state.get("ground_truth"))
        state["gsm8k_tries"] = state.get("gsm8k_tries", 0) + 1
        if gsm8k.compute_score(messages[-1]["content"], str(truth)) == 1.0:
            return InteractionTurn("", done=True, reward=1.0)
        if state["gsm8k_tries"] > self.max_retries:
            return InteractionTurn("", done=True, reward=0.0)
        return InteractionTurn(self.FEEDBACK, done=False, reward=0.0)
