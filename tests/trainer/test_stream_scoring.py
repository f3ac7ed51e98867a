"""Scoring responses as they end (hybridrl/rewards/stream.py): the same ScoreResult as scoring the
finished batch, row for row, whatever order and grouping the rows are reported in."""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rewards.pool import Target, WorkerPool
from hybridrl.rewards.remote import RemoteReward
from hybridrl.rewards.scorer import BatchScorer, FunctionScorer
from hybridrl.rewards.stream import ScoreStream

N = 3  # samples per prompt
WORDS = ["seven", "42", "x", "", "oops", "4", "nine", "13", "1e3", "7"]


def scorer(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "oops":
        raise ValueError("a scorer bug on one response")
    return {"score": float(solution_str == ground_truth), "length": len(solution_str), "prompt": extra_info["i"]}


def decode(tokens):
    return [" ".join(WORDS[t] for t in toks) for toks in tokens]


def batch_of(rng, prompts_n):
    """A generated batch: `prompts_n` prompts x N responses of random token ids; its prompts."""
    truths = [rng.choice(WORDS) for _ in range(prompts_n)]
    prompts = Batch(
        {},
        {
            K.DATA_SOURCE: ["arith"] * prompts_n,
            K.GROUND_TRUTH: truths,
            K.EXTRA_INFO: [{"i": i} for i in range(prompts_n)],
        },
    )
    tokens = [np.array([rng.randrange(len(WORDS)) for _ in range(rng.randrange(1, 3))]) for _ in range(prompts_n * N)]
    out = Batch(
        {},
        {
            K.DATA_SOURCE: ["arith"] * (prompts_n * N),
            K.GROUND_TRUTH: [truths[r // N] for r in range(prompts_n * N)],
            K.EXTRA_INFO: [{"i": r // N} for r in range(prompts_n * N)],
            K.RESPONSE_TEXT: decode(tokens),
        },
    )
    return prompts, out, tokens


def report(stream, tokens, rows, rng):
    """Report `rows` in random groups, as the engine's decode loop would."""
    rows = list(rows)
    rng.shuffle(rows)
    while rows:
        k = rng.randrange(1, 6)
        group, rows = rows[:k], rows[k:]
        stream.finished(np.array(group), [tokens[r] for r in group])


def whole(out, scorer):
    return scorer.score_batch(out[K.DATA_SOURCE], out[K.RESPONSE_TEXT], out[K.GROUND_TRUTH], out[K.EXTRA_INFO])


def in_threads(fn):
    return FunctionScorer(WorkerPool(fn, kind="thread", timeout_s=30))


@pytest.mark.parametrize("kind", ["thread", "fork"])
def test_the_streamed_result_is_the_whole_batchs(kind):
    rng = random.Random(0)
    prompts, out, tokens = batch_of(rng, 17)
    fn = FunctionScorer(WorkerPool(scorer, kind=kind, timeout_s=30))
    stream = ScoreStream(fn, prompts, N, decode, min_rows=4, max_wait_s=0.001)
    report(stream, tokens, range(len(tokens)), rng)
    got, streamed = stream.result(out)
    want = whole(out, in_threads(scorer))
    fn.close()
    assert streamed == len(tokens)
    assert got.scores == want.scores and got.extras == want.extras
    assert got.num_errors == want.num_errors > 0  # the "oops" responses: scored 0 and counted, as in a batch
    assert sum(got.scores) > 0  # some responses are right


def test_rows_not_reported_or_decoded_differently_are_scored_at_the_join():
    rng = random.Random(1)
    prompts, out, tokens = batch_of(rng, 9)
    stream = ScoreStream(in_threads(scorer), prompts, N, decode, min_rows=1)
    report(stream, tokens, range(5, len(tokens)), rng)  # rows 0-4 never reported (an engine that does not stream)
    texts = list(out[K.RESPONSE_TEXT])
    texts[7] = texts[7] + " and more"  # the batch's text of row 7 is not what was streamed
    out[K.RESPONSE_TEXT] = texts
    got, streamed = stream.result(out)
    want = whole(out, in_threads(scorer))
    assert streamed == len(tokens) - 6
    assert got.scores == want.scores and got.extras == want.extras and got.num_errors == want.num_errors


def test_scoring_runs_before_the_join():
    """The reported rows are scored while the caller goes on (the engine keeps decoding), in the
    scorer's own thread: the stream's thread only decodes and submits."""
    rng = random.Random(2)
    prompts, out, tokens = batch_of(rng, 4)
    seen = threading.Event()

    def slow(**kw):
        seen.set()
        time.sleep(0.01)
        return scorer(**kw) if kw["solution_str"] != "oops" else 0.0

    stream = ScoreStream(in_threads(slow), prompts, N, decode, min_rows=1)
    stream.finished(np.array([0, 1]), tokens[:2])
    assert seen.wait(timeout=30)  # called before result()
    report(stream, tokens, range(2, len(tokens)), rng)
    got, streamed = stream.result(out)
    assert streamed == len(tokens) and got.scores == whole(out, in_threads(scorer)).scores
    assert not stream._thread.is_alive()


def test_a_scorer_that_fails_as_a_whole_raises_at_the_join():
    def gone(calls):
        raise RuntimeError("the pool is gone")

    rng = random.Random(3)
    prompts, out, tokens = batch_of(rng, 3)
    broken = WorkerPool(scorer, kind="thread")
    broken.map = gone  # a pool whose every call fails
    stream = ScoreStream(FunctionScorer(broken), prompts, N, decode, min_rows=1)
    report(stream, tokens, range(len(tokens)), rng)
    with pytest.raises(RuntimeError, match="the pool is gone"):
        stream.result(out)


def test_process_pool_scoring_streams_too(tmp_path):
    """A custom reward file scored in worker processes (the trainer's default for custom code)."""
    path = tmp_path / "reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return float(solution_str == ground_truth) + 0.5 * extra_info['i']\n"
    )
    rng = random.Random(4)
    prompts, out, tokens = batch_of(rng, 6)
    with FunctionScorer(WorkerPool(Target(str(path), "compute_score"), kind="process", num_workers=2, timeout_s=60)) as pool:
        stream = ScoreStream(pool, prompts, N, decode, min_rows=3)
        report(stream, tokens, range(len(tokens)), rng)
        got, streamed = stream.result(out)
        want = whole(out, pool)
    assert streamed == len(tokens) and got.scores == want.scores
    assert max(got.scores) >= 2.5  # extra_info reached the worker: prompt 5's responses score >= 2.5


def test_the_trainer_streams_only_scorers_in_worker_processes_or_remote(tmp_path):
    """Scorers in threads of this process (the built-in ones) would compete with the decode loop;
    a batched function takes the whole batch."""
    path = tmp_path / "reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n")
    with FunctionScorer(WorkerPool(Target(str(path), "compute_score"), kind="process", num_workers=1)) as pool:
        assert pool.streams
    with FunctionScorer(WorkerPool(scorer, kind="fork", num_workers=1)) as forked:  # given in Python
        assert forked.streams
    assert RemoteReward("http://127.0.0.1:9/score").streams
    assert not in_threads(scorer).streams
    assert not BatchScorer(WorkerPool(scorer, kind="thread")).streams


class SlowService:
    """An HTTP scorer on 127.0.0.1 taking 20 ms per request; /500 fails every request."""

    def __init__(self):
        self.requests = 0
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with service.lock:
                    service.requests += 1
                time.sleep(0.02)
                if self.path == "/500":
                    payload, code = b"overloaded", 500
                else:
                    right = float(body["solution_str"] == body["ground_truth"])
                    payload, code = json.dumps({"score": right, "prompt": body["extra_info"]["i"]}).encode(), 200
                self.send_response(code)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("process", [False, True], ids=["threads", "helper-process"])
@pytest.mark.parametrize("path", ["/score", "/500"])
def test_a_remote_scorers_requests_start_as_rows_end(path, process):
    """The stream submits each reported row's request at once (the join only reads the answers);
    the result, failures and the remote metrics included, is score_batch's of the whole batch."""
    service = SlowService()
    try:
        rng = random.Random(5)
        prompts, out, tokens = batch_of(rng, 8)
        remote = RemoteReward(service.url + path, max_concurrency=8, retries=0, circuit_breaker_failures=0, process=process)
        stream = ScoreStream(remote, prompts, N, decode, min_rows=4, max_wait_s=0.001)
        report(stream, tokens, range(len(tokens)), rng)
        deadline = time.monotonic() + 30
        while service.requests < len(tokens) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert service.requests == len(tokens)  # all sent before the join
        got, streamed = stream.result(out)
        want = whole(out, remote)
        assert streamed == len(tokens) and service.requests == 2 * len(tokens)
        assert got.scores == want.scores and got.extras == want.extras and got.num_errors == want.num_errors
        assert set(got.metrics) == set(want.metrics) and got.metrics["remote_skipped"] == want.metrics["remote_skipped"] == 0
        assert (got.num_errors == len(tokens)) == (path == "/500")
        assert 0.02 <= got.metrics["remote_latency_s"] < 5
        remote.close()
    finally:
        service.close()
