"""Names of the fields a `Batch` carries between stages — the one place they are documented.

Shapes: B = sequences in the batch, P = prompt length (left-padded), R = response length
(right-padded), T = P + R. Stages list what they read and write in their docstrings using
these constants; nothing probes a batch for optional keys.
"""

# -- written by the prompt loader -------------------------------------------------------------
PROMPTS = "prompts"  # (B, P) int64, left-padded prompt token ids
PROMPT_MASK = "prompt_mask"  # (B, P) int64, 1 on prompt tokens
UID = "uid"  # non-tensor str: one id per prompt, shared by its n samples (the GRPO group)
DATA_SOURCE = "data_source"  # non-tensor str: picks the reward function
GROUND_TRUTH = "ground_truth"  # non-tensor: the reference answer (may be None)
EXTRA_INFO = "extra_info"  # non-tensor dict: passed through to the reward function
RAW_PROMPT = "raw_prompt"  # non-tensor str: the prompt text after the chat template
RAW_CHAT = "raw_chat"  # non-tensor list of chat messages (None for a string prompt): re-rendered for a reward model
PAD_TOKEN_ID = "pad_token_id"  # meta int: the tokenizer's pad id (to right-pad ragged responses)

# -- written by the rollout engine ------------------------------------------------------------
RESPONSES = "responses"  # (B, R) int64, right-padded sampled token ids
RESPONSE_MASK = "response_mask"  # (B, R) float32, 1 on sampled tokens up to and incl. EOS
# multi-turn only: (B, R) float32, 1 on every response token, the model's and the tools'/users' (RESPONSE_MASK: the model's)
RESPONSE_ATTENTION_MASK = "response_attention_mask"
AGENT_REWARD = "agent_reward"  # (B,) float32, multi-turn only: tool and interaction rewards, added to the score
AGENT_TURNS = "agent_turns"  # (B,) int64, multi-turn only: assistant turns of the trajectory
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # (B, R) float32, the engine's log-prob of each token
RESPONSE_TEXT = "response_text"  # non-tensor str: decoded response, special tokens dropped
ROLLOUT_POLICY_VERSION = "rollout_policy_version"  # (B,) int64, policy updates applied before the sample was generated
ROLLOUT_TOKEN_VERSION = "rollout_token_version"  # (B, T) int64, partial rollouts: the pool's weights version per token
ROLLOUT_METRICS = "rollout_metrics"  # meta dict: the engine's metrics for the step (kv_cache_usage, ...)
# mixtures of experts, router replay (actor.router_replay.mode R3: the engine's; R2: the old-log-prob
# pass's): (B, T, L, k) int16, the k experts each token of prompts | responses was routed to in each
# of the L sparse layers; -1 where none (padding, a prompt's tokens taken from the prefix cache)
ROUTED_EXPERTS = "routed_experts"
NO_EXPERT = -1  # ROUTED_EXPERTS' filler

# -- written by reward / actor / reference / critic -------------------------------------------
TOKEN_LEVEL_SCORES = "token_level_scores"  # (B, R) the scalar score on the last response token
TOKEN_LEVEL_REWARDS = "token_level_rewards"  # (B, R) scores minus the in-reward KL penalty
OLD_LOG_PROBS = "old_log_probs"  # (B, R) the current policy's log-probs before the update
REF_LOG_PROBS = "ref_log_probs"  # (B, R) the frozen reference policy's log-probs
ENTROPY = "entropy"  # (B, R) per-token entropy of the current policy
VALUES = "values"  # (B, R) critic's value estimates
REWARD_BASELINES = "reward_baselines"  # (B,) ReMax: score of the greedy response to the prompt
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"  # (B, R) truncated pi_old / pi_rollout weights (algorithm.rollout_correction)
ADVANTAGES = "advantages"  # (B, R)
RETURNS = "returns"  # (B, R)

# -- preference / supervised batches (hybridrl/data/preference.py) ----------------------------
# A DPO batch holds B pairs: PROMPTS + CHOSEN and PROMPTS + REJECTED (both right-padded to the
# same width R). A KTO batch holds B examples as PROMPTS + RESPONSES with LABEL, plus the
# mismatched completions for the KL reference point. An SFT batch is PROMPTS + RESPONSES.
CHOSEN = "chosen"  # (B, R) int64, the preferred completion's token ids
CHOSEN_MASK = "chosen_mask"  # (B, R) float32
REJECTED = "rejected"  # (B, R) int64, the dispreferred completion's token ids
REJECTED_MASK = "rejected_mask"  # (B, R) float32
LABEL = "label"  # (B,) bool, KTO: the completion is desirable
KL_RESPONSES = "kl_responses"  # (B, R) int64, KTO: another row's completion (a fixed pairing), after prompt i
KL_RESPONSE_MASK = "kl_response_mask"  # (B, R) float32
REF_CHOSEN_LOGPS = "ref_chosen_logps"  # (B,) reference log-prob of CHOSEN, summed over tokens
REF_REJECTED_LOGPS = "ref_rejected_logps"  # (B,)
REF_LOGPS = "ref_logps"  # (B,) KTO: reference log-prob of RESPONSES, summed over tokens
REF_KL_LOGPS = "ref_kl_logps"  # (B,) KTO: reference log-prob of KL_RESPONSES
MARGIN = "margin"  # (B,) float32, reward-model training: the gap the pair's chosen score should exceed (0 = none)

# -- written by the reward-model worker (hybridrl/workers/reward_model.py) ---------------------
RM_SCORES = "rm_scores"  # (B,) float32, the reward model's score of each prompt + response
JUDGE_PARSE_FAILED = "judge_parse_failed"  # (B,) float32, generative RM: 1 where parse_fn found no score (scored 0)
JUDGE_VERDICT = "judge_verdict"  # non-tensor str, generative RM: the judge's answer
POLICY_KL_LOGPS = "policy_kl_logps"  # (B,) KTO: current policy's log-prob of KL_RESPONSES (no grad)
