"""Score responses with an HTTP service (`custom_reward_function.remote.url`).

One POST per response, JSON in and out (docs/api.md, "Remote scoring"):

    request:  {"data_source": "arith", "solution_str": "55", "ground_truth": "55", "extra_info": {...}}
    response: 1.0            or    {"score": 1.0, "acc": 1.0, ...}   (other numbers become reward/<key>/mean)

A scoring service is another machine's code: it may be slow, down, overloaded or wrong. None of
that may stop a run, so each response's score is at worst 0, counted:

- at most `max_concurrency` requests are in flight; each attempt has `timeout_s`;
- a timeout, a refused connection, HTTP 429 or 5xx is retried `retries` times, waiting
  `backoff_s * 2**(k-1)` before retry k; a 4xx other than 429 or an answer that is not a number
  (or a dict with a numeric "score") is not retried: asking again gets the same answer;
- a response whose attempts all failed scores 0 and counts in `reward/errors` (`reward/timeouts`
  when the last attempt timed out);
- after `circuit_breaker_failures` failed responses in a row the breaker opens: for
  `circuit_breaker_cooldown_s` no request is sent and every response scores 0 at once (counted in
  `reward/errors` and `reward/remote_skipped`), so a dead service costs seconds per step, not
  `timeout_s x retries` per response; then one request is let through, and a success closes it.

Metrics per batch: `reward/remote_latency_s` (mean seconds per scored response, retries
included), `reward/remote_retries`, `reward/remote_skipped`.

The stdlib only (`urllib.request`, a thread pool): no dependency, and one request per thread is
what a blocking client with a timeout does best. With `process=True` (the trainer's default,
`custom_reward_function.remote.in_process=false`) those threads live in a helper process
(remote_process.py, running `serve_requests` below), so that their Python does not compete with
the trainer's.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from .remote_process import RequestProcess
from .result import Outcome, ScoreFailure, ScoreInputs
from .scorer import Pending, Scorer

__all__ = ["RemoteReward", "RemoteRewardError"]


class RemoteRewardError(RuntimeError):
    """A response the service did not score (after the retries, or with the circuit breaker open)."""


class RemoteReward(Scorer):
    """An HTTP reward function: a `Scorer` (hybridrl/rewards/scorer.py) whose batches are scored
    `max_concurrency` requests at a time, or a function of one response.

    `RemoteReward(url)(data_source=..., solution_str=..., ground_truth=..., extra_info=...)` returns
    the service's number or dict, raising `RemoteRewardError` when it fails; `score`/`submit` are
    what the trainer uses (failures score 0 and are counted, see the module docstring).
    `process=True` makes their requests from a helper process (remote_process.py).
    """

    streams = True  # the requests wait on the network: they start as responses end

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        max_concurrency: int = 8,
        retries: int = 2,
        backoff_s: float = 0.5,
        circuit_breaker_failures: int = 5,
        circuit_breaker_cooldown_s: float = 30.0,
        headers: Mapping[str, str] | None = None,
        process: bool = False,
    ):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"custom_reward_function.remote.url must be an http:// or https:// URL, got {url!r}")
        self.url, self.timeout_s, self.max_concurrency = url, float(timeout_s), int(max_concurrency)
        self.retries, self.backoff_s = int(retries), float(backoff_s)
        self.breaker_failures, self.breaker_cooldown_s = int(circuit_breaker_failures), float(circuit_breaker_cooldown_s)
        self.headers = {"Content-Type": "application/json", **dict(headers or {})}
        self._lock = threading.Lock()
        self._failures_in_a_row = 0
        self._open_until = 0.0  # monotonic time the breaker closes again (0: closed)
        self._pool: cf.ThreadPoolExecutor | None = None
        self.process = bool(process)  # batches' requests made by a helper process (remote_process.py)
        self._process: RequestProcess | None = None
        self.name = f"the remote reward {url}"

    @classmethod
    def from_config(cls, remote) -> RemoteReward:
        """From `custom_reward_function.remote` (hybridrl.config.schema.RemoteRewardConfig)."""
        return cls(
            remote.url,
            timeout_s=remote.timeout_s,
            max_concurrency=remote.max_concurrency,
            retries=remote.retries,
            backoff_s=remote.backoff_s,
            circuit_breaker_failures=remote.circuit_breaker_failures,
            circuit_breaker_cooldown_s=remote.circuit_breaker_cooldown_s,
            headers=remote.headers,
            process=not remote.in_process,
        )

    # -- one response ------------------------------------------------------------------------
    def __call__(self, data_source: str, solution_str: str, ground_truth: Any = None, extra_info: Any = None):
        outcome = self._score_one(
            {"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth, "extra_info": extra_info}
        )
        if outcome.error is not None:
            raise RemoteRewardError(outcome.error)
        return outcome.value

    def _score_one(self, payload: dict) -> Outcome:
        """The service's answer, or its failure, with the request's stats (reward/remote_*)."""
        t0 = time.monotonic()
        if self._breaker_open():
            failure = ScoreFailure(f"circuit breaker open: {self.breaker_failures} failures in a row, no calls for a while")
            return Outcome.failed(failure, **_stats(None, 0, skipped=1))
        body = json.dumps(payload, default=_jsonable).encode()
        attempt = 0
        while True:
            try:
                value = self._post(body)
                break
            except ScoreFailure as e:
                if not e.retry or attempt >= self.retries:
                    self._record(ok=False)
                    return Outcome.failed(e, **_stats(time.monotonic() - t0, attempt))
                attempt += 1
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
        self._record(ok=True)
        return Outcome(value=value, stats=_stats(time.monotonic() - t0, attempt))

    def _post(self, body: bytes) -> Any:
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                text = reply.read()
        except urllib.error.HTTPError as e:
            retry = e.code == 429 or e.code >= 500
            raise ScoreFailure(f"{self.url} answered HTTP {e.code} {e.reason}", retry) from None
        except (TimeoutError, socket.timeout) as e:
            raise ScoreFailure(f"{self.url} did not answer within {self.timeout_s:g} s ({e})", True, timed_out=True) from None
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            timed_out = isinstance(reason, (TimeoutError, socket.timeout))
            raise ScoreFailure(f"cannot reach {self.url}: {reason}", True, timed_out=timed_out) from None
        try:
            value = json.loads(text)
        except (ValueError, UnicodeDecodeError):
            raise ScoreFailure(
                f'{self.url} answered {text[:80]!r}, not JSON; answer a number or {{"score": ...}}', False
            ) from None
        if not (isinstance(value, (int, float)) and not isinstance(value, bool)) and not (
            isinstance(value, dict) and isinstance(value.get("score"), (int, float))
        ):
            raise ScoreFailure(f'{self.url} answered {value!r:.80}; answer a number or {{"score": <number>, ...}}', False)
        return value

    # -- the circuit breaker -----------------------------------------------------------------
    def _breaker_open(self) -> bool:
        with self._lock:
            if self._open_until == 0.0 or time.monotonic() >= self._open_until:
                return False
            return True

    def _record(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self._failures_in_a_row, self._open_until = 0, 0.0
                return
            self._failures_in_a_row += 1
            if self.breaker_failures > 0 and self._failures_in_a_row >= self.breaker_failures:
                self._open_until = time.monotonic() + self.breaker_cooldown_s

    # -- a batch -----------------------------------------------------------------------------
    def submit(self, inputs: ScoreInputs) -> Pending:
        """Start every response's request (in the helper process with `process=True`); never raises
        for what the service does. The stream (hybridrl/rewards/stage.py) submits responses as they end."""
        futures = [self._request(payload) for payload in inputs.calls()]
        return Pending.per_response(lambda: [f.result() for f in futures], inputs.data_sources, self.name)

    def _request(self, payload: dict) -> cf.Future:
        """A Future of one response's `Outcome`."""
        if self.process and (helper := self._request_process()) is not None:
            return helper.submit(payload)
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="hybridrl-remote-reward")
        return self._pool.submit(self._score_one, payload)

    def _request_process(self) -> RequestProcess | None:
        """The helper process, started at the first request and again after it died (whose
        requests in flight scored 0 as errors)."""
        with self._lock:
            if self._process is None or not self._process.alive:
                if self._process is not None:
                    print("[hybridrl] warning: the remote scorer's request process exited; starting a new one", flush=True)
                    self._process.close(timeout_s=0.0)
                    self._process = None
                try:
                    self._process = RequestProcess(self._settings(), "hybridrl.rewards.remote:serve_requests", _unanswered)
                except (RuntimeError, OSError) as e:
                    print(f"[hybridrl] warning: {e}; making the requests from this process's threads", flush=True)
                    self.process = False
            return self._process

    def _settings(self) -> dict:
        """The constructor's arguments, for the helper process's own (threaded) RemoteReward."""
        return dict(
            url=self.url,
            timeout_s=self.timeout_s,
            max_concurrency=self.max_concurrency,
            retries=self.retries,
            backoff_s=self.backoff_s,
            circuit_breaker_failures=self.breaker_failures,
            circuit_breaker_cooldown_s=self.breaker_cooldown_s,
            headers=self.headers,
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._process is not None:
            self._process.close(timeout_s=1.0)
            self._process = None

    def __getstate__(self):  # picklable (e.g. inside a config sent to a Ray worker): no lock or threads
        state = dict(self.__dict__)
        state["_lock"], state["_pool"], state["_process"] = None, None, None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


def _stats(latency_s: float | None, retries: int, skipped: int = 0) -> dict:
    """One response's numbers for the batch's reward/remote_latency_s (mean seconds per response
    scored, retries included), reward/remote_retries and reward/remote_skipped (sums)."""
    return {"remote_latency_s": latency_s, "remote_retries": retries, "remote_skipped": skipped}


def _unanswered(message: str) -> Outcome:
    """A request the helper process could not answer: an error, no request made."""
    return Outcome.failed(ScoreFailure(message), **_stats(None, 0))


def serve_requests(requests: Connection, replies: Connection) -> None:
    """The helper process (remote_process.py): make each request with a threaded `RemoteReward`,
    send back each answer's `Outcome`."""
    scorer = RemoteReward(**requests.recv())
    replies.send("ready")
    lock = threading.Lock()

    def answer(index: int, future: cf.Future) -> None:
        with lock:
            try:
                replies.send((index, future.result()))
            except OSError:  # the parent is gone
                pass

    while True:
        try:
            message = requests.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        index, payload = message
        scorer._request(payload).add_done_callback(lambda future, index=index: answer(index, future))
    if scorer._pool is not None:
        scorer._pool.shutdown(wait=True)  # the requests in flight answer before the child exits


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays (parquet rows hold them) as plain JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
