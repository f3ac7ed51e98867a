"""The pieces of dynamic sampling: which groups are kept, and joining rounds of different widths."""

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.trainer.dynamic_sampling import concat_padded, prompts_of, varied_groups


def round_batch(prompt_width, response_width, uids, pad=9):
    b = len(uids)
    return Batch(
        {
            K.PROMPTS: torch.arange(b * prompt_width).view(b, prompt_width),
            K.PROMPT_MASK: torch.ones(b, prompt_width, dtype=torch.long),
            K.RESPONSES: torch.ones(b, response_width, dtype=torch.long),
            K.RESPONSE_MASK: torch.ones(b, response_width),
            K.TOKEN_LEVEL_SCORES: torch.ones(b, response_width),
        },
        {
            K.UID: uids,
            K.DATA_SOURCE: ["arith"] * b,
            K.GROUND_TRUTH: ["1"] * b,
            K.EXTRA_INFO: [{}] * b,
            K.RAW_PROMPT: [f"p{u}" for u in uids],
            K.RESPONSE_TEXT: ["x"] * b,
        },
        {K.PAD_TOKEN_ID: pad},
    )


def test_groups_whose_metric_varies_are_kept_and_singletons_too():
    rows, groups = varied_groups(["a", "b", "a", "b", "c"], np.array([1.0, 2.0, 0.0, 2.0, 5.0]))
    assert (rows, groups) == ([0, 2, 4], 3)  # a varies (rows 0, 2); b is constant; c stands alone


def test_rounds_of_different_widths_join_with_prompts_left_and_responses_right_padded():
    joined = concat_padded([round_batch(2, 3, ["a", "a"]), round_batch(4, 1, ["b", "b"])])
    assert joined[K.PROMPTS].shape == (4, 4) and joined[K.RESPONSES].shape == (4, 3)
    assert joined[K.PROMPTS][0].tolist() == [9, 9, 0, 1]  # left-padded with the pad id
    assert joined[K.PROMPT_MASK][0].tolist() == [0, 0, 1, 1]
    assert joined[K.RESPONSES][2].tolist() == [1, 9, 9] and joined[K.RESPONSE_MASK][2].tolist() == [1, 0, 0]
    assert joined[K.TOKEN_LEVEL_SCORES][3].tolist() == [1, 0, 0]
    assert list(joined[K.UID]) == ["a", "a", "b", "b"]


def test_prompts_of_takes_one_row_per_group():
    prompts = prompts_of(round_batch(2, 3, ["a", "a", "b", "b"]), n=2)
    assert list(prompts[K.UID]) == ["a", "b"] and list(prompts[K.RAW_PROMPT]) == ["pa", "pb"]
    assert prompts[K.PROMPTS].tolist() == [[0, 1], [4, 5]] and K.RESPONSES not in prompts
