"""Code answers scored on a SandboxFusion service (hybridrl/rewards/code_sandbox.py), against a
fake service on 127.0.0.1 that runs the programs with the local interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.rewards.code_sandbox import SandboxFusionReward

TESTS = json.dumps({"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]})
ADD = "Sure:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
ONE_RIGHT = "```python\na, b = map(int, input().split())\nprint(3)\n```"
CRASH = "```python\nraise SystemExit(3)\n```"


class FakeSandbox:
    """POST /run_code {code, stdin, run_timeout}: runs it; `mode` makes it fail on purpose."""

    def __init__(self):
        self.mode, self.requests = "ok", 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                owner.requests += 1
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if owner.mode == "down":
                    self.send_response(503)
                    self.end_headers()
                    return
                proc = subprocess.run(
                    [sys.executable, "-c", body["code"]], input=body.get("stdin", ""), capture_output=True, text=True, timeout=10
                )
                reply = {
                    "status": "Success",
                    "run_result": {
                        "status": "Finished",
                        "stdout": proc.stdout,
                        "stderr": proc.stderr,
                        "return_code": proc.returncode,
                    },
                }
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/run_code"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def service():
    s = FakeSandbox()
    yield s
    s.close()


def _reward(url, **kw):
    return SandboxFusionReward(url, **{"timeout_s": 12.0, "retries": 1, "backoff_s": 0.01, "max_concurrency": 4, **kw})


def test_programs_are_scored_by_the_tests_they_pass(service):
    reward = _reward(service.url)
    try:
        result = reward.score_batch(
            ["codecontests", "apps", "taco", "gsm8k"], [ADD, ONE_RIGHT, CRASH, "#### 72"], [TESTS, TESTS, TESTS, "72"]
        )
    finally:
        reward.close()
    assert result.scores == [1.0, 0.5, 0.0, 1.0]  # the gsm8k row keeps its built-in scorer
    assert result.extras["all_passed"] == [1.0, 0.0, 0.0, 0.0]
    assert result.num_errors == 0
    assert service.requests == 6  # two test cases for each of the three code answers


def test_a_service_that_is_down_costs_a_counted_zero_after_retries(service):
    service.mode = "down"
    reward = _reward(service.url, circuit_breaker_failures=0)
    try:
        result = reward.score_batch(["apps", "apps"], [ADD, ADD], [TESTS, TESTS])
    finally:
        reward.close()
    assert result.scores == [0.0, 0.0] and result.num_errors == 2 and result.num_timeouts == 0
    assert result.metrics["remote_retries"] == 2.0 and service.requests == 4


def test_a_request_that_times_out_is_counted_as_a_timeout(service, monkeypatch):
    import urllib.request

    def no_answer(*args, **kwargs):
        raise TimeoutError("timed out")

    monkeypatch.setattr(urllib.request, "urlopen", no_answer)
    reward = _reward(service.url, retries=0)
    try:
        result = reward.score_batch(["apps"], [ADD], [TESTS])
    finally:
        reward.close()
    assert result.scores == [0.0] and result.num_errors == 1 and result.num_timeouts == 1


def test_bad_test_cases_are_errors_not_requests(service):
    reward = _reward(service.url)
    try:
        result = reward.score_batch(
            ["apps", "apps"], [ADD, ADD], ["not json tests", json.dumps({"inputs": ["1"], "outputs": []})]
        )
    finally:
        reward.close()
    assert result.num_errors == 2 and service.requests == 0


def test_verl_key_configures_it_and_code_sources_need_no_custom_reward(service):
    cfg = load_config(
        None,
        [
            "actor_rollout_ref.model.path=m",
            "data.train_files=t.parquet",
            f"reward_model.sandbox_fusion.url={service.url}",
            "reward_model.sandbox_fusion.max_concurrent=16",
        ],
        verl="ppo",
    )
    assert cfg.reward_model.sandbox_fusion.url == service.url and cfg.reward_model.sandbox_fusion.max_concurrent == 16
    from hybridrl.rewards.assembly import build_scorer, ground_truth_rule

    fn, need_gt = build_scorer(cfg), ground_truth_rule(cfg)
    assert isinstance(fn, SandboxFusionReward) and need_gt("apps") and need_gt("gsm8k") and fn.max_concurrency == 16
    with pytest.raises(ConfigError):
        load_config(
            None, ["actor_rollout_ref.model.path=m", "data.train_files=t.parquet", "reward_model.sandbox_fusion.url=ftp://x"]
        )
