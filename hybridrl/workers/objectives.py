"""What a `TrainEngine` update minimizes: one small object per objective.

Each is called once per micro-batch as `objective(forward, micro, norms) -> (loss, metrics)`,
where `forward` runs the engine's model on the micro-batch, `norms` are the whole mini-batch's
counts (`norms(mini)`, global over data-parallel ranks) and `loss` is the micro-batch's share of
the mini-batch loss, so that the accumulated gradient is the mini-batch's whatever the split.
Metrics stay tensors until `summarize` turns one optimizer step's micro-batch metrics into
floats with one device sync. The math itself lives in `hybridrl.algorithms`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from hybridrl.algorithms import (
    agg_loss,
    bradley_terry_loss,
    compute_entropy_loss,
    compute_value_loss,
    dpo_loss,
    get_policy_loss,
    improbable_token_frac,
    kl_penalty,
    kto_loss,
    sft_loss,
)
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.distributed.fsdp import dp_normalizer, dp_size
from hybridrl.workers.engine import mini_batch_norms, to_floats
from hybridrl.workers.forward import completion_log_probs, seq_keys


def _shares_and_means(micros: list[dict], shares: tuple[str, ...]) -> dict[str, list[float]]:
    """Per optimizer step: loss terms in `shares` summed over the micro-batches (each is its
    micro-batch's share of the mini-batch loss), every other metric one entry per micro-batch."""
    pending = [(k, v) for m in micros for k, v in m.items()]
    out: dict[str, list[float]] = defaultdict(list)
    summed: dict[str, float] = defaultdict(float)
    for (k, _), v in zip(pending, to_floats([t for _, t in pending])):
        if k in shares:
            summed[k] += v
        else:
            out[k].append(v)
    for k, v in summed.items():
        out[k].append(v)
    return out


@dataclass
class PPOPolicyLoss:
    """The policy-gradient loss (`policy_loss.loss_mode`, vanilla = PPO clip), minus the entropy bonus, plus
    the KL loss to the reference with use_kl_loss. Reads OLD_LOG_PROBS, ADVANTAGES (and
    REF_LOG_PROBS); log-probs at the rollout's `temperature`."""

    actor: object  # ActorConfig
    temperature: float
    shares = ("actor/pg_loss", "actor/kl_loss")

    def select(self, batch: Batch) -> Batch:
        """The fields the loss reads, so that only they are shuffled and copied to the device,
        micro-batch by micro-batch. No OLD_LOG_PROBS (actor.reuse_on_policy_log_prob): the loss
        takes its own log-probs as pi_old and compares them with the engine's (ROLLOUT_LOG_PROBS)."""
        a = self.actor
        extra = [k for k in (K.REF_LOG_PROBS, K.ROLLOUT_IS_WEIGHTS) if k in batch and (k != K.REF_LOG_PROBS or a.use_kl_loss)]
        extra += [K.OLD_LOG_PROBS] if K.OLD_LOG_PROBS in batch else [K.ROLLOUT_LOG_PROBS]
        return batch.select([*seq_keys(batch), K.ADVANTAGES, *extra])

    def passes(self, batch: Batch, mini_size: int, log_probs) -> list[Batch]:
        """The parts of `batch` that are updated one after the other: the whole batch, except with
        actor.reuse_on_policy_log_prob (no OLD_LOG_PROBS) over several mini-batches of one epoch,
        unshuffled. Then only the first mini-batch is on-policy (its own forward is pi_old); the
        later ones take pi_old from `log_probs(rest)`, a pass over them now, before the first
        optimizer step moves the weights (the old log-prob stage's numbers for (k-1)/k of its rows)."""
        a = self.actor
        if K.OLD_LOG_PROBS in batch or len(batch) <= mini_size or a.ppo_epochs != 1 or a.shuffle:
            return [batch]
        head, tail = batch.index(slice(0, mini_size)), batch.index(slice(mini_size, len(batch)))
        old = log_probs(tail)  # (rows, R)
        tail = tail.select([k for k in tail.tensors if k != K.ROLLOUT_LOG_PROBS])
        tail[K.OLD_LOG_PROBS] = old
        return [head, tail]

    def norms(self, mini: Batch) -> dict[str, float]:
        return mini_batch_norms(mini)

    def __call__(self, forward, micro: Batch, norms: dict[str, float]):
        a = self.actor
        mask = micro[K.RESPONSE_MASK]
        # (b, R) each
        log_prob, entropy, _ = forward(micro, with_entropy=True, temperature=self.temperature, entropy_grad=a.entropy_coeff != 0)
        norm = dict(loss_agg_mode=a.loss_agg_mode, **norms)
        # the loss registered as policy_loss.loss_mode (vanilla: the PPO clip); with
        # algorithm.rollout_correction.rollout_is, weighted by the train/rollout mismatch weights
        on_policy = K.OLD_LOG_PROBS not in micro  # actor.reuse_on_policy_log_prob: this forward is pi_old
        pg = get_policy_loss(a.policy_loss.loss_mode)(
            old_log_prob=log_prob.detach() if on_policy else micro[K.OLD_LOG_PROBS],
            log_prob=log_prob,
            advantages=micro[K.ADVANTAGES],
            response_mask=mask,
            config=a,
            rollout_is_weights=micro[K.ROLLOUT_IS_WEIGHTS] if K.ROLLOUT_IS_WEIGHTS in micro else None,
            **norm,
        )
        loss = pg["pg_loss"]
        if a.entropy_coeff == 0:
            entropy = entropy.detach()
        entropy_loss = compute_entropy_loss(entropy, mask, **norm)
        if a.entropy_coeff != 0:
            loss = loss - a.entropy_coeff * entropy_loss
        metrics = {
            "actor/pg_loss": pg["pg_loss"].detach(),
            "actor/pg_clipfrac": pg["pg_clipfrac"],
            "actor/pg_clipfrac_lower": pg["pg_clipfrac_lower"],
            "actor/ppo_kl": pg["ppo_kl"],
            "actor/entropy": (entropy.detach() * mask).sum() / mask.sum().clamp(min=1),
        }
        if on_policy:  # what the old log-prob pass would have reported: trainer vs engine probabilities
            diff = (log_prob.detach().exp() - micro[K.ROLLOUT_LOG_PROBS].exp()).abs()
            metrics["training/rollout_probs_diff_mean"] = (diff * mask).sum() / mask.sum().clamp(min=1)
            metrics["rollout/improbable_token_frac"] = improbable_token_frac(log_prob, mask)
        if a.use_kl_loss:
            kl = kl_penalty(log_prob, micro[K.REF_LOG_PROBS], a.kl_loss_type)
            kl_loss = agg_loss(kl, mask, **norm)
            loss = loss + a.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
        return loss, metrics

    def summarize(self, micros: list[dict], norms) -> dict[str, list[float]]:
        return _shares_and_means(micros, self.shares)


@dataclass
class ValueLoss:
    """Clipped value regression onto RETURNS (`compute_value_loss`); reads VALUES, RETURNS."""

    critic: object  # CriticConfig

    def norms(self, mini: Batch) -> dict[str, float]:
        return mini_batch_norms(mini)

    def __call__(self, forward, micro: Batch, norms: dict[str, float]):
        c = self.critic
        out = compute_value_loss(
            vpreds=forward(micro),
            values=micro[K.VALUES],
            returns=micro[K.RETURNS],
            response_mask=micro[K.RESPONSE_MASK],
            cliprange_value=c.cliprange_value,
            loss_agg_mode=c.loss_agg_mode,
            **norms,
        )
        return out["vf_loss"], {"loss": out["vf_loss"].detach(), "clipfrac": out["vf_clipfrac"]}

    def summarize(self, micros: list[dict], norms) -> dict[str, list[float]]:
        values = to_floats([m["loss"] for m in micros] + [m["clipfrac"] for m in micros])  # one sync per mini-batch
        loss, clipfrac = values[: len(micros)], values[len(micros) :]
        # the micro-batches' shares of the loss add up; the clip fraction is their mean
        return {"critic/vf_loss": [sum(loss, 0.0)], "critic/vf_clipfrac": [sum(clipfrac) / len(clipfrac)]}


class SFTLoss:
    """Token-mean negative log-likelihood of RESPONSES (incl. EOS; prompt tokens carry no loss)
    over the whole mini-batch; metrics `loss`, `mean_token_accuracy`, `num_tokens` (all ranks)."""

    def norms(self, mini: Batch) -> dict[str, float]:
        return {"global_tokens": dp_normalizer(float(mini[K.RESPONSE_MASK].sum()))}  # global / dp: see dp_normalizer

    def __call__(self, forward, micro: Batch, norms: dict[str, float]):
        log_prob, hit = completion_log_probs(forward, micro, K.RESPONSES)
        loss = sft_loss(log_prob, micro[K.RESPONSE_MASK], global_tokens=norms["global_tokens"])
        return loss, {"loss": loss.detach(), "hits": (hit.float() * micro[K.RESPONSE_MASK]).sum()}

    def summarize(self, micros: list[dict], norms) -> dict[str, list[float]]:
        n, tokens = len(micros), norms["global_tokens"]
        values = to_floats([m["loss"] for m in micros] + [m["hits"] for m in micros])  # one sync
        loss, correct = sum(values[:n], 0.0), sum(values[n:], 0.0)
        return {"loss": [loss], "mean_token_accuracy": [correct / max(tokens, 1.0)], "num_tokens": [tokens * dp_size()]}


def _rows(micros: list[dict]) -> dict[str, torch.Tensor]:
    """Per-row metrics of all micro-batches, on the host (one move after the loop)."""
    return {k: torch.cat([m[k] for m in micros]).cpu() for k in micros[0]}


def _pair_norms(mini: Batch) -> dict[str, float]:
    return {"global_seqs": dp_normalizer(len(mini))}


@dataclass
class DPOLoss:
    """DPO (`dpo_loss`) over PROMPTS, CHOSEN, REJECTED (+ masks), REF_CHOSEN_LOGPS,
    REF_REJECTED_LOGPS, divided by the pairs of the step; TRL's metric names."""

    pref: object  # PreferenceConfig
    norms = staticmethod(_pair_norms)

    def __call__(self, forward, micro: Batch, norms: dict[str, float]):
        p, b = self.pref, len(micro)
        # chosen and rejected in one forward pass: (2b, R)
        pair = Batch(
            {
                K.PROMPTS: micro[K.PROMPTS].repeat(2, 1),
                K.PROMPT_MASK: micro[K.PROMPT_MASK].repeat(2, 1),
                K.RESPONSES: torch.cat([micro[K.CHOSEN], micro[K.REJECTED]]),
                K.RESPONSE_MASK: torch.cat([micro[K.CHOSEN_MASK], micro[K.REJECTED_MASK]]),
            }
        )
        logps = completion_log_probs(forward, pair, K.RESPONSES)[0].sum(-1)  # (2b,)
        out = dpo_loss(
            logps[:b], logps[b:], micro[K.REF_CHOSEN_LOGPS], micro[K.REF_REJECTED_LOGPS], p.beta, p.loss_type, p.label_smoothing
        )
        out.update(chosen_logps=logps[:b], rejected_logps=logps[b:])
        return out["losses"].sum() / norms["global_seqs"], {k: v.detach() for k, v in out.items()}

    def summarize(self, micros: list[dict], norms) -> dict[str, list[float]]:
        s = _rows(micros)
        return {
            "loss": [float(s["losses"].mean())],
            "rewards/chosen": [float(s["chosen_rewards"].mean())],
            "rewards/rejected": [float(s["rejected_rewards"].mean())],
            "rewards/accuracies": [float((s["chosen_rewards"] > s["rejected_rewards"]).float().mean())],
            "rewards/margins": [float((s["chosen_rewards"] - s["rejected_rewards"]).mean())],
            "logps/chosen": [float(s["chosen_logps"].mean())],
            "logps/rejected": [float(s["rejected_logps"].mean())],
        }


@dataclass
class KTOLoss:
    """KTO (`kto_loss`) over PROMPTS, RESPONSES (+ mask), LABEL, REF_LOGPS and the step's KL
    reference point, divided by the examples of the step; TRL's metric names."""

    pref: object  # PreferenceConfig
    kl_ref_point: float
    norms = staticmethod(_pair_norms)

    def __call__(self, forward, micro: Batch, norms: dict[str, float]):
        p = self.pref
        logps = completion_log_probs(forward, micro, K.RESPONSES)[0].sum(-1)  # (b,)
        out = kto_loss(
            logps, micro[K.REF_LOGPS], micro[K.LABEL], self.kl_ref_point, p.beta, p.desirable_weight, p.undesirable_weight
        )
        out.update(logps=logps, labels=micro[K.LABEL])
        return out["losses"].sum() / norms["global_seqs"], {k: v.detach() for k, v in out.items()}

    def summarize(self, micros: list[dict], norms) -> dict[str, list[float]]:
        s = _rows(micros)
        good, z0 = s["labels"], max(float(self.kl_ref_point), 0.0) * self.pref.beta
        # KTO's "accuracy": the share of examples on the right side of the reference point.
        right = torch.where(good, s["rewards"] > z0, s["rewards"] < z0)
        metrics = {
            "loss": float(s["losses"].mean()),
            "kl": max(float(self.kl_ref_point), 0.0),
            "rewards/accuracies": float(right.float().mean()),
        }
        for name, sel in (("chosen", good), ("rejected", ~good)):
            if sel.any():  # a batch may hold only one kind
                metrics[f"rewards/{name}"] = float(s["rewards"][sel].mean())
                metrics[f"logps/{name}"] = float(s["logps"][sel].mean())
        if good.any() and (~good).any():
            metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
        return {k: [v] for k, v in metrics.items()}


@dataclass
class BradleyTerryLoss:
    """Reward-model training (`bradley_terry_loss`) over PROMPTS, CHOSEN, REJECTED (+ masks) and
    MARGIN: the forward is the reward model's score of each sequence (b,); divided by the pairs of the step."""

    norms = staticmethod(_pair_norms)

    def __call__(self, forward, micro: Batch, norms: dict[str, float]):
        b = len(micro)
        pair = Batch(  # chosen and rejected in one forward pass: (2b, R)
            {
                K.PROMPTS: micro[K.PROMPTS].repeat(2, 1),
                K.PROMPT_MASK: micro[K.PROMPT_MASK].repeat(2, 1),
                K.RESPONSES: torch.cat([micro[K.CHOSEN], micro[K.REJECTED]]),
                K.RESPONSE_MASK: torch.cat([micro[K.CHOSEN_MASK], micro[K.REJECTED_MASK]]),
            }
        )
        scores = forward(pair)  # (2b,)
        out = bradley_terry_loss(scores[:b], scores[b:], micro[K.MARGIN] if K.MARGIN in micro else None)
        return out["losses"].sum() / norms["global_seqs"], {k: v.detach() for k, v in out.items()}

    def summarize(self, micros: list[dict], norms) -> dict[str, list[float]]:
        s = _rows(micros)
        gap = s["chosen"] - s["rejected"]
        return {
            "rm/loss": [float(s["losses"].mean())],
            "rm/accuracy": [float((gap > 0).float().mean())],
            "rm/margin_mean": [float(gap.mean())],
            "rm/chosen_score": [float(s["chosen"].mean())],
            "rm/rejected_score": [float(s["rejected"].mean())],
        }
