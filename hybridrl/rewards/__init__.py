"""Rewards: plain ``score(response, ground_truth) -> float`` functions, the dispatch on
``data_source``, user-supplied reward functions and services, all behind one `Scorer` protocol
(scorer.py), and the reward stage of the RL step (stage.py)."""

from .custom import load_custom_reward_fn
from .registry import KNOWN_DATA_SOURCES, check_reward_kwargs, default_compute_score, needs_ground_truth
from .result import ScoreFailure, ScoreInputs, ScoreResult
from .scorer import Scorer, score_batch

__all__ = [
    "KNOWN_DATA_SOURCES",
    "ScoreFailure",
    "ScoreInputs",
    "ScoreResult",
    "Scorer",
    "check_reward_kwargs",
    "default_compute_score",
    "load_custom_reward_fn",
    "needs_ground_truth",
    "score_batch",
]
