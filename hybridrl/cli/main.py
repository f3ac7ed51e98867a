"""`hybridrl` command line: train, explain, data, eval, export."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def cmd_train(args) -> int:
    from hybridrl.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    from hybridrl.distributed.groups import WorkerDiedError
    from hybridrl.trainer.ppo import NonFiniteError, PPOTrainer
    from hybridrl.trainer.supervise import fit_with_restarts

    if cfg.algorithm.name in ("dpo", "kto"):
        from hybridrl.trainer.preference import PreferenceTrainer as Trainer
    elif cfg.algorithm.name == "sft":
        from hybridrl.trainer.sft import SFTTrainer as Trainer
    else:
        Trainer = PPOTrainer
    try:
        fit_with_restarts(cfg, Trainer)
    except ConfigError as e:  # found once the data is loaded (e.g. reward_kwargs vs the data's scorers)
        print(e, file=sys.stderr)
        return 2
    except (NonFiniteError, WorkerDiedError) as e:
        print(f"hybridrl train: stopped: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_explain(args) -> int:
    from hybridrl.config import ConfigError, explain, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    print(explain(cfg))
    return 0


def cmd_data(args) -> int:
    from hybridrl.data.converters import convert_gsm8k, make_arith, make_arith_preferences

    if args.dataset == "gsm8k":
        if not args.input or not args.output:
            print("hybridrl data gsm8k needs --input FILE.jsonl and --output FILE.parquet|.jsonl", file=sys.stderr)
            return 2
        n = convert_gsm8k(args.input, args.output, split=args.split)
        print(f"wrote {n} rows to {args.output}")
    elif args.dataset == "arith-pref":
        paths = make_arith_preferences(args.output or "data/arith_pref", seed=args.seed)
        print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    else:  # arith
        paths = make_arith(args.output or "data/arith", seed=args.seed)
        print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


def cmd_eval(args) -> int:
    from hybridrl.data.dataset import load_prompt_records
    from hybridrl.models.loading import load_causal_lm, load_tokenizer, pick_device
    from hybridrl.rewards import default_compute_score, load_custom_reward_fn, needs_ground_truth
    from hybridrl.rewards.pool import Target, WorkerPool
    from hybridrl.config.schema import RolloutConfig
    from hybridrl.rollout import SamplingParams, make_rollout_engine
    from hybridrl.trainer.scoring import evaluate
    from hybridrl.workers.actor import autocast_dtype

    device = pick_device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _hf_dir(args.model, tmp)  # a checkpoint is exported first
        tokenizer = load_tokenizer(model_dir)
        model = load_causal_lm(model_dir, what="--model").to(device).eval()
    if args.reward_path:  # checked here, then run in worker processes with a timeout (hybridrl/rewards/pool.py)
        load_custom_reward_fn(args.reward_path, args.reward_name)
        compute_score, need_gt = WorkerPool(Target(args.reward_path, args.reward_name)), (lambda s: False)
    else:
        compute_score, need_gt = default_compute_score, needs_ground_truth
    records = load_prompt_records(
        args.data, tokenizer, max_prompt_length=args.max_prompt_length, truncation="left",
        require_ground_truth=need_gt, max_rows=args.limit,
    )  # fmt: skip
    rollout = RolloutConfig(name=args.rollout, max_num_seqs=args.batch_size)
    engine = make_rollout_engine(args.rollout, model, tokenizer, max_num_seqs=args.batch_size, rollout=rollout,
                                 autocast_dtype=autocast_dtype(device),
                                 max_model_len=args.max_prompt_length + args.max_response_length)  # fmt: skip
    sampling = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=args.max_response_length)
    try:
        rows, metrics = evaluate(engine, records, sampling, args.batch_size, compute_score, tokenizer.pad_token_id)
    finally:
        if isinstance(compute_score, WorkerPool):
            compute_score.close()
    summary = _eval_summary(rows)  # adds score_flexible to GSM8K rows
    if args.output:
        with open(args.output, "w") as f:
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")
    for source, m in summary.items():
        line = f"{source}: accuracy {m['accuracy']:.4f} ({m['correct']}/{m['n']} exactly right, greedy)"
        if "flexible_accuracy" in m:
            line += f"; strict {m['accuracy']:.4f}, flexible (last number) {m['flexible_accuracy']:.4f}"
        print(line)
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def _eval_summary(rows: list[dict]) -> dict[str, dict]:
    """Per data source: mean score, exact count; for GSM8K also the flexible (last-number) accuracy.

    The flexible score is added to each row (`score_flexible`) so the JSONL shows both.
    """
    from hybridrl.rewards import gsm8k

    out = {}
    for source in sorted({r["data_source"] for r in rows}):
        mine = [r for r in rows if r["data_source"] == source]
        scores = [r["score"] for r in mine]
        m = {"n": len(mine), "accuracy": sum(scores) / len(mine), "correct": sum(s == 1.0 for s in scores)}
        if source in ("gsm8k", "openai/gsm8k"):
            for r in mine:
                r["score_flexible"] = gsm8k.compute_score(r["response"], r["ground_truth"], method="flexible")
            m["flexible_accuracy"] = sum(r["score_flexible"] for r in mine) / len(mine)
        out[source] = m
    return out


def _hf_dir(path: str, tmp: str) -> str:
    """`path` if it is an HF model directory; a checkpoint's policy exported into `tmp`, or a
    LoRA checkpoint's actor/ (already the merged HF model), otherwise."""
    from hybridrl.distributed.checkpoint import export_hf

    role_dir = checkpoint_role_dir(path)
    if role_dir:
        return str(export_hf(role_dir, tmp))
    return str(lora_actor_dir(path) or path)


def _find_step_dir(path: str, holds) -> Path | None:
    """The first of `path`, its latest checkpoint, its checkpoints/ dir's latest, for which
    `holds(step_dir)` is true."""
    from hybridrl.trainer.checkpoint import latest_checkpoint

    p = Path(path)
    for step in (p, latest_checkpoint(p), latest_checkpoint(p / "checkpoints")):
        if step is not None and holds(step):
            return step
    return None


def checkpoint_role_dir(path: str, role: str = "actor") -> Path | None:
    """The sharded `role` directory meant by `path`: a role dir, a step_N dir, a checkpoints/
    dir (its latest) or a run dir (its latest); None for anything else (an HF directory)."""
    from hybridrl.distributed.checkpoint import is_sharded_checkpoint

    step = _find_step_dir(path, lambda s: is_sharded_checkpoint(s / role))
    if step is not None:
        return step / role
    return Path(path) if is_sharded_checkpoint(path) else None


def lora_actor_dir(path: str) -> Path | None:
    """A LoRA checkpoint's actor/ directory (the merged policy, HF format) meant by `path`."""
    from hybridrl.models.lora import ADAPTER_DIR

    if (Path(path) / ADAPTER_DIR).is_dir():
        return Path(path)
    step = _find_step_dir(path, lambda s: (s / "actor" / ADAPTER_DIR).is_dir())
    return step / "actor" if step is not None else None


def cmd_export(args) -> int:
    from hybridrl.distributed.checkpoint import export_hf

    role_dir = checkpoint_role_dir(args.checkpoint)
    if role_dir is None and lora_actor_dir(args.checkpoint) is not None:
        print(f"hybridrl export: {lora_actor_dir(args.checkpoint)} is a LoRA checkpoint's policy, already a plain HF "
              "model directory (the merged weights; the adapter in its adapter/): load or copy it as it is",
              file=sys.stderr)  # fmt: skip
        return 2
    if role_dir is None:
        print(f"hybridrl export: error: {args.checkpoint} is not a hybridrl checkpoint (a run directory, its "
              "checkpoints/ directory, a checkpoints/step_N directory or step_N/actor)", file=sys.stderr)  # fmt: skip
        return 2
    import torch

    out = export_hf(role_dir, args.output, getattr(torch, args.dtype))
    print(f"wrote {out} (from {role_dir}): load it with AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hybridrl", description="Post-training for LLMs: RL (PPO, GRPO, ...), DPO, KTO, SFT.")
    sub = p.add_subparsers(dest="command", required=True)

    for name, fn, help_ in (
        ("train", cmd_train, "train with a YAML config and key.sub=value overrides"),
        ("explain", cmd_explain, "show how batch sizes resolve and every config error, loading nothing"),
    ):
        s = sub.add_parser(name, help=help_)
        s.add_argument("config", help="YAML config file")
        s.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.train_batch_size=64")
        s.set_defaults(fn=fn)

    s = sub.add_parser("data", help="write datasets in verl's row format")
    s.add_argument("dataset", choices=["gsm8k", "arith", "arith-pref"])
    s.add_argument("--input", help="gsm8k: the source JSONL (question/answer rows)")
    s.add_argument("--output", help="gsm8k: output .parquet or .jsonl; arith, arith-pref: output directory")
    s.add_argument("--split", default=None, help="gsm8k: split name stored in extra_info (default: from the file name)")
    s.add_argument("--seed", type=int, default=0, help="arith, arith-pref: problem sampling seed")
    s.set_defaults(fn=cmd_data)

    s = sub.add_parser("eval", help="greedy accuracy of a model on a dataset, scored per row's data_source")
    s.add_argument("--model", required=True, help="local HF model directory (e.g. a checkpoint's actor/)")
    s.add_argument("--data", required=True, help="parquet or JSONL in verl's row format")
    s.add_argument("--output", help="write per-sample results to this JSONL")
    s.add_argument("--summary", help="write the per-data-source accuracies to this JSON file")
    s.add_argument("--batch-size", type=int, default=256, help="prompts generated together")
    s.add_argument("--max-prompt-length", type=int, default=1024)
    s.add_argument("--max-response-length", type=int, default=512)
    s.add_argument("--limit", type=int, default=None, help="only the first N rows")
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    s.add_argument("--rollout", default="auto", choices=["auto", "native", "hf"],
                   help="generation engine (auto = native on a GPU, hf on CPU)")
    s.add_argument("--reward-path", help="a Python file with a custom scorer")
    s.add_argument("--reward-name", default="compute_score")
    s.set_defaults(fn=cmd_eval)

    s = sub.add_parser("export", help="write a checkpoint's policy as a plain Hugging Face model directory")
    s.add_argument("checkpoint", help="a run directory, its checkpoints/ (latest), checkpoints/step_N or step_N/actor")
    s.add_argument("output", help="the HF directory to write (config.json, model.safetensors, tokenizer)")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the written weights (training keeps float32 master weights)")
    s.set_defaults(fn=cmd_export)
    return p


def _quiet_libraries() -> None:
    """Progress bars from `save_pretrained` would interleave with the one-line-per-step log."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main(argv=None) -> int:
    from hybridrl.data.dataset import DataError
    from hybridrl.distributed.checkpoint import CheckpointError
    from hybridrl.distributed.groups import BackendError
    from hybridrl.models.loading import ModelLoadError
    from hybridrl.trainer.rundir import RunDirError

    args = build_parser().parse_args(argv)
    if args.command in ("train", "eval"):
        _quiet_libraries()
    try:
        return args.fn(args)
    except (DataError, ModelLoadError, BackendError, FileNotFoundError, NotImplementedError) as e:
        # Bad input: the message says what to change; a traceback would only bury it.
        print(f"hybridrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except RunDirError as e:
        print(f"hybridrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except CheckpointError as e:  # also from a Ray worker, where str(e) is the remote traceback
        print(f"hybridrl {args.command}: error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
