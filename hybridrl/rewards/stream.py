"""Score responses while the rest of the batch is still decoding (the reward stage's streaming,
hybridrl/rewards/stage.py).

With `reward_model.launch_reward_fn_async` and the actor in this process, the native engine reports
each sequence as it ends (`generate(on_finish=...)`). The report only queues the tokens: the decode
loop never waits for a reward function. A thread of `ScoreStream` decodes the text and submits
whatever has ended since its last turn to the run's `Scorer` (its worker processes, or a service's
requests: the scorers whose `streams` is true), so a slow scorer (code execution, a sandbox, a
service) runs during generation instead of after it.

The result is the same as scoring the finished batch: at the join, a row whose streamed text is not
the batch's RESPONSE_TEXT, or that was never reported (an engine that does not stream), is scored
then, and the per-response outcomes are assembled in row order into the `ScoreResult` that scoring
the whole batch gives.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch

from .result import Outcome, ScoreInputs, ScoreResult
from .scorer import Pending, Scorer

_CLOSE = None


class ScoreStream:
    """Scores the rows `finished` reports, from a thread of its own; `result` joins it.

    `prompts`: the generate call's prompts (row r of the output answers prompt r // n).
    `decode(list of token arrays) -> texts`: the engine's own decoding of a response.
    The thread submits at least `min_rows` rows at a time, or what ended within `max_wait_s`."""

    def __init__(
        self,
        scorer: Scorer,
        prompts: Batch,
        n: int,
        decode: Callable[[list[np.ndarray]], list[str]],
        min_rows: int = 64,
        max_wait_s: float = 0.05,
    ):
        self.scorer, self.n, self.decode = scorer, n, decode
        self.fields = [list(prompts[k]) for k in (K.DATA_SOURCE, K.GROUND_TRUTH, K.EXTRA_INFO)]
        self.min_rows, self.max_wait_s = min_rows, max_wait_s
        self.scored: dict[int, tuple[str, Pending, int]] = {}  # output row -> (the text scored, its part, its place there)
        self.busy_s = 0.0  # time spent decoding and submitting in the thread
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
                self._submit(rows, tokens)

    def _submit(self, rows: list[int], tokens: list[np.ndarray]) -> None:
        t0 = time.perf_counter()
        try:
            texts = self.decode(tokens)
            sources, truths, extras = ([f[r // self.n] for r in rows] for f in self.fields)
            part = self.scorer.submit(ScoreInputs(sources, texts, truths, extras))
            for place, (row, text) in enumerate(zip(rows, texts)):
                self.scored[row] = (text, part, place)
        except BaseException as e:  # noqa: BLE001  the join scores these rows again and raises there
            self.failure = e
        self.busy_s += time.perf_counter() - t0

    def result(self, batch: Batch) -> tuple[ScoreResult, int]:
        """The batch's `ScoreResult`, row for row as the scorer's of the whole batch, and how many rows
        were scored while generating (their text matched); the others are scored now."""
        self.close()
        t0 = time.perf_counter()
        texts, sources = list(batch[K.RESPONSE_TEXT]), list(batch[K.DATA_SOURCE])
        outcomes: list[Outcome | None] = [None] * len(texts)
        parts: dict[Pending, list[Outcome]] = {}  # each part's outcomes, waited for once
        for row, (text, part, place) in self.scored.items():
            if row < len(texts) and texts[row] == text:
                if part not in parts:
                    parts[part] = part.outcomes()
                outcomes[row] = parts[part][place]
        todo = [r for r, o in enumerate(outcomes) if o is None]
        if todo:
            fields = (sources, texts, batch[K.GROUND_TRUTH], batch[K.EXTRA_INFO])
            rest = self.scorer.submit(ScoreInputs(*([f[r] for r in todo] for f in fields))).outcomes()
            for r, outcome in zip(todo, rest):
                outcomes[r] = outcome
        self.busy_s += time.perf_counter() - t0
        return ScoreResult.of(outcomes, sources, self.scorer.name), len(texts) - len(todo)
