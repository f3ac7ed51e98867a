"""Score code answers by running them on a SandboxFusion service (`reward_model.sandbox_fusion.url`,
as verl's code recipes set it).

A sample of a code data source (`CODE_SOURCES`) has test cases in its ground truth, verl's form:
`{"inputs": ["1 2\n", ...], "outputs": ["3\n", ...]}` (a JSON string or a mapping). The program is the
last fenced code block of the response (the whole response when it has none); it runs once per test
case with the input on stdin, through the python tool's SandboxFusion client
(`hybridrl/sandbox/`), and passes when its stdout equals the expected output up to trailing
whitespace. The score is the fraction of test cases passed, with `all_passed` (0/1) beside it.
Samples of other data sources keep their built-in scorer.

Requests are made as the remote scorer makes them (`RemoteReward`: `max_concurrent` responses at
once, `custom_reward_function.remote.{timeout_s, retries, backoff_s, circuit_breaker_*}`; a program
may run `timeout_s` on the service, its request 10 s more): a
service that is down, slow or answers garbage costs that response a score of 0, counted in
`reward/errors` (`reward/timeouts`), never the run. A program that fails its tests, crashes or runs
past its time limit on the service is a score, not an error.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from .registry import default_compute_score, needs_ground_truth
from .remote import RemoteReward
from .result import Outcome, ScoreFailure

# verl's names of code datasets (verl/utils/reward_score/__init__.py routes these to the sandbox).
CODE_SOURCES = (
    "codecontests",
    "apps",
    "codeforces",
    "taco",
    "likaixin/TACO-verified",
    "PrimeIntellect/verifiable-coding-problems",
)

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str:
    """The last fenced code block of `response`, or all of it.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\nthen\\n```python\\nprint(2)\\n```")
    'print(2)\\n'
    >>> extract_code("print(3)")
    'print(3)'
    """
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def read_test_cases(ground_truth: Any) -> tuple[list[str], list[str]]:
    """(inputs, outputs) from verl's ground truth; ValueError when it holds no usable tests."""
    cases = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    if not isinstance(cases, dict) or "inputs" not in cases or "outputs" not in cases:
        raise ValueError(f"the ground truth is not {{inputs: [...], outputs: [...]}} test cases: {str(ground_truth)[:80]!r}")
    if cases.get("fn_name"):
        raise ValueError("call-based test cases (fn_name) are not supported; give stdin/stdout cases")
    inputs, outputs = list(cases["inputs"]), list(cases["outputs"])
    if not inputs or len(inputs) != len(outputs):
        raise ValueError(f"{len(inputs)} test inputs for {len(outputs)} outputs")
    return [str(x) for x in inputs], [str(x) for x in outputs]


def _same_output(got: str, expected: str) -> bool:
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(got) == lines(expected)


class SandboxFusionReward(RemoteReward):
    """`RemoteReward`'s concurrency, retries, circuit breaker and failure counting, with each response
    scored by running its program on the service (see the module docstring)."""

    def __init__(self, url: str, *, memory_limit_mb: int = 1024, **remote):
        remote["process"] = False  # the requests run on this process's threads (the helper process speaks the plain protocol)
        super().__init__(url, **remote)
        self.memory_limit_mb = int(memory_limit_mb)
        self.name = f"SandboxFusion at {url}"

    @classmethod
    def from_configs(cls, sandbox, remote) -> SandboxFusionReward:
        """From `reward_model.sandbox_fusion` and `custom_reward_function.remote` (its limits)."""
        return cls(
            sandbox.url,
            memory_limit_mb=sandbox.memory_limit_mb,
            timeout_s=remote.timeout_s,
            max_concurrency=sandbox.max_concurrent,
            retries=remote.retries,
            backoff_s=remote.backoff_s,
            circuit_breaker_failures=remote.circuit_breaker_failures,
            circuit_breaker_cooldown_s=remote.circuit_breaker_cooldown_s,
        )

    def _score_one(self, payload: dict) -> Outcome:
        if payload["data_source"] not in CODE_SOURCES:  # a math or gsm8k row in a mixed set: no request
            stats = {"remote_latency_s": None, "remote_retries": 0, "remote_skipped": 0}
            try:
                value = default_compute_score(payload["data_source"], payload["solution_str"], payload["ground_truth"])
            except Exception as e:
                return Outcome.failed(ScoreFailure(f"{type(e).__name__}: {e}"), **stats)
            return Outcome(value=value, stats=stats)
        return super()._score_one(payload)

    def _post(self, body: bytes) -> Any:
        """One response: every test case run in turn; a `ScoreFailure` when the service fails."""
        from hybridrl.sandbox import SandboxConfig, SandboxFusionClient

        payload = json.loads(body)
        try:
            inputs, outputs = read_test_cases(payload["ground_truth"])
        except (ValueError, TypeError) as e:
            raise ScoreFailure(f"data_source {payload['data_source']!r}: {e}") from None
        code = extract_code(str(payload["solution_str"]))
        # Each program may run timeout_s on the service; the client allows a request 10 s more. Its
        # retries are RemoteReward's (this method's caller), with backoff and the circuit breaker.
        limits = SandboxConfig(wall_timeout_s=self.timeout_s, memory_mb=self.memory_limit_mb, max_concurrency=1)
        client = SandboxFusionClient(self.url, limits, retries=0)
        passed = 0
        for stdin, expected in zip(inputs, outputs):
            result = asyncio.run(client.run(code, stdin))
            if result.exit_code is None and not result.timed_out and result.stderr.startswith("the sandbox service"):
                timed_out = "Timeout" in result.stderr or "timed out" in result.stderr
                raise ScoreFailure(result.stderr, retry=True, timed_out=timed_out)
            passed += int(result.ok and _same_output(result.stdout, expected))
        return {"score": passed / len(inputs), "all_passed": float(passed == len(inputs))}


def needs_ground_truth_or_code(data_source: str) -> bool:
    """Rows the data loader must find a ground truth in: the built-in scorers' and the code sources'."""
    return data_source in CODE_SOURCES or needs_ground_truth(data_source)
