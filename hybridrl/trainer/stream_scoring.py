"""Score responses while the rest of the batch is still decoding.

With `reward_model.launch_reward_fn_async` and the actor in this process, the native engine
reports each sequence as it ends (`NativeEngine.generate(on_finish=...)`). The report only queues
the tokens: the decode loop never waits for a reward function. A background thread decodes the
text and calls the reward function on whatever has ended since its last call, through the run's
own `WorkerPool` (custom code in worker processes, the built-in scorers in a thread), so a slow
scorer (code execution, a sandbox) runs during generation instead of after it.

The result is the same as scoring the finished batch: at the join, a row whose streamed text is
not the batch's RESPONSE_TEXT, or that was never reported (an engine that does not stream), is
scored then, and the outcomes are assembled in row order exactly as `score_batch` would.
The trainer streams only a scorer in worker processes (`streamable`); the class itself takes
any per-response function or pool.
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
from hybridrl.rewards.pool import Outcome, WorkerPool

_CLOSE = None


def streamable(compute_score: Any) -> bool:
    """Whether the run's scorer is worth running during generation: a per-response function in
    worker processes (a custom reward file, `WorkerPool(kind="process")`). The built-in scorers
    and functions given in Python run in threads of this process: they are fast, and during
    decoding they would compete with the decode loop for the interpreter (measured: generation
    11% slower with the GSM8K scorer, BENCHMARKS.md), so they are scored after it. The batch and
    prime managers and the remote scorer take the whole batch."""
    return isinstance(compute_score, WorkerPool) and compute_score.kind == "process"


class StreamScorer:
    """Scores the rows `finished` reports, in a thread of its own; `result` joins it.

    `prompts`: the generate call's prompts (row r of the output answers prompt r // n).
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
        self.scored: dict[int, tuple[str, Outcome]] = {}  # output row -> (the text scored, its outcome)
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
            calls = [
                dict(data_source=s, solution_str=t, ground_truth=g, extra_info=e)
                for s, t, g, e in zip(sources, texts, truths, extras)
            ]
            for row, text, outcome in zip(rows, texts, call_each(self.compute_score, calls)):
                self.scored[row] = (text, outcome)
        except BaseException as e:  # noqa: BLE001  the join scores these rows again and raises there
            self.failure = e
        self.busy_s += time.perf_counter() - t0

    def result(self, batch: Batch) -> tuple[ScoreResult, int]:
        """The batch's `ScoreResult`, row for row as `score_batch` of the whole batch, and how
        many rows were scored while generating (their text matched); the others are scored now."""
        self.close()
        texts = list(batch[K.RESPONSE_TEXT])
        sources = list(batch[K.DATA_SOURCE])
        outcomes: list[Outcome | None] = [None] * len(texts)
        for row, (text, outcome) in self.scored.items():
            if row < len(texts) and texts[row] == text:
                outcomes[row] = outcome
        streamed = sum(o is not None for o in outcomes)
        todo = [r for r, o in enumerate(outcomes) if o is None]
        if todo:
            t0 = time.perf_counter()
            calls = [
                dict(
                    data_source=sources[r],
                    solution_str=texts[r],
                    ground_truth=batch[K.GROUND_TRUTH][r],
                    extra_info=batch[K.EXTRA_INFO][r],
                )
                for r in todo
            ]
            for r, outcome in zip(todo, call_each(self.compute_score, calls)):
                outcomes[r] = outcome
            self.busy_s += time.perf_counter() - t0
        return outcomes_to_result(outcomes, sources), streamed


def decode_responses(run) -> Callable[[list[np.ndarray]], list[str]] | None:
    """The run's tokenizer decoding responses as the native engine does (special tokens dropped)."""
    tokenizer = getattr(run, "tokenizer", None)
    if tokenizer is None:
        return None
    return lambda tokens: tokenizer.batch_decode([t.tolist() for t in tokens], skip_special_tokens=True)
