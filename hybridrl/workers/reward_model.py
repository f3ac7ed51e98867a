"""The reward-model role: a sequence classifier that scores each prompt + response with one number.

A discriminative reward model is a language model whose last hidden state goes through a linear
head with one output (Hugging Face's `AutoModelForSequenceClassification` with num_labels=1, the
shape `algorithm.name=rm` trains and `hybridrl export` writes). Its score of a sequence is the
head's output at the sequence's last token, as in InstructGPT (Ouyang et al. 2022) and verl.

The reward model reads text the way it was trained to: when its tokenizer or chat template
differs from the policy's (or `reward_model.model.input_tokenizer` is set, verl's switch), each
prompt's chat messages plus the decoded response are rendered again with the reward model's own
chat template and tokenized with its tokenizer; otherwise the policy's token ids are scored as
they are. The forward passes are packed, micro-batched and FSDP2-sharded by a `TrainEngine`
like the critic's. The same worker trains a reward model (`algorithm.name=rm`, Bradley-Terry on
preference pairs) in the actor's place: `RewardModelTrainWorker` below.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.chat_template import check_chat_template
from hybridrl.data.errors import DataError
from hybridrl.data.preference import MASK_OF
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.distributed.fsdp import run_as_forward
from hybridrl.models.loading import ModelLoadError, check_dir, has_weights, load_tokenizer
from hybridrl.models.packing import Packed, packed_hidden
from hybridrl.workers.engine import Split, TrainEngine, eval_mode
from hybridrl.workers.forward import autocast, context_mask, seq_keys
from hybridrl.workers.objectives import BradleyTerryLoss
from hybridrl.workers.profiled import ProfiledWorker


class RewardModelError(ValueError):
    """A reward model that cannot score the run's responses; the message names the key and the fix."""


# -- the model -------------------------------------------------------------------------------------
def load_sequence_classifier(path: str, *, random_init: bool = False, trust_remote_code: bool = False, what: str, head_ok=False):
    """A float32 `AutoModelForSequenceClassification` (num_labels=1) from a local directory.

    `head_ok`: a causal LM checkpoint is accepted and gets a freshly initialized score head (the
    start of reward-model training); otherwise the checkpoint must be a trained classifier.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    p = check_dir(path, what)
    config = AutoConfig.from_pretrained(p, trust_remote_code=trust_remote_code)
    is_classifier = any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
    if not (is_classifier or head_ok or random_init):
        raise ModelLoadError(
            f"{what}={path!r} is a {', '.join(config.architectures or ['model'])}, not a sequence classifier: it has no "
            "trained score head; train one with algorithm.name=rm and `hybridrl export` it, or give an "
            "AutoModelForSequenceClassification directory (num_labels=1)"
        )
    if is_classifier and getattr(config, "num_labels", 1) != 1:
        raise ModelLoadError(f"{what}={path!r} has num_labels={config.num_labels}; a reward model has one output (num_labels=1)")
    config.num_labels = 1
    if random_init:
        model = AutoModelForSequenceClassification.from_config(config, trust_remote_code=trust_remote_code, dtype=torch.float32)
    else:
        if not has_weights(str(p)):
            raise ModelLoadError(f"{what}={path!r} has a config.json but no weights; export or save the model there")
        model = AutoModelForSequenceClassification.from_pretrained(
            p, config=config, trust_remote_code=trust_remote_code, dtype=torch.float32
        )
    if not isinstance(getattr(model, "score", None), nn.Linear):
        raise ModelLoadError(f"{what}={path!r}: {type(model).__name__} has no linear `score` head (Llama/Qwen/Mistral-style)")
    model.config.architectures = [type(model).__name__]  # what `hybridrl export` rebuilds
    return model


def right_aligned(prompts, prompt_mask, responses, response_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts (b, P) + right-padded responses (b, R) -> one right-padded row per
    sequence: ids (b, T) and mask (b, T), T = P + R, real tokens first."""
    seq = torch.cat([prompts, responses], dim=1)  # (b, T)
    keep = torch.cat([prompt_mask.bool(), response_mask.bool()], dim=1)  # (b, T)
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # real tokens first, in order
    return seq.gather(1, order), keep.gather(1, order).long()


def _pack_rows(ids: torch.Tensor, mask: torch.Tensor) -> Packed:
    """Right-padded rows -> one packed row whose targets are the sequences' last tokens."""
    keep = mask.bool()
    lens = keep.sum(1)  # (b,)
    cu = F.pad(lens.cumsum(0), (1, 0))  # (b + 1,)
    none = torch.zeros(0, dtype=torch.long, device=ids.device)
    return Packed(
        input_ids=ids[keep][None],
        position_ids=(keep.long().cumsum(1) - 1)[keep][None],
        cu_seqlens=cu.to(torch.int32),
        max_len=int(lens.max()),
        target_index=cu[1:] - 1,  # (b,) each sequence's last token
        rows=none,
        cols=none,
        labels=none,
        shape=(len(ids), 0),
    )


def _head(model, hidden: torch.Tensor) -> torch.Tensor:
    return model.score(hidden).squeeze(-1).float()  # (b,)


def _packed_scores(model, packed: Packed) -> torch.Tensor:
    return _head(model, packed_hidden(model.base_model, packed))


def _padded_scores(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    hidden = model.base_model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state  # (b, T, H)
    last = mask.sum(1) - 1  # (b,)
    return _head(model, hidden[torch.arange(len(ids), device=ids.device), last])


def _module_scores(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A user's `nn.Module` with forward(input_ids, attention_mask) -> scores (b,) or (b, 1) or .logits."""
    out = model(input_ids=ids, attention_mask=mask)
    out = getattr(out, "logits", out)
    return out.reshape(len(ids), -1)[:, -1].float()


def is_classifier(model) -> bool:
    return isinstance(getattr(model, "score", None), nn.Linear) and hasattr(model, "base_model_prefix")


def sequence_scores(engine, model, micro: Batch) -> torch.Tensor:
    """The reward model's score (b,) of each prompt + response of a micro-batch (SEQ_KEYS): the
    head at the sequence's last real token; packed (padding-free) when the engine packs."""
    ids, mask = right_aligned(micro[K.PROMPTS], micro[K.PROMPT_MASK], micro[K.RESPONSES], context_mask(micro))
    engine.slots += ids.numel()
    with autocast(engine):
        if not is_classifier(model):
            return _module_scores(model, ids, mask)
        if engine.packing:
            return run_as_forward(model, _packed_scores, _pack_rows(ids, mask))
        return run_as_forward(model, _padded_scores, ids, mask)


# -- the scoring worker ------------------------------------------------------------------------
def import_external_lib(name: str | None) -> None:
    """reward_model.model.external_lib: a module that registers a custom architecture."""
    if name:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise RewardModelError(
                f"reward_model.model.external_lib={name!r} does not import ({e}); install it or unset the key"
            ) from None


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers turn the same chat into the same ids (vocabulary and chat template)."""
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


class RewardModelWorker(ProfiledWorker):
    """Scores responses (`compute_rm_score`); frozen, eval mode, no optimizer."""

    profile_role = "reward_model"

    def __init__(self, cfg, plan, device: torch.device):
        self.cfg, self.plan, self.device = cfg, plan, device
        self.engine = TrainEngine(device, "reward_model", sequence_scores)
        self.tokenizer, self.rerender, self.source = None, False, ""

    @register(Dispatch.ALL)
    def init_model(self, model=None, tokenizer=None) -> None:
        """Load reward_model.model.path, or take `model` (a path, an HF sequence classifier or any
        `nn.Module` with forward(input_ids, attention_mask) -> scores) and its `tokenizer` (a path or
        tokenizer object; default: the checkpoint's, else the policy's)."""
        rm, m = self.cfg.reward_model, self.cfg.actor_rollout_ref.model
        import_external_lib(rm.model.external_lib)
        model = rm.model.path if model is None else model
        policy_tok = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code)
        if isinstance(model, (str, Path)):
            self.source = f"reward_model.model.path={str(model)!r}"
            tokenizer = tokenizer or str(model)
            model = load_sequence_classifier(
                str(model), trust_remote_code=rm.model.trust_remote_code, what="reward_model.model.path"
            )
        else:
            self.source = f"the reward model {type(model).__name__}"
        if isinstance(tokenizer, (str, Path)):
            tokenizer = load_tokenizer(str(tokenizer), rm.model.trust_remote_code, what="reward_model.model.path")
        self.tokenizer = tokenizer or policy_tok
        # verl: input_tokenizer set = always re-render; here null also re-renders when the tokenizers differ.
        self.rerender = rm.model.input_tokenizer is not None or not same_tokenizer(self.tokenizer, policy_tok)
        if self.rerender:  # its chat template renders every scored sequence: code from the model's files
            try:
                check_chat_template(self.tokenizer)
            except DataError as e:
                raise RewardModelError(f"{self.source}: {e}") from None
        classifier = is_classifier(model)
        self.engine.place(
            model,
            hooks_on=model.base_model if classifier else model,
            remove_padding=classifier and rm.model.use_remove_padding,
            attn_backend=m.packed_attn_backend,
            train=False,
        )

    def _inputs(self, batch: Batch) -> Batch:
        """What the reward model reads: the policy's ids, or each sequence re-rendered with the
        reward model's chat template and tokenizer (as one prompt with an empty response)."""
        if not self.rerender:
            return batch.select(seq_keys(batch))
        chats = batch[K.RAW_CHAT] if K.RAW_CHAT in batch else [None] * len(batch)
        rows = [self.render(c, p, r) for c, p, r in zip(chats, batch[K.RAW_PROMPT], batch[K.RESPONSE_TEXT])]
        width, pad = max(map(len, rows)), self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (B, T), right-padded
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r, dtype=torch.long), 1
        empty = torch.zeros((len(rows), 0), dtype=torch.long)
        return Batch({K.PROMPTS: ids, K.PROMPT_MASK: mask, K.RESPONSES: empty, K.RESPONSE_MASK: empty.float()})

    def render(self, chat, raw_prompt: str, response: str) -> list[int]:
        """One prompt + response as the reward model's token ids."""
        tok = self.tokenizer
        if chat is None:  # a plain-string prompt: the text as the policy read it
            text = raw_prompt + response
        elif getattr(tok, "chat_template", None) is None:
            raise RewardModelError(
                f"{self.source}: its tokenizer differs from the policy's and has no chat template, so the chat prompts "
                "cannot be rendered for it; add a chat_template to its tokenizer_config.json, or use a reward model "
                "that shares the policy's tokenizer (with reward_model.model.input_tokenizer=null)"
            )
        else:
            text = tok.apply_chat_template([*chat, {"role": "assistant", "content": response}], tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    @register(Dispatch.DP)
    def compute_rm_score(self, batch: Batch) -> Batch:
        """RM_SCORES (B,): the reward model's score of each prompt + response."""
        rm = self.cfg.reward_model
        inputs = self._inputs(batch)
        split = Split(
            rm.micro_batch_size_per_gpu or max(len(inputs), 1),
            rm.use_dynamic_bsz,
            rm.forward_max_token_len_per_gpu,
            "reward_model.forward_max_token_len_per_gpu",
        )
        with eval_mode(self.engine.model):
            scores = self.engine.infer(inputs, split)  # (B,)
        bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
        if bad:
            raise RewardModelError(
                f"{self.source} returned a non-finite score for {len(bad)} of {len(scores)} responses (first: "
                f"{batch[K.RESPONSE_TEXT][bad[0]]!r:.80}); check its weights (NaN or overflow, e.g. exported in float16)"
            )
        return Batch({K.RM_SCORES: scores.float()})


class RewardModelTrainWorker(RewardModelWorker):
    """algorithm.name=rm: the reward model trained in the actor's place (its role, pool and
    checkpoint directory `actor/`), with the Bradley-Terry objective; its metrics are actor/grad_norm,
    actor/lr ... like DPO's, and the optimizer settings are actor_rollout_ref.actor's."""

    def __init__(self, cfg, plan, device: torch.device):
        super().__init__(cfg, plan, device)
        self.engine = TrainEngine(device, "actor", sequence_scores)

    @register(Dispatch.ALL)
    def init_model(self, model_path: str, random_init: bool, total_optimizer_steps: int, need_ref: bool = False, ref_path=None):
        a, m = self.cfg.actor_rollout_ref.actor, self.cfg.actor_rollout_ref.model
        self.tokenizer = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code)
        model = load_sequence_classifier(
            model_path,
            random_init=random_init,
            trust_remote_code=m.trust_remote_code,
            what="actor_rollout_ref.model.path",
            head_ok=True,
        )
        model.config.pad_token_id = self.tokenizer.pad_token_id  # HF's own forward needs it for batches
        self.engine.place(
            model,
            hooks_on=model.base_model,
            remove_padding=m.use_remove_padding,
            attn_backend=m.packed_attn_backend,
            checkpointing=m.enable_gradient_checkpointing,
            param_offload=a.fsdp_config.param_offload,
        )
        self.engine.build_optimizer(a.optim, total_optimizer_steps, a.grad_clip, a.fsdp_config.optimizer_offload)

    @register(Dispatch.ALL)
    def freeze_reference(self) -> None:
        """No reference policy in reward-model training."""

    @register(Dispatch.DP)
    def update_reward_model(self, batch: Batch) -> dict[str, float]:
        """One optimizer step of the Bradley-Terry loss on PROMPTS + CHOSEN / REJECTED pairs (and MARGIN)."""
        # Fixed micro-batches of ppo_micro_batch_size_per_gpu pairs, as DPO's (offline rows have no token budgets yet).
        split = Split(self.plan.actor.micro_batch)
        return self.engine.summarize(self.engine.update(batch, BradleyTerryLoss(), split))

    @register(Dispatch.DP)
    def score_pairs(self, batch: Batch) -> Batch:
        """Validation: the scores (B,) of each pair's chosen and rejected completion, no gradients."""
        out = {}
        for key, name in ((K.CHOSEN, "chosen_scores"), (K.REJECTED, "rejected_scores")):
            seqs = Batch(
                {
                    K.PROMPTS: batch[K.PROMPTS],
                    K.PROMPT_MASK: batch[K.PROMPT_MASK],
                    K.RESPONSES: batch[key],
                    K.RESPONSE_MASK: batch[MASK_OF[key]],
                }
            )
            with eval_mode(self.engine.model):
                out[name] = self.engine.infer(seqs, Split(self.plan.actor.micro_batch))
        return Batch(out)

    @register(Dispatch.RANK0)
    def save_checkpoint(self, path: str, save_ref: bool = False) -> None:
        """Sharded (DCP) weights, optimizer and scheduler under `path/actor` (a sequence classifier:
        `hybridrl export` writes it as one)."""
        self.engine.save(Path(path) / "actor", self.tokenizer)

    @register(Dispatch.ALL)
    def load_checkpoint(self, path: str) -> None:
        self.engine.load(Path(path) / "actor")
