"""The agent loop on the native engine (CPU, tiny model, scripted turns): tokens in = tokens out,
masks, log-probs across appended tool tokens, ordering, failing tools, budgets, interactions."""

import asyncio

import agent_helpers
import pytest
import torch
from agent_helpers import EOS, TOK, ScriptedPolicy, chat_prompts, engine_for, tiny_model, turn

from hybridrl.data import keys as K
from hybridrl.models.logprobs import log_probs_from_logits
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.agent.loop import AgentOptions
from hybridrl.rollout.agent.rollout import AgentRollout
from hybridrl.rollout.agent.tool import Tool, ToolResult
from hybridrl.rollout.base import Hooks


@pytest.fixture(autouse=True, params=[1, 5], ids=["1-step", "5-step"])
def decode_steps(request, monkeypatch):
    """Every test with one decode step per launch and with five (turns then end mid-launch)."""
    monkeypatch.setattr(agent_helpers, "DECODE_STEPS", request.param)
    return request.param


SAMPLE = SamplingParams(n=1, temperature=1.0, max_new_tokens=300)
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


class Add(Tool):
    name = "add"

    def __init__(self, delays=None):
        super().__init__()
        self.delays = delays or {}

    async def execute(self, args, state):
        await asyncio.sleep(self.delays.get(state["ground_truth"], 0.0))
        state.setdefault("calls", 0)
        state["calls"] += 1
        return ToolResult(str(args["a"] + args["b"]), reward=-0.25)


class Broken(Tool):
    name = "broken"

    async def execute(self, args, state):
        mode = args.get("mode")
        if mode == "raise":
            raise ZeroDivisionError("division by zero")
        if mode == "hang":
            await asyncio.sleep(60)
        return ToolResult("x" * 1_000_000)


def call(name="add", **args):
    import json

    return "<tool_call>" + json.dumps({"name": name, "arguments": args or {"a": 2, "b": 3}}) + "</tool_call>"


def run(plans, questions=None, tools=None, model=None, sampling=SAMPLE, interactions=None, **options):
    model = model or tiny_model()
    engine = engine_for(model, **options.pop("engine", {}))
    options.setdefault("max_assistant_turns", 5)
    rollout = AgentRollout(engine, TOK, AgentOptions(**options), tools if tools is not None else {"add": Add()}, interactions)
    policy = ScriptedPolicy(engine, plans)
    questions = questions or [f"q{i}" for i in range(len(plans))]
    seeds = sorted(plans)
    out = rollout.generate(chat_prompts(questions), sampling, seeds=seeds)
    rollout.close()
    return out, policy, engine, model


def response(out, i):
    n = int(out[K.RESPONSE_ATTENTION_MASK][i].sum())
    return out[K.RESPONSES][i][:n], out[K.RESPONSE_MASK][i][:n], out[K.ROLLOUT_LOG_PROBS][i][:n]


def planned(turns):
    return [t for turn_ in turns for t in turn_]


@pytest.mark.parametrize(
    "engine",
    [{}, {"prefix_caching": True}, {"chunked_prefill": True, "max_num_batched_tokens": 8}],
    ids=["plain", "prefix-cache", "chunked-prefill"],
)
def test_token_in_token_out_and_masks(engine):
    """Also with prefix caching (the prompts share their chat-template head) and with chunked prefill."""
    plans = {11: [turn(CALL), turn("#### 5")], 12: [turn("no tools")], 13: [turn(CALL, free=3), turn(CALL), turn("done")]}
    out, policy, eng, _ = run({s: [list(t) for t in p] for s, p in plans.items()}, engine=dict(engine))
    if "prefix_caching" in engine:
        assert eng.last_metrics["rollout/prefix_cache_hit_rate"] > 0
    if "chunked_prefill" in engine:
        assert eng.last_metrics["rollout/prefill_chunks"] > 0
    for row, seed in enumerate(sorted(plans)):
        ids, mask, lps = response(out, row)
        model_tokens = ids[mask.bool()].tolist()
        # the trained tokens are exactly the sampled ones, in order (wasted steps after EOS aside)
        sampled = policy.sampled[seed]
        expected = [t if t is not None else sampled[j] for j, t in enumerate(planned(plans[seed])[: len(model_tokens)])]
        assert model_tokens == expected
        assert len(model_tokens) == len(planned(plans[seed]))
        # environment tokens are masked out of the loss and carry no log-prob
        assert torch.all(lps[~mask.bool()] == 0)
        # prompt + response is the chat template's rendering of the conversation
        turns_text = TOK.decode(model_tokens, skip_special_tokens=False).split("<|im_end|>")[:-1]
        messages = [{"role": "user", "content": f"q{row}"}]
        for k, text in enumerate(turns_text):
            messages.append({"role": "assistant", "content": text})
            if k < len(turns_text) - 1:
                messages.append({"role": "tool", "content": "5"})
        prompt = out[K.PROMPTS][row][out[K.PROMPT_MASK][row].bool()].tolist()
        assert TOK.decode(prompt + ids.tolist(), skip_special_tokens=False) + "\n" == TOK.apply_chat_template(
            messages, tokenize=False
        )
    assert out[K.AGENT_TURNS].tolist() == [2, 1, 3]
    assert out[K.AGENT_REWARD].tolist() == [-0.25, 0.0, -0.5]  # the tool's reward per call
    assert out[K.RESPONSE_TEXT][0].endswith("#### 5")


def test_log_probs_after_tool_tokens_match_a_full_forward():
    """Freely sampled tokens of later turns: the engine's log-probs (prefix in the paged cache,
    tool tokens appended by the extend pass) equal one causal forward over the whole sequence."""
    plans = {
        21: [turn(CALL, free=4), turn(CALL, free=6), turn(free=9)],
        22: [
            turn(free=3),
        ],
    }
    plans[22] = [turn(CALL, free=2), turn(free=12)]
    out, _, _, model = run(plans, sampling=SamplingParams(n=1, temperature=0.7, max_new_tokens=300))
    checked = 0
    for row, seed in enumerate(sorted(plans)):
        ids, mask, lps = response(out, row)
        prompt = out[K.PROMPTS][row][out[K.PROMPT_MASK][row].bool()]
        seq = torch.cat([prompt, ids])[None]
        with torch.no_grad():
            logits = model(seq).logits[0, len(prompt) - 1 : -1] / 0.7
        ref = log_probs_from_logits(logits[None], ids[None])[0]
        free = torch.tensor([t is None for t in planned(plans[seed])])
        model_pos = mask.bool().nonzero()[:, 0]
        pos = model_pos[free[: len(model_pos)]]
        torch.testing.assert_close(lps[pos], ref[pos], atol=2e-5, rtol=1e-5)
        checked += len(pos)
    assert checked == 4 + 6 + 9 + 2 + 12


def test_rows_keep_their_order_when_tools_finish_out_of_order():
    # row 0's tool is slowest, row 2's fastest; max_num_seqs=2 makes waiting rows rejoin as others leave
    delays = {"0": 0.3, "1": 0.15, "2": 0.0, "3": 0.05}
    plans = {30 + i: [turn(CALL, free=i), turn(f"#### {i}")] for i in range(4)}
    out, _, engine, _ = run(plans, tools={"add": Add(delays)}, engine={"max_num_seqs": 2})
    for i in range(4):
        assert out[K.RESPONSE_TEXT][i].endswith(f"#### {i}")
        assert "<tool_response>\n5\n</tool_response>" in TOK.decode(response(out, i)[0], skip_special_tokens=False)
    # every KV block went back to the allocator
    assert engine.cache.allocator.num_free == engine.cache.allocator.usable


@pytest.mark.parametrize(
    "args, text",
    [
        ({"mode": "raise"}, "error: tool 'broken' raised ZeroDivisionError: division by zero"),
        ({"mode": "hang"}, "error: tool 'broken' timed out after 0.2 s"),
        ({"mode": "big"}, "xxxxxxxx"),
    ],
)
def test_failing_tools_answer_the_model_and_the_run_goes_on(args, text):
    plans = {41: [turn(call("broken", **args)), turn("#### 1")]}
    out, _, engine, _ = run(plans, tools={"broken": Broken()}, tool_timeout_s=0.2, max_tool_response_length=80)
    ids, mask, _ = response(out, 0)
    env = TOK.decode(ids[~mask.bool()], skip_special_tokens=False)
    assert text in env
    assert out[K.RESPONSE_TEXT][0].endswith("#### 1")
    errors = engine.last_metrics["agent/tool_errors"]
    assert errors == (0.0 if args["mode"] == "big" else 1.0)
    if args["mode"] == "big":  # 1 MB of output: cut to 80 tokens
        assert env.count("x") == 80 and "...(truncated)" in env


def test_unknown_tool_and_bad_json_are_errors_the_model_sees():
    plans = {51: [turn('<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>'), turn("ok")]}
    out, _, engine, _ = run(plans, sampling=SamplingParams(n=1, max_new_tokens=600))
    env = TOK.decode(response(out, 0)[0][~response(out, 0)[1].bool()], skip_special_tokens=False)
    assert "there is no tool 'nope'; the tools are add" in env
    assert "the tool call is not valid JSON" in env
    assert engine.last_metrics["agent/tool_errors"] == 2.0


def test_budgets_end_trajectories():
    # max_assistant_turns=2: the second turn's call is not run
    out, _, engine, _ = run({61: [turn(CALL), turn(CALL), turn("never")]}, max_assistant_turns=2)
    assert out[K.AGENT_TURNS].tolist() == [2] and "never" not in out[K.RESPONSE_TEXT][0]
    # max_turn_tokens: a turn cut before EOS is truncated and ends the trajectory
    out, _, engine, _ = run({62: [turn(free=30)]}, max_turn_tokens=10)
    assert int(out[K.RESPONSE_MASK][0].sum()) == 10 and engine.last_metrics["agent/truncated"] == 1.0
    # the total budget: a tool message that leaves no room for a model token ends it
    n_call = len(TOK.encode(CALL)) + 1
    out, _, engine, _ = run({63: [turn(CALL), turn("x")]}, sampling=SamplingParams(n=1, max_new_tokens=n_call + 5))
    assert int(out[K.RESPONSE_ATTENTION_MASK][0].sum()) == n_call and engine.last_metrics["agent/truncated"] == 1.0


def test_samples_of_a_prompt_share_its_prefill_and_go_their_own_ways():
    plans = {71: [turn(CALL), turn("#### a")], 72: [turn("#### b")]}
    model = tiny_model()
    engine = engine_for(model)
    rollout = AgentRollout(engine, TOK, AgentOptions(max_assistant_turns=3), {"add": Add()})
    ScriptedPolicy(engine, plans)
    out = rollout.generate(chat_prompts(["q"]), SamplingParams(n=2, max_new_tokens=200), seeds=[71, 72])
    assert out[K.AGENT_TURNS].tolist() == [2, 1]
    assert out[K.RESPONSE_TEXT][0].endswith("#### a") and out[K.RESPONSE_TEXT][1] == "#### b"
    assert out[K.UID][0] == out[K.UID][1]


class Tutor:
    """A minimal interaction: asks for a retry until the answer is '42', at most twice."""

    async def start(self, state):
        state["tries"] = 0

    async def respond(self, messages, state):
        from types import SimpleNamespace

        state["tries"] += 1
        if "42" in messages[-1]["content"]:
            return SimpleNamespace(text="", done=True, reward=1.0)
        return SimpleNamespace(text="try again", done=False, reward=0.0)

    async def finish(self, state):
        state["finished"] = True


def test_an_interaction_plays_the_user_turn():
    plans = {81: [turn("41"), turn("42")], 82: [turn("1"), turn("2"), turn("3"), turn("never")]}
    out, _, engine, _ = run(plans, tools={}, interactions={"tutor": Tutor()}, max_user_turns=2)
    text0 = TOK.decode(response(out, 0)[0], skip_special_tokens=False)
    assert "<|im_start|>user\ntry again<|im_end|>\n<|im_start|>assistant\n42" in text0
    assert out[K.AGENT_REWARD].tolist() == [1.0, 0.0]
    assert out[K.AGENT_TURNS].tolist() == [2, 3]  # row 1: two user turns, then the third answer ends it
    assert engine.last_metrics["agent/user_turns_mean"] == 1.5


def test_multi_turn_needs_the_native_engine():
    from hybridrl.rollout.hf import HFRolloutEngine

    hf = HFRolloutEngine(tiny_model(), TOK, max_num_seqs=4)
    with pytest.raises(ValueError, match="native engine"):
        AgentRollout(hf, TOK, AgentOptions(), {})
    with pytest.raises(ValueError, match="format=code"):
        AgentRollout(engine_for(tiny_model()), TOK, AgentOptions(format="code"), {})


def test_eos_is_the_only_turn_end():
    assert EOS == TOK.eos_token_id


class InstantAnswers:
    """The engine's side of the agent protocol, answering every turn at once (in `end_turn`, so
    which answers are in at each step is deterministic): row r's turns are 3 + 6r tokens (each
    row's ends in another launch, at 5 decode steps per launch too), then 2 appended tokens, 3
    turns in all."""

    def begin(self, prompts, n, max_total):
        self.max_total, self.turns, self.answers = max_total, [0] * (len(prompts) * n), []

    def turn_limit(self, row, length):
        return min(self.max_total, length + 3 + 6 * row)

    def end_turn(self, row, tokens, ended_on_eos):
        self.turns[row] += 1
        self.answers.append((row, None if self.turns[row] == 3 else [7, 8]))

    def poll(self, block):
        out, self.answers = self.answers, []
        return out

    def finish(self, batch):
        return batch

    def metrics(self, elapsed_s, tool_wait_s):
        return {}


def test_answered_rows_rejoin_together_with_the_same_tokens():
    """Rows whose answers are in wait a few decode steps to rejoin in one extend pass (each pass is
    an eager forward and a host sync): fewer passes, and the same trajectories as rejoining at once."""
    model, passes, outs = tiny_model(), [], []
    for wait in (0, 1000):
        engine = engine_for(model, resume_wait_steps=wait)
        out = engine.generate(
            chat_prompts([f"q{i}" for i in range(8)]), SAMPLE, Hooks(agent=InstantAnswers()), seeds=list(range(8))
        )
        outs.append(out)
        passes.append(engine.last_metrics["rollout/extend_passes"])
        # each row rejoined after turns 1 and 2 (fewer if a turn ended on EOS)
        assert engine.last_metrics["rollout/extend_rows_mean"] * passes[-1] <= 16
    assert passes[0] >= 8 and passes[1] < passes[0], passes  # turns of different lengths end at different steps
    for key in (K.RESPONSES, K.RESPONSE_MASK, K.RESPONSE_ATTENTION_MASK):
        assert torch.equal(outs[0][key], outs[1][key]), key
    torch.testing.assert_close(outs[0][K.ROLLOUT_LOG_PROBS], outs[1][K.ROLLOUT_LOG_PROBS], atol=1e-5, rtol=1e-5)


def test_multi_turn_is_scored_after_generation():
    """A turn's end is not the trajectory's: the agent rollout takes `Hooks(on_finish=...)` (the
    actor passes it to every engine) and never calls it, so the batch is scored after; it refuses
    a `weight_swap` (partial rollouts are single-turn) rather than dropping it."""
    engine = engine_for(tiny_model())
    rollout = AgentRollout(engine, TOK, AgentOptions(), {})
    reported = []
    out = rollout.generate(
        chat_prompts(["q"]), SamplingParams(n=2, max_new_tokens=20), Hooks(on_finish=reported.append), seeds=[1, 2]
    )
    assert reported == [] and out[K.RESPONSES].shape[0] == 2
    with pytest.raises(ValueError, match="hooks.weight_swap=.*native engine, not multi-turn"):
        rollout.generate(chat_prompts(["q"]), SamplingParams(max_new_tokens=4), Hooks(weight_swap=object()))
    rollout.close()
