"""The reward-model stage of the RL step: score with the reward model, combine with the rule score.

The rule-based (or custom) score is computed first, as without a reward model (`RolloutSampler`);
the reward model's call is submitted next so that, on its own pool, it scores while the actor
computes log-probs; before the advantages the step's score becomes

    score = reward_model.reward_weight x RM score + reward_model.rule_weight x rule score

placed on the last response token. The defaults (1, 0) are verl's semantics: with a reward model,
verl's naive reward manager returns the RM scores and never calls the rule function. Here the rule
score is still computed and logged, so that the true task accuracy can be watched beside the RM
score (reward hacking shows as the one rising while the other does not).

Metrics: reward_model/score/{mean,max,min}, reward_model/rule_score/mean; timing_s/reward_model;
with a generative judge, reward_model/judge_parse_errors (verdicts without a score, scored 0).
"""

from __future__ import annotations

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.scoring import last_token_scores


class RewardModelStage:
    """`submit(batch)` starts the scoring; `apply(batch, pending)` waits and combines. Both do
    nothing when the run has no reward model, so the RL step calls them unconditionally."""

    def __init__(self, group, rm_cfg, timer_name: str = "reward_model"):
        self.group, self.cfg, self.name = group, rm_cfg, timer_name

    def submit(self, batch: Batch, timer: StageTimer):
        if self.group is None:
            return None
        with timer(self.name):
            return self.group.submit("compute_rm_score", batch)

    def apply(self, batch: Batch, pending, timer: StageTimer) -> dict[str, float]:
        """Writes RM_SCORES and the combined TOKEN_LEVEL_SCORES; returns the metrics."""
        if pending is None:
            return {}
        with timer(self.name):
            out = pending.get()
        rm = out[K.RM_SCORES]  # (B,)
        rule = batch[K.TOKEN_LEVEL_SCORES].sum(-1)  # (B,) the rule score, shaped (overlong penalty) when configured
        batch[K.RM_SCORES] = rm
        combined = self.cfg.reward_weight * rm + self.cfg.rule_weight * rule  # (B,)
        batch[K.TOKEN_LEVEL_SCORES] = last_token_scores(combined, batch[K.RESPONSE_MASK])
        parse_errors = out[K.JUDGE_PARSE_FAILED].sum() if K.JUDGE_PARSE_FAILED in out else None  # generative judge only
        return {
            **({} if parse_errors is None else {"reward_model/judge_parse_errors": float(parse_errors)}),
            "reward_model/score/mean": float(rm.mean()),
            "reward_model/score/max": float(rm.max()),
            "reward_model/score/min": float(rm.min()),
            "reward_model/rule_score/mean": float(rule.mean()),
        }
