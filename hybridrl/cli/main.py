"""`hybridrl` command line: train, explain, data, eval, export, report, dashboard.

Errors: a problem with the user's input (config, data, paths, model directory, reward file, a
full or read-only disk) is printed as ONE line, `hybridrl: error: <what, where, the fix>`, and the
exit status is 2; HYBRIDRL_DEBUG=1 shows the traceback as well. Anything else is a bug in
hybridrl and keeps its full traceback (exit status 1), so it can be reported. A run stopped by
the training itself (non-finite losses, a dead worker) exits with status 1 and one line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from hybridrl.launch import (  # the launch path the Python API shares (hybridrl/launch.py)
    SignalStop,
    UsageError,
    check_reward_file,
    checkpoint_note,
    input_problems,
    stop_on_signals,
    trainer_class,
    user_error_message,
)

DEBUG_ENV = "HYBRIDRL_DEBUG"


def _load(args):
    """The config of a `train`/`explain` command line (`[CONFIG] key=value ...`; no CONFIG = verl's
    defaults), with the paths it names checked on this machine; its notices printed once (stderr)."""
    from hybridrl.config import ConfigError, load_config

    config, overrides, verl = _config_and_overrides(args)
    args.config = config  # named in error messages
    cfg = load_config(config, overrides, verl=verl)
    if args.command == "train" and not getattr(args, "print_cfg", None):
        from hybridrl.config.hub import fetch_repo_ids

        fetch_repo_ids(cfg)  # --allow-hub: Hub ids become local snapshots before anything loads
    problems = input_problems(cfg)
    if problems and getattr(args, "no_path_check", False):
        for p in problems:
            print(f"hybridrl: warning: {p} (not checked further: --no-path-check)", file=sys.stderr)
    elif problems:
        if args.command == "explain":  # every problem here is about this machine's files
            problems[-1] += "; to plan a config for another machine, run hybridrl explain --no-path-check"
        raise ConfigError(problems)
    for n in cfg.notices:
        print(f"hybridrl: notice: {n}", file=sys.stderr)
    return cfg


def _config_and_overrides(args) -> tuple[str | None, list[str], str | None]:
    """`[CONFIG] key=value ...`: the first argument is a config file unless it is an override.
    With no config file the run starts from verl's defaults (a verl command line, docs/verl.md)."""
    items = list(args.args)
    config = items.pop(0) if items and "=" not in items[0] and not items[0].startswith(("~", "+")) else None
    verl = args.verl or ("ppo" if config is None else None)
    return config, items, verl


def cmd_train(args) -> int:
    from hybridrl.config import ConfigError
    from hybridrl.preflight import backend_problems, launcher_refusal
    from hybridrl.tracking.tracker import notice

    if refusal := launcher_refusal():  # before anything is read or written (hybridrl/preflight.py)
        raise UsageError(refusal)
    args.no_path_check = bool(args.print_cfg)  # printing the config needs no model or data here
    cfg = args.cfg = _load(args)
    if args.print_cfg:  # Hydra's --cfg job: the config the run would use (${...} and defaults resolved)
        from hybridrl.config import to_dict

        print(yaml_text(to_dict(cfg)), end="")
        return 0
    if problems := backend_problems(cfg):  # wandb, mlflow, swanlab, Ray: before any file or model
        raise ConfigError(problems)
    notice(f"{args.config or 'verl defaults'}: config checked; importing torch and transformers")
    from hybridrl.distributed.groups import WorkerDiedError
    from hybridrl.trainer.dynamic_sampling import DynamicSamplingError
    from hybridrl.trainer.ppo import NonFiniteError
    from hybridrl.trainer.supervise import fit_with_restarts

    check_reward_file(cfg)
    try:
        with stop_on_signals():  # SIGTERM / SIGHUP end the run as Ctrl-C does, with a message
            fit_with_restarts(cfg, trainer_class(cfg))
    except (NonFiniteError, WorkerDiedError, DynamicSamplingError) as e:
        print(f"hybridrl train: stopped: {e}", file=sys.stderr)
        return 1
    return 0


def yaml_text(tree: dict) -> str:
    import yaml

    return yaml.safe_dump(tree, sort_keys=False, default_flow_style=False, width=100)


def cmd_explain(args) -> int:
    from hybridrl.config import ConfigError, explain

    cfg = _load(args)
    if not args.no_path_check:  # train reads the rows; explain counts them, for the same verdict
        from hybridrl.config.checks_files import data_size_problems

        if problems := data_size_problems(cfg):
            raise ConfigError(problems)
    print(explain(cfg))
    return 0


def cmd_data(args) -> int:
    from hybridrl.data.converters import convert_gsm8k, make_arith, make_arith_preferences

    if args.dataset == "gsm8k":
        if not args.input or not args.output:
            raise UsageError("hybridrl data gsm8k needs --input FILE.jsonl and --output FILE.parquet|.jsonl")
        tools = [t for t in (args.tools or "").split(",") if t]
        try:
            n = convert_gsm8k(args.input, args.output, split=args.split, tools=tools, interaction=args.interaction)
        except ValueError as e:
            raise UsageError(str(e)) from None
        print(f"wrote {n} rows to {args.output}")
    elif args.dataset == "rm-pairs":
        from hybridrl.data.preference import rm_pairs_from_samples

        if not args.input or not args.output:
            raise UsageError("hybridrl data rm-pairs needs --input SAMPLES.jsonl (from hybridrl eval --output) and --output FILE")
        n, prompts = rm_pairs_from_samples(args.input, args.output, pairs_per_prompt=args.pairs_per_prompt, seed=args.seed)
        print(f"wrote {n} pairs from {prompts} prompts with both a better and a worse sample to {args.output}")
    elif args.dataset == "arith-pref":
        paths = make_arith_preferences(args.output or "data/arith_pref", seed=args.seed)
        print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    else:  # arith
        paths = make_arith(args.output or "data/arith", seed=args.seed)
        print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


def cmd_eval(args) -> int:
    from hybridrl.preflight import launcher_refusal

    if refusal := launcher_refusal():
        raise UsageError(refusal)
    import torch

    from hybridrl.config.schema import MultiTurnConfig, RolloutConfig
    from hybridrl.data.dataset import load_prompt_records
    from hybridrl.models.loading import load_causal_lm, load_tokenizer, pick_device
    from hybridrl.rewards import default_compute_score, load_custom_reward_fn, needs_ground_truth
    from hybridrl.rewards.pool import Target, WorkerPool
    from hybridrl.rewards.scorer import FunctionScorer
    from hybridrl.rewards.stage import RewardStage
    from hybridrl.rollout.agent.rollout import chat_tools
    from hybridrl.rollout.base import SamplingParams
    from hybridrl.rollout.factory import build_rollout
    from hybridrl.trainer.scoring import evaluate
    from hybridrl.workers.engine import autocast_dtype

    if not args.reward_path:
        _check_builtin_scorers(args.data, args.limit)  # before the model loads
    device = pick_device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _hf_dir(args.model, tmp)  # a checkpoint is exported first
        tokenizer = load_tokenizer(model_dir, what="--model")
        model = load_causal_lm(model_dir, what="--model").to(device).eval()
    if args.reward_path:  # checked here, then run in worker processes with a timeout (hybridrl/rewards/pool.py)
        load_custom_reward_fn(args.reward_path, args.reward_name)
        name = f"reward function {args.reward_name} ({args.reward_path})"
        scorer, need_gt = FunctionScorer(WorkerPool(Target(args.reward_path, args.reward_name)), name), (lambda s: False)
    else:
        scorer, need_gt = (
            FunctionScorer(WorkerPool(default_compute_score, kind="thread"), "the built-in reward"),
            needs_ground_truth,
        )
    multi_turn = MultiTurnConfig(
        enable=bool(args.tool_config or args.interaction_config),
        format=args.multi_turn_format,
        max_assistant_turns=args.max_assistant_turns,
        tool_config_path=args.tool_config,
        interaction_config_path=args.interaction_config,
    )
    records = load_prompt_records(
        args.data,
        tokenizer,
        max_prompt_length=args.max_prompt_length,
        truncation="left",
        require_ground_truth=need_gt,
        max_rows=args.limit,
        tools=chat_tools(multi_turn),
    )
    rollout = RolloutConfig(name=args.rollout, max_num_seqs=args.batch_size, multi_turn=multi_turn)
    max_model_len = args.max_prompt_length + args.max_response_length
    engine = build_rollout(rollout, model, tokenizer, max_model_len=max_model_len, autocast_dtype=autocast_dtype(device))
    greedy = args.temperature == 0
    torch.manual_seed(args.seed)  # sampled responses (--temperature > 0) repeat run to run
    sampling = SamplingParams(
        n=args.n, do_sample=not greedy, temperature=args.temperature, max_new_tokens=args.max_response_length
    )
    try:
        rows, metrics = evaluate(engine, records, sampling, args.batch_size, RewardStage(scorer), tokenizer.pad_token_id)
    finally:
        scorer.close()
    summary = _eval_summary(rows)  # adds score_flexible to GSM8K rows
    if args.output:
        with open(args.output, "w") as f:
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")
    for source, m in summary.items():
        how = "greedy" if greedy else f"sampled at temperature {args.temperature}"
        line = f"{source}: accuracy {m['accuracy']:.4f} ({m['correct']}/{m['n']} exactly right, {how})"
        if "flexible_accuracy" in m:
            line += f"; strict {m['accuracy']:.4f}, flexible (last number) {m['flexible_accuracy']:.4f}"
        print(line)
    # the last batch's engine metrics: tokens/s; multi-turn: turns, tool calls and errors, waiting on tools
    engine_metrics = {k: v for k, v in engine.last_metrics.items() if k.startswith(("agent/", "perf/"))}
    if engine_metrics:
        print("rollout (last batch): " + ", ".join(f"{k.split('/', 1)[1]} {v:.4g}" for k, v in engine_metrics.items()))
        summary = {**summary, "rollout": engine_metrics}
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def _check_builtin_scorers(data: str, limit: int | None) -> None:
    """Without --reward-path every row is scored by the built-in scorer of its data_source: a source with
    none (a custom reward's, or `reward_fn`, which the Python API gives rows scored by a function object)
    is refused here, in one line, rather than scored 0 with a traceback per response."""
    from hybridrl.data.converters import read_rows
    from hybridrl.rewards import KNOWN_DATA_SOURCES

    rows = read_rows(data)[:limit]
    unknown = sorted({str(r.get("data_source")) for r in rows if isinstance(r, dict)} - set(KNOWN_DATA_SOURCES))
    if unknown:
        raise UsageError(
            f"--data {data}: no built-in scorer for data_source {', '.join(map(repr, unknown))} (built-in: "
            f"{', '.join(KNOWN_DATA_SOURCES)}); pass the reward function with --reward-path FILE --reward-name NAME "
            f"(a reward function object given to the Python API is not saved with the run: put it in a file)"
        )


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
        raise UsageError(
            f"{lora_actor_dir(args.checkpoint)} is a LoRA checkpoint's policy, already a plain HF model "
            "directory (the merged weights; the adapter in its adapter/): load or copy it as it is"
        )
    if role_dir is None:
        raise UsageError(
            f"{args.checkpoint} is not a hybridrl checkpoint; give a run directory, its checkpoints/ "
            "directory, a checkpoints/step_N directory or step_N/actor"
        )
    import torch

    dtype, why = (args.dtype, "--dtype") if args.dtype != "auto" else model_dtype(role_dir)
    out = export_hf(role_dir, args.output, getattr(torch, dtype))
    classifier = "ForSequenceClassification" in (out / "config.json").read_text()  # a reward model (algorithm.name=rm)
    auto = "AutoModelForSequenceClassification" if classifier else "AutoModelForCausalLM"
    print(f"wrote {out} (from {role_dir}, {dtype}: {why}): load it with {auto}.from_pretrained({str(out)!r})")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other user error."""

    def error(self, message):
        self.exit(2, f"hybridrl: error: {message}; see `{self.prog} --help`\n")


_DTYPES = ("float32", "bfloat16", "float16")


def model_dtype(role_dir: Path) -> tuple[str, str]:
    """The dtype the trained model came in, as verl's model merger keeps it: the `torch_dtype` of
    the run's actor_rollout_ref.model.path (training holds fp32 masters, so the checkpoint's own
    config.json says float32); float32 when that is unknown. Returns (dtype, where it came from)."""
    import yaml

    from hybridrl.config import yamlio

    run_config = Path(role_dir).resolve().parents[2] / "config.yaml"  # run/checkpoints/step_N/actor
    try:
        model_path = yamlio.load(run_config.read_text())["actor_rollout_ref"]["model"]["path"]
        hf = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return "float32", "the base model's dtype is unknown"
    dtype = hf.get("torch_dtype") or hf.get("dtype")
    if dtype not in _DTYPES:
        return "float32", f"{model_path} names no dtype"
    return dtype, f"the dtype of {model_path}"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hybridrl", description="Post-training for LLMs: RL (PPO, GRPO, ...), DPO, KTO, SFT.")
    sub = p.add_subparsers(dest="command", required=True)

    for name, fn, help_ in (
        ("train", cmd_train, "train with a YAML config and key.sub=value overrides"),
        ("explain", cmd_explain, "show how batch sizes resolve and every config error, loading nothing"),
    ):
        s = sub.add_parser(name, help=help_)
        s.add_argument(
            "args",
            nargs="*",
            metavar="[CONFIG] key=value",
            help="a YAML config file (optional: without one, verl's defaults, so a verl command line "
            "runs as is) and dotted overrides, e.g. data.train_batch_size=64; +key=, ++key=, ~key "
            "as in Hydra",
        )
        s.add_argument("--verl", choices=["ppo", "dapo", "sft"], default=None, help=argparse.SUPPRESS)
        s.add_argument("--allow-hub", action="store_true", help="model paths may be Hugging Face Hub ids (downloaded first)")
        s.set_defaults(fn=fn)
        if name == "train":
            s.add_argument(
                "--cfg",
                "-c",
                choices=["job"],
                dest="print_cfg",
                help="print the resolved config as YAML and run nothing (as Hydra)",
            )
        if name == "explain":
            s.add_argument(
                "--no-path-check",
                action="store_true",
                help="only warn about model/data paths missing here (planning for another machine)",
            )

    s = sub.add_parser("data", help="write datasets in verl's row format")
    s.add_argument("dataset", choices=["gsm8k", "arith", "arith-pref", "rm-pairs"])
    s.add_argument("--input", help="gsm8k: the source JSONL (question/answer rows); rm-pairs: `hybridrl eval --output` rows")
    s.add_argument("--output", help="gsm8k: output .parquet or .jsonl; arith, arith-pref: output directory")
    s.add_argument("--split", default=None, help="gsm8k: split name stored in extra_info (default: from the file name)")
    s.add_argument(
        "--tools", default=None, help="gsm8k: rows for the multi-turn tool recipe, e.g. --tools python (docs/agents.md)"
    )
    s.add_argument("--interaction", default=None, help="gsm8k: rows for an interaction, e.g. --interaction gsm8k")
    s.add_argument("--seed", type=int, default=0, help="arith, arith-pref: problem sampling seed; rm-pairs: pairing seed")
    s.add_argument("--pairs-per-prompt", type=int, default=1, help="rm-pairs: most (chosen, rejected) pairs per prompt")
    s.set_defaults(fn=cmd_data)

    s = sub.add_parser("eval", help="greedy accuracy of a model on a dataset, scored per row's data_source")
    s.add_argument("--model", required=True, help="local HF model directory (e.g. a checkpoint's actor/)")
    s.add_argument("--data", required=True, help="parquet or JSONL in verl's row format")
    s.add_argument("--output", help="write per-sample results to this JSONL")
    s.add_argument("--summary", help="write the per-data-source accuracies to this JSON file")
    s.add_argument("--batch-size", type=int, default=256, help="prompts generated together")
    s.add_argument("--n", type=int, default=1, help="responses per prompt (with --temperature > 0: reward-model pairs)")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampling (with --temperature > 0)")
    s.add_argument("--max-prompt-length", type=int, default=1024)
    s.add_argument("--max-response-length", type=int, default=512)
    s.add_argument("--limit", type=int, default=None, help="only the first N rows")
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    s.add_argument(
        "--rollout",
        default="auto",
        choices=["auto", "native", "hf"],
        help="generation engine (auto = native on a GPU, hf on CPU)",
    )
    s.add_argument("--reward-path", help="a Python file with a custom scorer")
    s.add_argument(
        "--tool-config", help="multi-turn: a tool config YAML (docs/agents.md); the model may call these tools (native engine)"
    )
    s.add_argument("--interaction-config", help="multi-turn: an interaction config YAML (a simulated user replies)")
    s.add_argument("--multi-turn-format", default="hermes", choices=["hermes", "code"], help="how the model calls tools")
    s.add_argument("--max-assistant-turns", type=int, default=None, help="multi-turn: model turns per trajectory")
    s.add_argument("--reward-name", default="compute_score")
    s.set_defaults(fn=cmd_eval)

    s = sub.add_parser("export", help="write a checkpoint's policy as a plain Hugging Face model directory")
    s.add_argument("checkpoint", help="a run directory, its checkpoints/ (latest), checkpoints/step_N or step_N/actor")
    s.add_argument("output", help="the HF directory to write (config.json, model.safetensors, tokenizer)")
    s.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="dtype of the written weights; auto (default) = the dtype the base model came in "
        "(actor_rollout_ref.model.path's config.json), as verl's model merger does; training "
        "keeps float32 master weights",
    )
    s.set_defaults(fn=cmd_export)

    from hybridrl.cli import dashboard, report

    report.add_parser(sub)
    dashboard.add_parser(sub)
    return p


def _quiet_libraries() -> None:
    """The libraries' own bars (loading weights, writing shards) on a terminal only: in a log file they
    are lines of carriage returns between the one-line-per-step log (hybridrl/tracking/progress.py)."""
    from hybridrl.tracking.progress import library_bars, on_terminal

    library_bars(on_terminal())


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and (args.command != "train" or any(x.startswith("-") for x in extra)):
        parser.parse_args(argv)  # the usual one-line error for what is not an override
    if extra:  # overrides after an option (`train CONFIG --cfg job key=value`)
        args.args += extra
    if args.command in ("report", "dashboard"):  # they only read files: no torch import (seconds on a small machine)
        try:
            return args.fn(args)
        except FileNotFoundError as e:
            print(f"hybridrl: error: {e}", file=sys.stderr)
            return 2
    from hybridrl.models.loading import ALLOW_HUB_ENV, hub_offline_by_default

    if getattr(args, "allow_hub", False):
        os.environ[ALLOW_HUB_ENV] = "1"
    hub_offline_by_default()  # before anything imports huggingface_hub
    if args.command in ("train", "eval", "export"):
        _quiet_libraries()
    try:
        from hybridrl.distributed.hang_dump import dump_stacks_if_asked

        dump_stacks_if_asked()  # HYBRIDRL_DUMP_STACKS_S: where a hung run waits (its workers do the same)
    except ValueError as e:
        print(f"hybridrl: error: {e}", file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except KeyboardInterrupt as e:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        how = str(e) if isinstance(e, SignalStop) else "interrupted"
        print(f"hybridrl: {how}{checkpoint_note(getattr(args, 'cfg', None))}", file=sys.stderr)
        return e.exit_code if isinstance(e, SignalStop) else 130  # the shell's status for a SIGINT
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as e:  # torch.distributed.checkpoint's CheckpointException is a BaseException
        message = user_error_message(e, getattr(args, "cfg", None), getattr(args, "config", None))
        if message is None or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise  # a bug (or debugging asked for): the full traceback
        print(f"hybridrl: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
