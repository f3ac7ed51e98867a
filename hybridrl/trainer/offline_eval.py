"""Validation of the offline trainers (DPO, KTO, SFT) on held-out rows (`data.val_files`).

Before training (`trainer.val_before_train`), every `trainer.test_freq` steps and at the last
step, the held-out rows are scored with the actor's `sequence_log_probs` (no gradients, eval
mode), under TRL's metric names with a `val/` prefix:

    DPO  val/loss, val/rewards/{chosen,rejected,margins,accuracies}, val/logps/{chosen,rejected}
         rewards are beta * (log pi - log pi_ref) of each completion; accuracy = chosen > rejected
    KTO  val/rewards/{chosen,rejected,margins,accuracies}: chosen / rejected = the desirable /
         undesirable rows' mean reward; accuracy = the reward's sign agrees with the label
    SFT  val/loss (token-mean NLL of the response tokens, as the training loss), val/perplexity

The reference log-probs of the held-out rows are computed once, when the validator is built
(before the trainer may free the reference model after precomputing its own).
"""

from __future__ import annotations

import math

import torch

from hybridrl.algorithms import dpo_loss
from hybridrl.data import keys as K
from hybridrl.data.preference import MASK_OF, REF_OF, collate_records, load_preference_records
from hybridrl.models.loading import load_tokenizer

# Batch fields this module adds: the current policy's summed log-prob of each completion (B,).
POLICY_OF = {K.CHOSEN: "val_policy_chosen_logps", K.REJECTED: "val_policy_rejected_logps", K.RESPONSES: "val_policy_logps"}
SCORED = {"dpo": (K.CHOSEN, K.REJECTED), "kto": (K.RESPONSES,), "sft": (K.RESPONSES,)}


class OfflineValidator:
    def __init__(self, cfg, run, records):
        self.cfg, self.run, self.records = cfg, run, records
        self.kind = cfg.algorithm.name
        self.batch_size = cfg.data.val_batch_size or cfg.data.train_batch_size
        if self.kind in ("dpo", "kto"):
            self._precompute_reference()

    @classmethod
    def create(cls, cfg, run) -> "OfflineValidator | None":
        """The validator of `data.val_files`, or None when there are none."""
        d = cfg.data
        if not d.val_files:
            return None
        m = cfg.actor_rollout_ref.model
        tokenizer = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code)
        records = load_preference_records(
            d.val_files,
            tokenizer,
            cfg.algorithm.name,
            prompt_key=d.prompt_key,
            max_prompt_length=d.max_prompt_length,
            max_response_length=d.max_response_length,
            truncation=d.truncation,
            seed=cfg.trainer.seed,
        )
        return cls(cfg, run, records[: d.val_max_samples] if d.val_max_samples else records)

    def _chunks(self):
        for start in range(0, len(self.records), self.batch_size):
            yield self.records[start : start + self.batch_size]

    def _precompute_reference(self) -> None:
        outputs = {key: REF_OF[key] for key in SCORED[self.kind]}
        for part in self._chunks():
            out = self.run.actor.sequence_log_probs(collate_records(part, self.run.pad_token_id), outputs)
            for i, r in enumerate(part):
                r.ref_logps = {**r.ref_logps, **{ref: float(out[ref][i]) for ref in outputs.values()}}

    def evaluate(self) -> dict[str, float]:
        """Score every held-out row under the current policy; the metrics above."""
        cols: dict[str, list[torch.Tensor]] = {}
        outputs = {key: POLICY_OF[key] for key in SCORED[self.kind]}
        for part in self._chunks():
            batch = self.run.actor.sequence_log_probs(collate_records(part, self.run.pad_token_id), outputs, reference=False)
            keep = list(outputs.values()) + [REF_OF[k] for k in outputs if self.kind != "sft"]
            keep += [K.LABEL] if self.kind == "kto" else []
            keep += [MASK_OF[K.RESPONSES]] if self.kind == "sft" else []
            for key in keep:
                x = batch[key]
                cols.setdefault(key, []).append(x.sum(-1) if key == MASK_OF[K.RESPONSES] else x)  # mask -> tokens per row
        c = {k: torch.cat(v).double() if k != K.LABEL else torch.cat(v) for k, v in cols.items()}
        return {**getattr(self, f"_{self.kind}")(c), "val/rows": float(len(self.records))}

    def _dpo(self, c) -> dict[str, float]:
        p = self.cfg.preference
        out = dpo_loss(
            c[POLICY_OF[K.CHOSEN]],
            c[POLICY_OF[K.REJECTED]],
            c[K.REF_CHOSEN_LOGPS],
            c[K.REF_REJECTED_LOGPS],
            p.beta,
            p.loss_type,
            p.label_smoothing,
        )
        chosen, rejected = out["chosen_rewards"], out["rejected_rewards"]
        return {
            "val/loss": float(out["losses"].mean()),
            "val/rewards/chosen": float(chosen.mean()),
            "val/rewards/rejected": float(rejected.mean()),
            "val/rewards/margins": float((chosen - rejected).mean()),
            "val/rewards/accuracies": float((chosen > rejected).double().mean()),
            "val/logps/chosen": float(c[POLICY_OF[K.CHOSEN]].mean()),
            "val/logps/rejected": float(c[POLICY_OF[K.REJECTED]].mean()),
        }

    def _kto(self, c) -> dict[str, float]:
        rewards = self.cfg.preference.beta * (c[POLICY_OF[K.RESPONSES]] - c[K.REF_LOGPS])  # (N,)
        label = c[K.LABEL].bool()
        m = {"val/rewards/accuracies": float(((rewards > 0) == label).double().mean())}
        if label.any():
            m["val/rewards/chosen"] = float(rewards[label].mean())
        if (~label).any():
            m["val/rewards/rejected"] = float(rewards[~label].mean())
        if label.any() and (~label).any():
            m["val/rewards/margins"] = m["val/rewards/chosen"] - m["val/rewards/rejected"]
        return m

    def _sft(self, c) -> dict[str, float]:
        nll = -float(c[POLICY_OF[K.RESPONSES]].sum() / c[MASK_OF[K.RESPONSES]].sum())
        return {"val/loss": nll, "val/perplexity": math.exp(min(nll, 50.0))}
