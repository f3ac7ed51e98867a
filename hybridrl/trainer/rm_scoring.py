"""The reward model's worker group as a `Scorer` (hybridrl/rewards/scorer.py), for the reward stage.

`submit` sends the generated batch to the group's `compute_rm_score` (a sequence classifier,
hybridrl/workers/reward_model.py, or an LLM judge, hybridrl/workers/judge.py) and returns at once:
on a pool of its own the reward model scores while the actor computes log-probs. How its scores
combine with the rule score is the stage's (hybridrl/rewards/stage.py). It lives here, not in
rewards/, because it holds a worker group: rewards/ imports nothing from workers/ or trainer/.

Its scores are taken as the model gives them (no range check: a reward model's scale is its own);
a judge's verdicts without a score are scored 0 and counted in reward_model/judge_parse_errors.
"""

from __future__ import annotations

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rewards.result import ScoreInputs, ScoreResult
from hybridrl.rewards.scorer import Pending, Scorer


class RewardModelScorer(Scorer):
    """`group`: the reward model's worker group; `generative`: an LLM judge (reward_model.generative.enable)."""

    def __init__(self, group, generative: bool = False):
        self.group, self.generative = group, generative
        self.name = "the LLM judge" if generative else "the reward model"

    def submit(self, inputs: ScoreInputs) -> Pending:
        call = self.group.submit("compute_rm_score", inputs.batch)
        return Pending(lambda: self._result(call.get()))

    def _result(self, out: Batch) -> ScoreResult:
        """RM_SCORES (B,) as the scores; the judge's unparsable verdicts as judge_parse_errors."""
        metrics = {"judge_parse_errors": float(out[K.JUDGE_PARSE_FAILED].sum())} if self.generative else {}
        return ScoreResult(scores=out[K.RM_SCORES].tolist(), metrics=metrics)
