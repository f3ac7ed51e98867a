"""The agent loop: what happens between two model turns of a multi-turn rollout.

The engine (rollout/native/engine.py) decodes; when a sequence's turn ends it calls
`AgentSession.end_turn` with the turn's sampled token ids and moves on with the other
sequences. The session decodes the turn, parses its tool calls (parser.py) and runs them as
coroutines on a background event loop (`AsyncRunner`), concurrently with each other and with
decoding; a turn without a tool call goes to the interaction (the simulated user), if one is
configured. When the answer is ready, `poll` hands the engine the tokens to append: the chat
template's rendering of the tool (or user) messages and the next assistant header. The model's
own tokens are never re-tokenized (token in, token out); only what the environment writes is
rendered, and it is masked out of the loss (RESPONSE_MASK) while staying in the context
(RESPONSE_ATTENTION_MASK).

A trajectory ends when a turn calls no tool and no interaction continues it; when a turn ends
without EOS (it hit `max_turn_tokens` or the total budget: truncated); after
`max_assistant_turns` turns or `max_user_turns` user turns; or when the next message would not
leave room for a model token in `data.max_response_length`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.chat_template import check_chat_template
from hybridrl.rollout.agent.parser import ToolCall, parse_tool_calls
from hybridrl.rollout.agent.tool import Tool, ToolResult

logger = logging.getLogger("hybridrl.agent")

TRUNCATION_NOTE = "\n...(truncated)"


class AsyncRunner:
    """An asyncio event loop on a daemon thread; tool and interaction coroutines run there."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="hybridrl-agent-tools", daemon=True)
        self.thread.start()

    def submit(self, coro):
        """Schedule `coro` on the loop; returns a concurrent.futures.Future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout: float | None = None):
        """Run `coro` on the loop and wait for its result."""
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)


@dataclass
class AgentOptions:
    """`actor_rollout_ref.rollout.multi_turn` as the loop uses it."""

    format: str = "hermes"
    max_assistant_turns: int | None = None  # None: until the token budget ends the trajectory
    max_user_turns: int | None = None
    max_turn_tokens: int | None = None  # None: the whole remaining budget
    max_tool_response_length: int = 256  # tokens of one tool result (longer ones are cut)
    tool_response_truncate_side: str = "middle"  # which part of a long result is cut: left, middle, right
    max_parallel_calls: int = 8  # calls of one turn that run; the rest are answered with an error
    tool_timeout_s: float = 30.0  # a call that takes longer is answered with an error

    @classmethod
    def from_config(cls, mt) -> "AgentOptions":
        return cls(
            format=mt.format,
            max_assistant_turns=mt.max_assistant_turns,
            max_user_turns=mt.max_user_turns,
            max_turn_tokens=mt.max_turn_tokens,
            max_tool_response_length=mt.max_tool_response_length,
            tool_response_truncate_side=mt.tool_response_truncate_side,
            max_parallel_calls=mt.max_parallel_calls,
            tool_timeout_s=mt.tool_timeout_s,
        )


@dataclass
class Trajectory:
    """One output row's conversation state."""

    state: dict[str, Any]  # shared by its tool calls and its interaction
    interaction: Any = None
    messages: list[dict[str, str]] = field(default_factory=list)  # assistant/tool/user messages after the prompt
    length: int = 0  # response tokens so far (model + environment)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    reward: float = 0.0
    truncated: bool = False
    tools_used: set[str] = field(default_factory=set)


class MessageRenderer:
    """Token ids the chat template puts after a model turn for the given environment messages,
    including the next assistant header: the difference between rendering a fixed conversation
    with and without them (what follows the EOS token the model sampled)."""

    BASE = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]

    def __init__(self, tokenizer, eos_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.templated = getattr(tokenizer, "chat_template", None) is not None
        if self.templated:
            check_chat_template(tokenizer)
            base = tokenizer.apply_chat_template(self.BASE, tokenize=False)
            eos_texts = [tokenizer.decode([i]) for i in eos_token_ids]
            ends = [(base.rfind(t), t) for t in eos_texts if t and base.rfind(t) >= 0]
            self.base = base
            # what the template writes after the assistant's EOS (Qwen: a newline)
            self.tail = base[max(ends)[0] + len(max(ends)[1]) :] if ends else ""

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        if self.templated:
            full = self.tokenizer.apply_chat_template(self.BASE + messages, tokenize=False, add_generation_prompt=True)
            if not full.startswith(self.base):
                raise ValueError("multi_turn: the chat template does not render a conversation as a prefix of its extension")
            text = self.tail + full[len(self.base) :]
        else:  # no template: plain "role: content" lines and an assistant cue
            text = "".join(f"\n{m['role']}: {m['content']}" for m in messages) + "\nassistant: "
        return self.tokenizer.encode(text, add_special_tokens=False)


class AgentSession:
    """The agent side of one `generate` call (see the module docstring). Built per call by
    `AgentRollout`, which owns the tools, the interactions and the event loop."""

    def __init__(
        self,
        tokenizer,
        options: AgentOptions,
        tools: dict[str, Tool],
        interactions: dict[str, Any],
        runner: AsyncRunner,
        renderer: MessageRenderer,
        eos_token_ids: list[int],
    ):
        self.tokenizer, self.options, self.tools, self.interactions = tokenizer, options, tools, interactions
        self.runner, self.renderer = runner, renderer
        self.eos = set(eos_token_ids)
        self.results: queue.Queue = queue.Queue()  # (row, future) of answers being computed
        self.in_flight = 0
        self.trajectories: list[Trajectory] = []

    # -- what the engine calls ---------------------------------------------------------------
    def begin(self, prompts: Batch, n: int, max_total: int) -> None:
        """One trajectory per output row (the n samples of prompt i are rows i*n .. i*n+n-1)."""
        self.max_total = max_total
        self.trajectories = []
        for i in range(len(prompts)):
            extra = prompts[K.EXTRA_INFO][i] if K.EXTRA_INFO in prompts else {}
            extra = dict(extra) if isinstance(extra, dict) else {}
            for _ in range(n):
                state = {
                    "ground_truth": prompts[K.GROUND_TRUTH][i] if K.GROUND_TRUTH in prompts else None,
                    "data_source": prompts[K.DATA_SOURCE][i] if K.DATA_SOURCE in prompts else None,
                    "extra_info": copy.deepcopy(extra),
                    "tools_kwargs": copy.deepcopy(extra.get("tools_kwargs") or {}),
                    "interaction_kwargs": copy.deepcopy(extra.get("interaction_kwargs") or {}),
                }
                self.trajectories.append(Trajectory(state, self._interaction_for(state)))
        starts = [self.runner.submit(t.interaction.start(t.state)) for t in self.trajectories if t.interaction is not None]
        for f in starts:
            f.result()

    def turn_limit(self, row: int, length: int) -> int:
        """The response length at which row's next turn is cut (its turn budget, within the total)."""
        self.trajectories[row].length = length
        per_turn = self.options.max_turn_tokens
        return self.max_total if per_turn is None else min(self.max_total, length + per_turn)

    def end_turn(self, row: int, tokens: list[int], ended_on_eos: bool) -> None:
        """Row's model turn is over: start computing what comes next (answered by `poll`)."""
        t, o = self.trajectories[row], self.options
        t.length += len(tokens)
        t.assistant_turns += 1
        text = self.tokenizer.decode([x for x in tokens if x not in self.eos], skip_special_tokens=False)
        t.messages.append({"role": "assistant", "content": text})
        if not ended_on_eos:  # cut by the turn or total budget
            t.truncated = True
            return self._answer(row, None)
        if o.max_assistant_turns is not None and t.assistant_turns >= o.max_assistant_turns:
            return self._answer(row, None)
        calls = parse_tool_calls(text, o.format)
        if calls:
            return self._start(row, self._run_tools(t, calls))
        if t.interaction is not None and (o.max_user_turns is None or t.user_turns < o.max_user_turns):
            return self._start(row, self._interact(t))
        self._answer(row, None)

    def poll(self, block: bool) -> list[tuple[int, list[int] | None]]:
        """Answers that are ready: (row, tokens to append) or (row, None) to end the trajectory.
        With `block`, waits for at least one (when any is being computed)."""
        out = []
        while True:
            try:
                row, item = self.results.get(block=block and not out and self.in_flight > 0)
            except queue.Empty:
                return out
            out.append((row, self._tokens(row, item)))

    def finish(self, batch: Batch) -> Batch:
        """After the last turn: release per-trajectory resources; AGENT_REWARD and AGENT_TURNS."""
        self.runner.run(self._release_all())
        batch[K.AGENT_REWARD] = torch.tensor([t.reward for t in self.trajectories], dtype=torch.float32)
        batch[K.AGENT_TURNS] = torch.tensor([t.assistant_turns for t in self.trajectories], dtype=torch.long)
        return batch

    def metrics(self, elapsed_s: float, tool_wait_s: float) -> dict[str, float]:
        ts = self.trajectories
        calls = sum(t.tool_calls for t in ts)
        return {
            "agent/turns_mean": float(np.mean([t.assistant_turns for t in ts])) if ts else 0.0,
            "agent/user_turns_mean": float(np.mean([t.user_turns for t in ts])) if ts else 0.0,
            "agent/tool_calls_per_trajectory": calls / max(len(ts), 1),
            "agent/tool_calls": float(calls),
            "agent/tool_errors": float(sum(t.tool_errors for t in ts)),
            "agent/tool_latency_s": sum(t.tool_seconds for t in ts) / max(calls, 1),
            "agent/truncated": float(np.mean([t.truncated for t in ts])) if ts else 0.0,
            "agent/reward_mean": float(np.mean([t.reward for t in ts])) if ts else 0.0,
            # share of the rollout's wall time in which no sequence could decode (all waited on tools)
            "agent/tool_wait_share": tool_wait_s / max(elapsed_s, 1e-9),
        }

    # -- inside ---------------------------------------------------------------------------------
    def _interaction_for(self, state: dict):
        if not self.interactions:
            return None
        name = state["interaction_kwargs"].get("name")
        if name is None:
            if len(self.interactions) > 1:
                raise ValueError(
                    f"a data row has no extra_info.interaction_kwargs.name and {len(self.interactions)} interactions "
                    f"are configured ({', '.join(self.interactions)}); name one per row"
                )
            return next(iter(self.interactions.values()))
        if name not in self.interactions:
            raise ValueError(
                f"a data row asks for interaction {name!r}; the interaction config defines {', '.join(self.interactions)}"
            )
        return self.interactions[name]

    def _answer(self, row: int, item) -> None:
        self.results.put((row, item))

    def _start(self, row: int, coro) -> None:
        self.in_flight += 1
        future = self.runner.submit(coro)
        future.add_done_callback(lambda f: self.results.put((row, f)))

    def _tokens(self, row: int, item) -> list[int] | None:
        """A finished computation -> the tokens to append, or None (the trajectory ends)."""
        if item is None:
            return None
        self.in_flight -= 1
        t = self.trajectories[row]
        try:
            messages = item.result()
        except BaseException as e:  # the loop's own coroutines catch tool errors; this is a bug
            logger.exception("multi_turn: the agent step of row %d failed", row)
            raise RuntimeError(f"multi_turn: the agent step failed: {type(e).__name__}: {e}") from e
        if messages is None:
            return None
        tokens = self.renderer.render(messages)
        if t.length + len(tokens) >= self.max_total:  # no room left for a model token
            t.truncated = True
            return None
        t.messages += messages
        t.length += len(tokens)
        return tokens

    async def _run_tools(self, t: Trajectory, calls: list[ToolCall]) -> list[dict[str, str]]:
        limit = self.options.max_parallel_calls
        for c in calls[limit:]:
            c.error = c.error or f"only {limit} tool call(s) per turn run (multi_turn.max_parallel_calls); this one did not"
        results = await asyncio.gather(*(self._call(t, c) for c in calls))
        role = "tool" if self.options.format == "hermes" else "user"
        if role == "user":  # code format: one user message with each block's output
            body = "\n".join(f"```output\n{r.text}\n```" for r in results)
            return [{"role": "user", "content": body}]
        return [{"role": "tool", "content": r.text} for r in results]

    async def _call(self, t: Trajectory, call: ToolCall) -> ToolResult:
        t.tool_calls += 1
        start = time.perf_counter()
        tool = self.tools.get(call.name)
        if call.error is not None:
            result = ToolResult(f"error: {call.error}", error=True)
        elif tool is None:
            result = ToolResult(f"error: there is no tool {call.name!r}; the tools are {', '.join(self.tools)}", error=True)
        else:
            t.tools_used.add(call.name)
            try:
                result = await asyncio.wait_for(tool.execute(call.args, t.state), self.options.tool_timeout_s)
                if not isinstance(result, ToolResult):
                    kind = type(result).__name__
                    result = ToolResult(f"error: tool {call.name!r} returned {kind}, not a ToolResult", error=True)
            except asyncio.TimeoutError:
                result = ToolResult(f"error: tool {call.name!r} timed out after {self.options.tool_timeout_s:g} s", error=True)
            except Exception as e:  # a tool's bug is the model's failed call, not the run's end
                result = ToolResult(f"error: tool {call.name!r} raised {type(e).__name__}: {e}", error=True)
        t.tool_seconds += time.perf_counter() - start
        t.tool_errors += int(result.error)
        t.reward += float(result.reward)
        return ToolResult(self._cut(str(result.text)), result.reward, result.error, result.metrics)

    async def _interact(self, t: Trajectory) -> list[dict[str, str]] | None:
        turn = await t.interaction.respond(list(t.messages), t.state)
        t.reward += float(turn.reward)
        if turn.done:
            return None
        t.user_turns += 1
        return [{"role": "user", "content": turn.text}]

    def _cut(self, text: str) -> str:
        """At most max_tool_response_length tokens of a tool's text, cut on the configured side
        (a 1 MB output is first cut by characters, at 16 per token, so it is never tokenized whole)."""
        limit, side = self.options.max_tool_response_length, self.options.tool_response_truncate_side
        chars = 16 * limit + 16
        if len(text) > 2 * chars:
            text = text[-chars:] if side == "left" else text[:chars] if side == "right" else text[:chars] + text[-chars:]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= limit:
            return text
        head = limit // 2
        if side == "left":
            return TRUNCATION_NOTE.strip() + "\n" + self.tokenizer.decode(ids[-limit:])
        if side == "right":
            return self.tokenizer.decode(ids[:limit]) + TRUNCATION_NOTE
        tail = self.tokenizer.decode(ids[len(ids) - (limit - head) :])
        return self.tokenizer.decode(ids[:head]) + TRUNCATION_NOTE + "\n" + tail

    async def _release_all(self) -> None:
        jobs = []
        for t in self.trajectories:
            jobs += [self.tools[name].release(t.state) for name in t.tools_used]
            if t.interaction is not None:
                jobs.append(t.interaction.finish(t.state))
        for r in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(r, BaseException):
                logger.warning("multi_turn: releasing a tool or interaction failed: %s", r)
