"""Score responses while the rest of the batch is still decoding.

With `reward_model.launch_reward_fn_async` and the actor in this process, the native engine
reports each sequence as it ends (`NativeRolloutEngine.generate(on_finish=...)`). The report only queues
the tokens: the decode loop never waits for a reward function. A background thread decodes the
text and hands whatever has ended since its last call to the run's scorer: its `WorkerPool` (a
custom reward file's worker processes), or the remote scorer's request threads (the requests start
at once, the answers are read at the join). A slow scorer (code execution, a sandbox, a service)
thus runs during generation instead of after it.

The result is the same as scoring the finished batch: at the join, a row whose streamed text is
not the batch's RESPONSE_TEXT, or that was never reported (an engine that does not stream), is
scored then, and the outcomes are assembled in row order exactly as `score_batch` would.
The trainer streams only scorers that do not run in its own threads (`streamable`); the class
itself takes any per-response function, pool or `RemoteReward`.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

import numpy as np

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rewards.manager import ScoreResult, call_each, outcomes_to_result
from hybridrl.rewards.pool import WorkerPool
from hybridrl.rewards.remote import RemoteReward

_CLOSE = None


def streamable(compute_score: Any) -> bool:
    """Whether the run's scorer is worth running during generation: a per-response function in
    worker processes (a custom reward file, `WorkerPool(kind="process")`), or the remote scorer
    (its requests wait on the network). The built-in scorers and functions given in Python run in
    threads of this process: they are fast, and during decoding they would compete with the
    decode loop for the interpreter (measured: generation 11% slower with the GSM8K scorer,
    BENCHMARKS.md), so they are scored after it. The batch and prime managers take the whole batch."""
    return isinstance(compute_score, RemoteReward) or (isinstance(compute_score, WorkerPool) and compute_score.kind == "process")


class StreamScorer:
    """Scores the rows `finished` reports, in a thread of its own; `result` joins it.

    `prompts`: the generate call's prompts (row r of the output answers prompt r // n).
    A remote scorer's requests are started as rows arrive and read at the join.
    `decode(list of token arrays) -> texts`: the engine's own decoding of a response.
    The thread scores at least `min_rows` rows per call, or what ended within `max_wait_s`."""

    def __init__(
        self,
        compute_score,
        prompts: Batch,
        n: int,
        decode: Callable[[list[np.ndarray]], list[str]],
        min_rows: int = 64,
        max_wait_s: float = 0.05,
    ):
        self.compute_score, self.n, self.decode = compute_score, n, decode
        self.fields = [list(prompts[k]) for k in (K.DATA_SOURCE, K.GROUND_TRUTH, K.EXTRA_INFO)]
        self.min_rows, self.max_wait_s = min_rows, max_wait_s
        self.scored: dict[int, tuple[str, Any]] = {}  # output row -> (the text scored, its Outcome or Future)
        self.busy_s = 0.0  # time spent scoring in the thread
        self.failure: BaseException | None = None  # the scorer failed as a whole: the join scores the rest
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="hybridrl-stream-reward", daemon=True)
        self._thread.start()

    def finished(self, rows: np.ndarray, tokens: list[np.ndarray]) -> None:
        """The engine's `on_finish`: queue the ended rows (the decode loop waits on this call only)."""
        self._queue.put((rows, tokens))

    def close(self) -> None:
        """Stop the thread after what is queued (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(_CLOSE)
            self._thread.join()

    def _run(self) -> None:
        closing = False
        while not closing:
            item = self._queue.get()
            rows, tokens = [], []
            deadline = time.monotonic() + self.max_wait_s
            while True:
                if item is _CLOSE:
                    closing = True
                    break
                rows.extend(int(r) for r in item[0])
                tokens.extend(item[1])
                left = deadline - time.monotonic()
                if len(rows) >= self.min_rows or left <= 0:
                    break
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
            if rows and self.failure is None:
                self._score(rows, tokens)

    def _score(self, rows: list[int], tokens: list[np.ndarray]) -> None:
        t0 = time.perf_counter()
        try:
            texts = self.decode(tokens)
            sources, truths, extras = ([f[r // self.n] for r in rows] for f in self.fields)
            for row, text, handle in zip(rows, texts, self._start(sources, texts, truths, extras)):
                self.scored[row] = (text, handle)
        except BaseException as e:  # noqa: BLE001  the join scores these rows again and raises there
            self.failure = e
        self.busy_s += time.perf_counter() - t0

    def _start(self, sources, texts, truths, extras) -> list:
        """Score these responses: their Outcomes, or (remote) their requests' Futures, started now."""
        fields = zip(sources, texts, truths, extras)
        calls = [dict(data_source=s, solution_str=t, ground_truth=g, extra_info=e) for s, t, g, e in fields]
        if isinstance(self.compute_score, RemoteReward):  # the answers are read at the join
            return [self.compute_score.submit(**c) for c in calls]
        return call_each(self.compute_score, calls)

    def result(self, batch: Batch) -> tuple[ScoreResult, int]:
        """The batch's `ScoreResult`, row for row as `score_batch` of the whole batch, and how
        many rows were scored while generating (their text matched); the others are scored now."""
        self.close()
        texts, sources = list(batch[K.RESPONSE_TEXT]), list(batch[K.DATA_SOURCE])
        handles: list[Any] = [None] * len(texts)  # per row: its Outcome, or its request's Future (remote)
        for row, (text, handle) in self.scored.items():
            if row < len(texts) and texts[row] == text:
                handles[row] = handle
        todo = [r for r, h in enumerate(handles) if h is None]
        t0 = time.perf_counter()
        rest = self._start(*([f[r] for r in todo] for f in (sources, texts, batch[K.GROUND_TRUTH], batch[K.EXTRA_INFO])))
        for r, handle in zip(todo, rest):
            handles[r] = handle
        if isinstance(self.compute_score, RemoteReward):
            result = RemoteReward.collect(handles, sources)  # waits for the requests still in flight
        else:
            result = outcomes_to_result(handles, sources)
        self.busy_s += time.perf_counter() - t0
        return result, len(texts) - len(todo)


def decode_responses(run) -> Callable[[list[np.ndarray]], list[str]] | None:
    """The run's tokenizer decoding responses as the native engine does (special tokens dropped)."""
    tokenizer = getattr(run, "tokenizer", None)
    if tokenizer is None:
        return None
    return lambda tokens: tokenizer.batch_decode([t.tolist() for t in tokens], skip_special_tokens=True)
