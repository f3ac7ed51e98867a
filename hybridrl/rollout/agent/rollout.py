"""`AgentRollout`: a rollout engine whose `generate` runs multi-turn agent trajectories.

It wraps the native engine (everything else — weights, sleep/wake, metrics — is the engine's)
and owns what lives across calls: the tools and interactions built from their config files,
the event loop their coroutines run on, and the chat-template renderer of tool/user messages.
Each `generate` builds an `AgentSession` (loop.py) and passes it to the engine.
"""

from __future__ import annotations

from pathlib import Path

from hybridrl.data.batch import Batch
from hybridrl.rollout.agent.loop import AgentOptions, AgentSession, AsyncRunner, MessageRenderer
from hybridrl.rollout.agent.tool import Tool
from hybridrl.rollout.base import NO_HOOKS, Hooks, SamplingParams


def load_tools(path: str | None) -> dict[str, Tool]:
    """Name -> tool instance from a tool config file (verl's `tool_config_path` shape); {} without one."""
    if not path:
        return {}
    from hybridrl.rollout.agent.tool_config import load_tool_config

    return {t.name: t for t in load_tool_config(_existing(path, "tool_config_path"))}


def load_interactions(path: str | None) -> dict:
    """Name -> interaction from an interaction config file (verl's `interaction_config_path` shape)."""
    if not path:
        return {}
    from hybridrl.rollout.agent.interaction import load_interaction_config

    return load_interaction_config(_existing(path, "interaction_config_path"))


def chat_tools(multi_turn) -> list[dict] | None:
    """The tools' function schemas for the chat template (`tools=`), with multi_turn enabled in
    the hermes format; None otherwise (the code format needs no schema in the prompt)."""
    if not multi_turn.enable or multi_turn.format != "hermes":
        return None
    return [t.schema() for t in load_tools(multi_turn.tool_config_path).values()] or None


def _existing(path: str, key: str) -> str:
    if not Path(path).is_file():
        raise FileNotFoundError(f"actor_rollout_ref.rollout.multi_turn.{key}={path!r}: no such file")
    return path


class AgentRollout:
    def __init__(self, engine, tokenizer, options: AgentOptions, tools: dict[str, Tool], interactions: dict | None = None):
        from hybridrl.rollout.native.engine import NativeRolloutEngine

        if not isinstance(engine, NativeRolloutEngine):
            raise ValueError(
                f"multi_turn rollouts run on the native engine, not {type(engine).__name__}; "
                f"set actor_rollout_ref.rollout.name=native"
            )
        if options.format == "code" and "python" not in tools:
            raise ValueError(
                "multi_turn.format=code runs the model's ```python blocks with the `python` tool; "
                "list it in the tool config (class_name: python)"
            )
        self.engine, self.tokenizer, self.options = engine, tokenizer, options
        self.tools, self.interactions = dict(tools), dict(interactions or {})
        self.runner = AsyncRunner()
        self.renderer = MessageRenderer(tokenizer, engine.eos_token_ids)

    @classmethod
    def from_config(cls, engine, tokenizer, multi_turn) -> "AgentRollout":
        """From the config's `actor_rollout_ref.rollout.multi_turn` section (tools and
        interactions from the files it names)."""
        tools = load_tools(multi_turn.tool_config_path)
        interactions = load_interactions(multi_turn.interaction_config_path)
        return cls(engine, tokenizer, AgentOptions.from_config(multi_turn), tools, interactions)

    def session(self) -> AgentSession:
        return AgentSession(
            self.tokenizer, self.options, self.tools, self.interactions, self.runner, self.renderer, self.engine.eos_token_ids
        )

    def generate(self, prompts: Batch, sampling: SamplingParams, hooks: Hooks | None = None, seeds=None) -> Batch:
        """The engine's `generate` with the agent loop; RESPONSE_ATTENTION_MASK, AGENT_REWARD and
        AGENT_TURNS added (see keys.py). `hooks.on_finish` is never called: a turn's end is not the
        trajectory's, and tools add rewards, so the batch is scored after generation."""
        (hooks or NO_HOOKS).require("multi-turn rollouts")
        return self.engine.generate(prompts, sampling, Hooks(agent=self.session()), seeds=seeds)

    def close(self) -> None:
        self.runner.close()

    def __getattr__(self, name):  # model, load_weights, sleep, wake, last_metrics, ...: the engine's
        return getattr(self.engine, name)
