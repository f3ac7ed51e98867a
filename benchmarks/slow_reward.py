"""A slow scorer for timing runs: the built-in scorer of the row's data_source plus `delay_s` of
waiting per response, standing in for code execution or a remote service. Used as
    custom_reward_function.path=benchmarks/slow_reward.py custom_reward_function.reward_kwargs="{delay_s: 0.01, ...}"
(the other reward_kwargs go to the built-in scorer)."""

import time

from hybridrl.rewards import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, delay_s: float = 0.002, **kwargs):
    time.sleep(delay_s)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
