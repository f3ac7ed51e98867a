"""The end-of-run summary: what changed, where the time went, where the result is, what to run next.

Printed when a run's loop ends and written as `run_summary.json` beside metrics.jsonl (the
dashboard reads it to tell finished runs from stalled ones). Everything comes from
metrics.jsonl, so the summary says exactly what the report will show.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

from hybridrl.tracking.report import summarize
from hybridrl.tracking.runlog import load_run


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def _dur(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def build_summary(
    run_dir: Path,
    config: dict,
    step: int,
    total_steps: int,
    wall_time_s: float,
    checkpoint: Path | None,
    reward_object: bool = False,
) -> dict:
    """`reward_object`: the run scored with a reward function object (the Python API's), which `hybridrl eval`
    cannot rebuild: no eval command is suggested then."""
    s = summarize(load_run(run_dir))
    trainer = config.get("trainer", {})
    q = shlex.quote
    commands = {"report": f"hybridrl report {q(str(run_dir))} --out {q(str(run_dir / 'report.html'))}"}
    if checkpoint is not None:
        if (command := _eval_command(config, checkpoint, reward_object)) is not None:
            commands["eval"] = command
        commands["export"] = f"hybridrl export {q(str(checkpoint))} {q(str(run_dir / 'hf_model'))}"
    return {
        "finished": step >= total_steps
        or (trainer.get("max_wall_time_s") is not None and wall_time_s >= trainer["max_wall_time_s"]),
        "step": step,
        "total_steps": total_steps,
        "wall_time_s": wall_time_s,
        "mean_step_s": s["mean_step_s"],
        "stage_mean_s": s["stage_mean_s"],
        "first_step": s["first_step"],
        "first_step_s": s["first_step_s"],
        "median_step_s": s["median_step_s"],
        "median_steps": s["median_steps"],
        "stage_median_s": s["stage_median_s"],
        "reward_key": s["reward_key"],
        "reward_first": s["reward_first"],
        "reward_last": s["reward_last"],
        "reward_window": s["reward_window"],
        "validation": s["validation"],
        "checkpoint": str(checkpoint) if checkpoint is not None else None,
        "commands": commands,
    }


def _eval_command(config: dict, checkpoint: Path, reward_object: bool) -> str | None:
    """`hybridrl eval` of the checkpoint on the validation rows, scored as in training: by the custom reward
    file, or by the built-in scorers. None where eval cannot score as training did (a reward function
    object, a reward service, a run that is not RL, no validation rows)."""
    data, reward = config.get("data", {}), config.get("custom_reward_function", {})
    val = data.get("val_files")
    val = val[0] if isinstance(val, list) and val else val
    if (
        not val
        or reward_object
        or (reward.get("remote") or {}).get("url")
        or config.get("algorithm", {}).get("name", "rl") != "rl"
    ):
        return None
    q = shlex.quote
    length = data.get("max_response_length", 512)
    command = f"hybridrl eval --model {q(str(checkpoint))} --data {q(str(val))} --max-response-length {length}"
    if reward.get("path"):
        command += f" --reward-path {q(str(reward['path']))} --reward-name {q(str(reward.get('name') or 'compute_score'))}"
    return command


def format_summary(d: dict) -> str:
    head = "run finished" if d["finished"] else "run stopped"
    lines = [f"[hybridrl] {head}: step {d['step']}/{d['total_steps']} in {_dur(d['wall_time_s'])} wall time"]
    if d["reward_key"]:
        lines.append(
            f"  {d['reward_key']:<34} first {_fmt(d['reward_first'])} -> last {_fmt(d['reward_last'])}"
            f"  (mean of the first / last {d['reward_window']} step(s))"
        )
    for key, v in d["validation"].items():
        lines.append(
            f"  {key:<34} before {_fmt(v['first'])} (step {v['first_step']}) -> after {_fmt(v['last'])} "
            f"(step {v['last_step']}); best {_fmt(v['best'])} at step {v['best_step']}"
        )
    if d.get("median_step_s"):
        # medians of the steps after the first, which compiles and warms up (see report.summarize)
        stages = {k: v for k, v in d["stage_median_s"].items() if v}
        total = sum(stages.values()) or 1.0
        parts = ", ".join(f"{k} {v:.3g}s ({100 * v / total:.0f}%)" for k, v in sorted(stages.items(), key=lambda kv: -kv[1]))
        a, b = d["median_steps"]
        span = f"step {a}" if a == b else f"steps {a}-{b}"
        first = ""
        if a != d["first_step"]:
            first = f"; step {d['first_step']}, with compilation and warm-up: {d['first_step_s']:.3g}s"
        lines.append(f"  step time {d['median_step_s']:.3g}s (median of {span}{first})" + (f": {parts}" if parts else ""))
    lines.append(f"  final checkpoint: {d['checkpoint'] or 'none written'}")
    lines.append("  next:")
    lines += [f"    {cmd}" for cmd in d["commands"].values()]
    return "\n".join(lines)


def end_of_run_summary(
    run_dir: Path,
    config: dict,
    step: int,
    total_steps: int,
    wall_time_s: float,
    checkpoint: Path | None,
    reward_object: bool = False,
) -> dict:
    """Print the summary and write run_summary.json (atomically); returns it (`reward_object`: build_summary's)."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists():
        return {}
    from hybridrl.tracking.tracker import launched_at

    d = build_summary(run_dir, config, step, total_steps, wall_time_s, checkpoint, reward_object)
    started = launched_at()  # the CLI's first line, before the imports: the wall time a user waited
    if started is not None:
        d["wall_time_s"] = max(wall_time_s, time.perf_counter() - started)
    print(format_summary(d), flush=True)
    if d["finished"]:
        tmp = run_dir / "run_summary.json.tmp"
        tmp.write_text(json.dumps(d, indent=2) + "\n")
        os.replace(tmp, run_dir / "run_summary.json")
    return d
