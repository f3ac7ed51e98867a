"""The generative reward model (LLM-as-judge): a causal LM that reads each response and writes a verdict.

It takes the reward model's place (`reward_model.generative.enable`), with the same pools (its own,
or time-shared with the actor's processes), the same RM stage in the PPO step and the same score
combination (docs/reward_models.md). Each response becomes one judge prompt
(`reward_model.generative.prompt_template`, filled with the prompt, the response and the ground
truth, rendered with the judge's chat template as a user message); the judge answers greedily with
a rollout engine over its own model (`actor_rollout_ref.rollout.name`'s: native on a GPU, hf on CPU),
and `reward_model.generative.parse_fn` turns each answer into a score. The judge is held whole on
every rank of its pool (not sharded): a judge must fit on one device.
"""

from __future__ import annotations

import torch

from hybridrl.config.schema import RolloutConfig
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.dataset import PromptRecord, collate_prompts, render_prompt
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.rewards.judge import load_parse_fn
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.factory import build_rollout
from hybridrl.workers.engine import autocast_dtype
from hybridrl.workers.profiled import ProfiledWorker
from hybridrl.workers.reward_model import import_external_lib


class JudgeWorker(ProfiledWorker):
    profile_role = "reward_model"

    def __init__(self, cfg, plan, device: torch.device):
        self.cfg, self.plan, self.device = cfg, plan, device

    @register(Dispatch.ALL)
    def init_model(self, model=None, tokenizer=None) -> None:
        """Load the judge (reward_model.model.path, or `model` and `tokenizer` objects) and its engine."""
        rm, g = self.cfg.reward_model, self.cfg.reward_model.generative
        import_external_lib(rm.model.external_lib)
        if model is None or isinstance(model, str):
            path = model or rm.model.path
            tokenizer = load_tokenizer(path, rm.model.trust_remote_code, what="reward_model.model.path")
            model = load_causal_lm(path, trust_remote_code=rm.model.trust_remote_code, what="reward_model.model.path")
        self.tokenizer, self.parse = tokenizer, load_parse_fn(g.parse_fn)
        model = model.to(self.device).eval()
        model.requires_grad_(False)
        r = self.cfg.actor_rollout_ref.rollout
        self.max_prompt = g.max_prompt_length
        self.engine = build_rollout(
            RolloutConfig(name=r.name, max_num_seqs=r.max_num_seqs, gpu_memory_utilization=g.gpu_memory_utilization),
            model,
            tokenizer,
            max_model_len=g.max_prompt_length + g.max_new_tokens,
            autocast_dtype=autocast_dtype(self.device),
        )
        self.sampling = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=g.max_new_tokens)

    def judge_prompt(self, prompt: str, response: str, ground_truth) -> list[int]:
        """One response as the judge's prompt ids (left-truncated to generative.max_prompt_length)."""
        text = self.cfg.reward_model.generative.prompt_template.format(
            prompt=prompt, response=response, ground_truth=ground_truth
        )
        ids = self.tokenizer(render_prompt(self.tokenizer, [{"role": "user", "content": text}]), add_special_tokens=False)
        return ids["input_ids"][-self.max_prompt :]

    @register(Dispatch.DP)
    def compute_rm_score(self, batch: Batch) -> Batch:
        """RM_SCORES (B,): the parsed verdicts (0 where the verdict has no score), and the verdicts' texts."""
        gts = batch[K.GROUND_TRUTH] if K.GROUND_TRUTH in batch else [None] * len(batch)
        records = [
            PromptRecord(self.judge_prompt(p, r, gt), "", "judge", gt, {})
            for p, r, gt in zip(batch[K.RAW_PROMPT], batch[K.RESPONSE_TEXT], gts)
        ]
        out = self.engine.generate(collate_prompts(records, self.tokenizer.pad_token_id, [""] * len(records)), self.sampling)
        verdicts = list(out[K.RESPONSE_TEXT])
        parsed = [self.parse(v) for v in verdicts]
        scores = torch.tensor([0.0 if s is None else float(s) for s in parsed], dtype=torch.float32)
        failed = torch.tensor([float(s is None) for s in parsed])
        return Batch({K.RM_SCORES: scores, K.JUDGE_PARSE_FAILED: failed}, {K.JUDGE_VERDICT: verdicts})
