"""`hybridrl train` scoring with an HTTP service on 127.0.0.1 (custom_reward_function.remote.url).

A service that computes the built-in arith score gives the very run the built-in scorer gives; a
service that answers only 500s costs every response its reward (counted), and the run finishes."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_helpers import cli, metrics, without_volatile

from hybridrl.rewards import arith

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/broken":
            payload, code = b"overloaded", 500
        else:
            payload, code = json.dumps({"score": arith.compute_score(body["solution_str"], body["ground_truth"])}).encode(), 200
        self.send_response(code)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def service():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _train(out, *overrides):
    return cli(
        "train",
        ROOT / "configs/quickstart.yaml",
        f"trainer.default_local_dir={out}",
        f"actor_rollout_ref.model.path={ROOT / 'hybridrl/assets/tiny-arith'}",
        f"data.train_files={ROOT / 'data/arith/train.jsonl'}",
        f"data.val_files={ROOT / 'data/arith/test.jsonl'}",
        f"warmup.files={ROOT / 'data/arith/sft.jsonl'}",
        "warmup.steps=30",
        "trainer.total_training_steps=3",
        "trainer.test_freq=3",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        "data.val_max_samples=32",
        "trainer.logger=[console,jsonl]",
        *overrides,
    )


def test_remote_scorer_trains_the_quickstart_like_the_builtin_one(service, tmp_path):
    _train(tmp_path / "builtin")
    _train(tmp_path / "remote", f"custom_reward_function.remote.url={service}/score")
    builtin, remote = metrics(tmp_path / "builtin"), metrics(tmp_path / "remote")
    assert any(r["critic/score/mean"] > 0 for r in remote[1:])
    assert all(r["reward/errors"] == 0 and r["reward/remote_skipped"] == 0 for r in remote[1:])
    assert all(0 < r["reward/remote_latency_s"] < 1.0 for r in remote[1:])
    remote_only = ("reward/remote_",)
    assert [without_volatile(r) for r in builtin] == [
        {k: v for k, v in without_volatile(r).items() if not k.startswith(remote_only)} for r in remote
    ]


def test_a_failing_service_scores_zero_counts_errors_and_the_run_finishes(service, tmp_path):
    proc = _train(
        tmp_path / "broken",
        f"custom_reward_function.remote.url={service}/broken",
        "custom_reward_function.remote.retries=1",
        "custom_reward_function.remote.backoff_s=0.01",
        "custom_reward_function.remote.circuit_breaker_failures=20",
        "custom_reward_function.remote.circuit_breaker_cooldown_s=600",
    )
    assert "step 3/3" in proc.stdout
    rows = metrics(tmp_path / "broken")
    responses = 8 * 8  # prompts x samples per step
    assert [r["critic/score/mean"] for r in rows[1:]] == [0.0, 0.0, 0.0]
    assert [r["reward/errors"] for r in rows[1:]] == [responses] * 3
    # validation before training (32 responses) already failed 20 times in a row: the breaker is open
    # for the rest of the run, so no step sends a request
    assert [r["reward/remote_skipped"] for r in rows[1:]] == [responses] * 3
    assert [r["reward/remote_retries"] for r in rows[1:]] == [0.0] * 3
    assert rows[-1]["val-aux/reward/errors"] == 32 and rows[0]["val-aux/reward/errors"] == 32


def test_remote_scores_requested_during_generation_give_the_same_run(service, tmp_path):
    """The native engine in-process with launch_reward_fn_async: every response's request is sent
    as it ends, during generation (reward/streamed_fraction 1), by the helper process (the default),
    and the run's metrics are those of scoring in the foreground from the trainer's own threads."""
    common = (f"custom_reward_function.remote.url={service}/score", "actor_rollout_ref.rollout.name=native")
    _train(tmp_path / "foreground", *common, "custom_reward_function.remote.in_process=true")
    _train(tmp_path / "stream", *common, "reward_model.launch_reward_fn_async=true")
    fg, st = metrics(tmp_path / "foreground"), metrics(tmp_path / "stream")
    steps = [r for r in st if "critic/score/mean" in r]
    assert [r["reward/streamed_fraction"] for r in steps] == [1.0] * 3
    assert any(r["critic/score/mean"] > 0 for r in steps)
    volatile = ("reward/remote_latency_s", "reward/score_s", "reward/streamed_fraction")
    assert [{k: v for k, v in without_volatile(r).items() if k not in volatile} for r in st] == [
        {k: v for k, v in without_volatile(r).items() if k not in volatile} for r in fg
    ]
