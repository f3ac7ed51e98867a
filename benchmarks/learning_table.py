"""The learning table (issue 51, docs/learning.md): every recipe a user would run, trained on GSM8K for
a fixed wall-clock budget, then greedy accuracy on all 1,319 test questions. The recipes live here;
benchmarks/learning_table.sh runs them stage by stage, one device call each, and asks this script for
the command lines and the row:

    python benchmarks/learning_table.py list                   # the recipes and their configs
    python benchmarks/learning_table.py train-args RECIPE --model M --data D --run R [--budget-s S] [--mode ...]
    python benchmarks/learning_table.py eval-args RECIPE       # flags of `hybridrl eval` for the recipe
    python benchmarks/learning_table.py data-args RECIPE       # flags of `hybridrl data gsm8k` (the tool's prompt)
    python benchmarks/learning_table.py row RECIPE OUT         # the table row; OUT/results/ (row, plot, metrics)
    python benchmarks/learning_table.py plot OUT [OUT ...] --out docs/img/NAME.svg   # reward against wall-clock
    python benchmarks/learning_table.py reach SYNC_OUT OUT [OUT ...]   # seconds to reach sync's final accuracy

Every recipe trains with the reward of the GSM8K recipe (BENCHMARKS.md, run 3): the base model rarely
writes "#### N", and with verl's strict reward alone it gets almost no signal (docs/gsm8k.md). The
plots are SVG written here, so that nothing beyond hybridrl is needed on the GPU machine.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# benchmarks/ for learning_checks; the repository for hybridrl, which the GPU machine runs from a
# checkout (not installed: `python benchmarks/learning_table.py row` failed there on 2026-11-29)
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO)]
import learning_checks as checks  # noqa: E402
import learning_diagnose as diagnose  # noqa: E402

RECIPE_REWARD = "custom_reward_function.reward_kwargs={format_score: 0.1, format_needs_work: true, flexible_score: 0.2}"
# The GSM8K GRPO recipe on top of configs/gsm8k_grpo.yaml (verl's quickstart values): BENCHMARKS.md's
# 41.2% run, as benchmarks/gsm8k_grpo.sh runs it.
GRPO_RECIPE = (
    "data.train_batch_size=32",
    "actor_rollout_ref.rollout.n=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.optim.lr=2e-6",
    RECIPE_REWARD,
)
MODES = ("sync", "one_step_off", "async")
STRICT = "reward/gsm8k_strict_acc/mean"


@dataclass(frozen=True)
class Recipe:
    config: str  # a file in configs/
    what: str  # one line for the docs
    overrides: tuple[str, ...] = ()
    tool: bool = False  # multi-turn with the python tool: the tool's prompts, tools in the eval too
    model_type: str | None = None  # the model_type MODEL_DIR's config.json must have


RECIPES = {
    "grpo": Recipe("configs/gsm8k_grpo.yaml", "GRPO, the GSM8K recipe (BENCHMARKS.md run 3)", GRPO_RECIPE),
    "ppo": Recipe(
        "configs/gsm8k_ppo.yaml",
        "PPO, GAE with a critic (verl's quickstart: 256 prompts x 1, lr 1e-6, critic 1e-5)",
        (RECIPE_REWARD,),
    ),
    "dapo": Recipe(
        "configs/gsm8k_dapo.yaml", "DAPO: the GRPO recipe with clip-higher, no KL, dynamic sampling, overlong penalty"
    ),
    "grpo_lora": Recipe("configs/gsm8k_grpo_lora.yaml", "GRPO with LoRA rank 32 on every linear layer, lr 2e-5"),
    "rloo": Recipe("configs/gsm8k_rloo.yaml", "RLOO: leave-one-out baseline, KL in the reward"),
    "tool": Recipe("configs/gsm8k_tool_grpo.yaml", "GRPO with the python tool (multi-turn, 1,024 tokens, T 0.7)", tool=True),
    "notool": Recipe("configs/gsm8k_notool_grpo.yaml", "the tool recipe's settings without the tool"),
    "smollm2_grpo": Recipe(
        "configs/gsm8k_grpo.yaml",
        "the GRPO recipe on SmolLM2-135M-Instruct (Llama architecture)",
        GRPO_RECIPE,
        model_type="llama",
    ),
}


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise SystemExit(f"unknown recipe {name!r}: one of {', '.join(RECIPES)}")
    return RECIPES[name]


def _config_tree(r: Recipe) -> dict:
    return yaml.safe_load((REPO / r.config).read_text())


def _setting(r: Recipe, dotted: str):
    """A key's value in the recipe: its override, else its config file's."""
    for o in r.overrides:
        if o.startswith(dotted + "="):
            return yaml.safe_load(o.split("=", 1)[1])
    node = _config_tree(r)
    for part in dotted.split("."):
        node = node[part]
    return node


def _check_model(r: Recipe, model: str, name: str) -> None:
    if r.model_type is None:
        return
    path = Path(model) / "config.json"
    if not path.is_file():
        raise SystemExit(f"recipe {name}: {path} does not exist; MODEL_DIR must be a local Hugging Face model directory")
    found = json.loads(path.read_text()).get("model_type")
    if found != r.model_type:
        raise SystemExit(
            f"recipe {name} trains a {r.model_type} model ({r.what}): {model} has model_type {found!r}; "
            "for a Qwen model use recipe grpo"
        )


def mode_overrides(mode: str, gpus: int, pool: int | None, partial: bool | None, staleness: int) -> list[str]:
    """trainer.mode and the placement, as benchmarks/scaling.sh sets them: one_step_off and async get
    `pool` rollout GPUs of their own (default half of them; 0 or one GPU: colocated), async
    partial rollouts by default when it has that pool (the issue's "async with partial rollouts")."""
    if mode not in MODES:
        raise SystemExit(f"MODE={mode}: one of {', '.join(MODES)}")
    if gpus < 1:
        raise SystemExit(f"GPUS={gpus}: at least 1")
    out = [f"trainer.n_gpus_per_node={gpus}"] if gpus > 1 else []
    if mode == "sync":
        if pool:
            raise SystemExit(f"POOL={pool} with MODE=sync: a rollout pool of its own needs MODE=one_step_off or async")
        return out
    pool = gpus // 2 if pool is None else pool
    if pool and pool >= gpus:
        raise SystemExit(f"POOL={pool} must leave at least one of GPUS={gpus} to the actor")
    out += [f"trainer.mode={mode}"]
    if mode == "async":
        out.append(f"async_training.max_staleness={staleness}")
    if pool:
        out += [f"resource_pool.actor_rollout_ref={gpus - pool}", f"resource_pool.rollout={pool}"]
    if partial if partial is not None else mode == "async" and pool > 0:
        if not pool:
            raise SystemExit("PARTIAL=1 needs a rollout pool of its own (POOL > 0, GPUS > 1): set PARTIAL=0 on one GPU")
        out.append("async_training.partial_rollout=true")
    return out


def train_args(
    name: str, model: str, data: str, run: str, budget_s: float | None, tool_config: str, mode_args: list[str]
) -> list[str]:
    """The `hybridrl train` arguments of a recipe's row: its config, its overrides, the run's plumbing."""
    r = recipe(name)
    _check_model(r, model, name)
    args = [
        r.config,
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data}/train.parquet",
        "data.val_files=null",
        "trainer.save_freq=-1",  # the last step still saves: the `after` stage evaluates that checkpoint
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run}",
        "trainer.log_samples=2",
        "trainer.logger=[console,jsonl]",
        f"trainer.experiment_name={name}",
        *r.overrides,
        *mode_args,
    ]
    if budget_s is not None:
        args.append(f"trainer.max_wall_time_s={budget_s:g}")
    if r.tool:
        args.append(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}")
    return args


def eval_args(name: str, tool_config: str) -> list[str]:
    """`hybridrl eval` flags for the recipe: its response budget and, with the tool, its tool settings."""
    r = recipe(name)
    args = ["--max-response-length", str(_setting(r, "data.max_response_length")), "--batch-size", "512"]
    if r.tool:
        mt = _setting(r, "actor_rollout_ref.rollout.multi_turn")
        args += [
            "--tool-config",
            tool_config,
            "--multi-turn-format",
            mt["format"],
            "--max-assistant-turns",
            str(mt["max_assistant_turns"]),
        ]
    return args


def data_args(name: str) -> list[str]:
    return ["--tools", "python"] if recipe(name).tool else []


# ---- the row -------------------------------------------------------------------------------------


def eval_numbers(out: Path, which: str) -> dict | None:
    """strict, flexible accuracy and the `####` rate of OUT/eval_<which>.json(l); None if not evaluated."""
    summary, samples = out / f"eval_{which}.json", out / f"eval_{which}.jsonl"
    if not summary.is_file():
        return None
    from hybridrl.rewards.gsm8k import diagnostics

    sources = {k: v for k, v in json.loads(summary.read_text()).items() if isinstance(v, dict) and "flexible_accuracy" in v}
    if not sources:
        raise SystemExit(f"{summary} has no GSM8K accuracy: was it evaluated on `hybridrl data gsm8k` rows?")
    (m,) = sources.values()
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()] if samples.is_file() else []
    fmt = sum(diagnostics(r["response"], r["ground_truth"])["format"] for r in rows) / len(rows) if rows else None
    return {"n_eval": m["n"], "strict": m["accuracy"], "flexible": m["flexible_accuracy"], "format_rate": fmt}


def _ends(v: list[float]) -> tuple[float, float] | None:
    """Mean of the first and of the last steps (3 and 5, fewer in a shorter run)."""
    if not v:
        return None
    a, b = v[: min(checks.FIRST, len(v))], v[-min(checks.LAST, len(v)) :]
    return sum(a) / len(a), sum(b) / len(b)


def _mode(cfg: dict) -> tuple[str, int]:
    t, pool = cfg.get("trainer", {}), cfg.get("resource_pool", {}) or {}
    gpus = int(t.get("n_gpus_per_node") or 1) * int(t.get("nnodes") or 1)
    mode = t.get("mode", "sync")
    if mode != "sync" and (cfg.get("async_training") or {}).get("partial_rollout"):
        mode += " (partial)"
    if pool.get("rollout"):
        mode += f", {pool['rollout']} rollout GPU(s)"
    return mode, gpus


def trained_row(name: str, out: Path) -> dict:
    run = out / "run"
    if not (run / "metrics.jsonl").is_file():
        raise SystemExit(f"{run}/metrics.jsonl does not exist: run the train stage into {out} first")
    steps = checks.load_steps(run / "metrics.jsonl")
    cfg = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() else {}
    summary = json.loads((run / "run_summary.json").read_text()) if (run / "run_summary.json").is_file() else {}
    after = eval_numbers(out, "after")
    mode, gpus = _mode(cfg)
    reward = _ends(checks.values(steps, checks.SCORE))
    improbable = checks.values(steps, checks.IMPROBABLE)
    collapsed, why = checks.collapse(steps)
    return {
        "recipe": name,
        "model": Path(str(cfg.get("actor_rollout_ref", {}).get("model", {}).get("path", "?"))).name,
        "mode": mode,
        "gpus": gpus,
        "budget_s": cfg.get("trainer", {}).get("max_wall_time_s"),
        "wall_s": summary.get("wall_time_s"),
        "steps": steps[-1]["step"] if steps else 0,
        "train_s": sum(checks.values(steps, "timing_s/step")),
        **(after or {"n_eval": None, "strict": None, "flexible": None, "format_rate": None}),
        "reward_first": reward and reward[0],
        "reward_last": reward and reward[1],
        "improbable_max": max(improbable) if improbable else None,
        "collapsed": collapsed,
        "collapse": why,
    }


def base_row(name: str, out: Path, model: str) -> dict | None:
    before = eval_numbers(out, "before")
    if before is None:
        return None
    return {"recipe": f"{name} (base model)", "model": model, "mode": "-", "gpus": 0, "budget_s": 0, "steps": 0,
            **before, "reward_first": None, "reward_last": None, "improbable_max": None,
            "collapsed": False, "collapse": "-"}  # fmt: skip


HEADER = (
    "| recipe | model | mode | GPUs | budget s | steps | strict | flexible | `####` rate | reward first 3 -> last 5 steps "
    "| improbable-token max | collapse |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def _pct(v) -> str:
    return "not evaluated" if v is None else f"{100 * v:.1f}%"


def markdown(row: dict) -> str:
    reward = "-" if row["reward_first"] is None else f"{row['reward_first']:.3f} -> {row['reward_last']:.3f}"
    imp = "-" if row["improbable_max"] is None else f"{row['improbable_max']:.1e}"
    budget = "-" if row["budget_s"] is None else f"{row['budget_s']:g}"
    cells = [row["recipe"], row["model"], row["mode"], str(row["gpus"]), budget, str(row["steps"]),
             _pct(row["strict"]), _pct(row["flexible"]), _pct(row["format_rate"]), reward, imp,
             ("**yes**: " if row["collapsed"] else "") + row["collapse"]]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def write_row(name: str, out: Path) -> list[dict]:
    """The recipe's row (and the base model's, when `before` ran) printed and written to OUT/results/:
    row.md, row.json, reward_vs_time.svg, windows.md (the run in windows of 25 steps: learning_diagnose.py),
    and the run's small files (metrics, samples, eval summaries)."""
    recipe(name)
    res = out / "results"
    res.mkdir(parents=True, exist_ok=True)
    trained = trained_row(name, out) if (out / "run").is_dir() else None
    model_dir = out / "model_dir"  # written by the before and train stages
    base = base_row(name, out, Path(model_dir.read_text().strip()).name if model_dir.is_file() else "?")
    rows = [r for r in (base, trained) if r is not None]
    if not rows:
        raise SystemExit(f"{out} holds neither a run (train stage) nor eval_before.json (before stage)")
    text = "\n".join([HEADER, *map(markdown, rows)])
    print(text)
    (res / "row.md").write_text(text + "\n")
    (res / "row.json").write_text(json.dumps(rows, indent=2) + "\n")
    if trained:
        steps = checks.load_steps(out / "run" / "metrics.jsonl")
        t, score = curve(steps, checks.SCORE)
        lines = [("reward (critic/score/mean)", t, score)]
        for key, label in ((checks.FORMAT, "`####` rate of the samples"), (STRICT, "strict accuracy of the samples")):
            if checks.values(steps, key):
                lines.append((label, *curve(steps, key)))
        title = f"{name} on {trained['model']}: {trained['steps']} steps, strict {_pct(trained['strict'])} after"
        (res / "reward_vs_time.svg").write_text(svg_plot(lines, title, "training seconds (sum of step times)", "per step"))
        for f in ("metrics.jsonl", "samples.jsonl", "run_summary.json", "config.yaml"):
            if (out / "run" / f).is_file():
                shutil.copy(out / "run" / f, res / f)
        # where the run learned and where it stopped (docs/learning.md: a row that misses its goal says why)
        (res / "windows.md").write_text(diagnose.windows(out, 25) + "\n")
    for f in out.glob("eval_*.json*"):
        shutil.copy(f, res / f.name)
    print(f"wrote {res}/ (row.md, row.json{', reward_vs_time.svg, windows.md' if trained else ''})")
    return rows


# ---- reward against wall-clock, as SVG -----------------------------------------------------------


def curve(steps: list[dict], key: str) -> tuple[list[float], list[float]]:
    """`key` against the training seconds at the end of each step (the running sum of timing_s/step:
    start-up before the first step is not counted; the first step's compilation is)."""
    t, xs, ys = 0.0, [], []
    for r in steps:
        t += float(r.get("timing_s/step", 0.0))
        if isinstance(r.get(key), (int, float)):
            xs.append(t)
            ys.append(float(r[key]))
    return xs, ys


COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")


def _ticks(lo: float, hi: float) -> list[float]:
    """Round tick values that cover [lo, hi] (an empty range: [lo, lo + 1]) in about four intervals of 1,
    2, 2.5 or 5 times a power of ten."""
    hi = hi if hi - lo > 1e-9 else lo + 1.0
    raw = (hi - lo) / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, max(last, first + 1) + 1)]


def svg_plot(lines: list[tuple[str, list[float], list[float]]], title: str, xlabel: str, ylabel: str) -> str:
    """A line chart: one polyline per (label, xs, ys), axes with five ticks, a legend."""
    W, H, L, R, T, B = 720, 400, 70, 20, 40, 50
    xs = [x for _, x, _ in lines for x in x] or [0.0, 1.0]
    ys = [y for _, _, y in lines for y in y] or [0.0, 1.0]
    xt, yt = _ticks(0.0, max(xs)), _ticks(min(0.0, min(ys)), max(ys))
    (x0, x1), (y0, y1) = (xt[0], xt[-1]), (yt[0], yt[-1])

    def px(x: float) -> float:
        return L + (x - x0) / (x1 - x0) * (W - L - R)

    def py(y: float) -> float:
        return H - B - (y - y0) / (y1 - y0) * (H - T - B)

    esc = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{esc(title)}</text>',
        f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
    ]
    for x in xt:
        out.append(f'<text x="{px(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x:.4g}</text>')
    for y in yt:
        out.append(f'<line x1="{L}" y1="{py(y):.1f}" x2="{W - R}" y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.3g}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">{esc(xlabel)}</text>')
    mid = (T + H - B) / 2
    out.append(f'<text x="16" y="{mid}" text-anchor="middle" transform="rotate(-90 16 {mid})">{esc(ylabel)}</text>')
    out.append(
        f'<rect x="{W - R - 258}" y="{H - B - 16 * len(lines) - 14}" width="254" height="{16 * len(lines) + 6}" '
        'fill="white" fill-opacity="0.85" stroke="#ccc"/>'
    )
    for i, (label, lx, ly) in enumerate(lines):
        color = COLORS[i % len(COLORS)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(lx, ly))
        out.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"><title>{esc(label)}</title></polyline>'
        )
        y = H - B - 16 * (len(lines) - i) - 4  # the legend: bottom right, where rising curves are not
        out.append(f'<line x1="{W - R - 250}" y1="{y}" x2="{W - R - 230}" y2="{y}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{W - R - 224}" y="{y + 4}">{esc(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def plot_runs(outs: list[Path], labels: list[str] | None, key: str, dest: Path, title: str) -> None:
    """Several rows' `key` against training seconds in one chart (e.g. sync vs one_step_off vs async)."""
    if labels and len(labels) != len(outs):
        raise SystemExit(f"--labels: {len(labels)} labels for {len(outs)} runs")
    lines = []
    for i, out in enumerate(outs):
        lines.append((labels[i] if labels else out.name, *curve(_metrics(out), key)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(svg_plot(lines, title or f"{key} against training wall-clock", "training seconds (sum of step times)", key))
    print(f"wrote {dest}")


def _metrics(out: Path) -> list[dict]:
    """A row's training steps: OUT/run/metrics.jsonl, or the copy in OUT/results/ (fetched from the GPU)."""
    return checks.load_steps(diagnose.row_file(out, "metrics.jsonl"))


def time_to_reach(steps: list[dict], key: str, target: float, window: int) -> float | None:
    """Training seconds at the end of the first `window` steps in a row whose mean of `key` is at least
    `target`; None if none is."""
    t, v = curve(steps, key)
    for i in range(window - 1, len(v)):
        if sum(v[i - window + 1 : i + 1]) / window >= target:
            return t[i]
    return None


def reach_table(outs: list[Path], key: str, window: int) -> str:
    """Issue 51's item 2: the first row (sync) ends at some mean of `key` over its last `window` steps;
    how many training seconds each row needs to reach it, and what share of the first row's whole run
    that is (the goal: async within 0.65)."""
    runs = [(out.name, _metrics(out)) for out in outs]
    ref = checks.values(runs[0][1], key)
    if len(ref) < window:
        raise SystemExit(f"{outs[0]}: {len(ref)} steps log {key}; --window {window} needs as many")
    target, total = sum(ref[-window:]) / window, curve(runs[0][1], key)[0][-1]
    lines = [
        f"target: {key} {target:.3f}, the mean of {runs[0][0]}'s last {window} steps ({total:.0f} training s)",
        f"| run | steps | training s | s to reach {target:.3f} ({window}-step mean) | share of {runs[0][0]}'s {total:.0f} s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, steps in runs:
        t = time_to_reach(steps, key, target, window)
        cells = [name, str(steps[-1]["step"]), f"{curve(steps, key)[0][-1]:.0f}"]
        cells += ["not reached", "-"] if t is None else [f"{t:.0f}", f"{t / total:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train-args", help="the `hybridrl train` arguments of a recipe, one per line")
    t.add_argument("recipe")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True, help="directory with train.parquet (hybridrl data gsm8k)")
    t.add_argument("--run", required=True, help="the run directory (trainer.default_local_dir)")
    t.add_argument("--budget-s", type=float, default=None, help="trainer.max_wall_time_s (none: the steps decide)")
    t.add_argument("--mode", default="sync", help="trainer.mode: sync, one_step_off, async")
    t.add_argument("--gpus", type=int, default=1)
    t.add_argument("--pool", type=int, default=None, help="rollout GPUs of their own (default: half, off-policy modes)")
    t.add_argument("--partial", type=int, choices=(0, 1), default=None, help="partial rollouts (default: on for async)")
    t.add_argument("--staleness", type=int, default=2, help="async_training.max_staleness of async")
    t.add_argument("--tool-config", default="configs/tools/python.yaml")
    sub.add_parser("list", help="the recipes: name, config, what it is")
    e = sub.add_parser("eval-args", help="the `hybridrl eval` flags of a recipe, one per line")
    e.add_argument("recipe")
    e.add_argument("--tool-config", default="configs/tools/python.yaml")
    d = sub.add_parser("data-args", help="the `hybridrl data gsm8k` flags of a recipe, one per line")
    d.add_argument("recipe")
    r = sub.add_parser("row", help="print the recipe's table row and write OUT/results/")
    r.add_argument("recipe")
    r.add_argument("out")
    p = sub.add_parser("plot", help="several rows' reward against training seconds, one SVG")
    p.add_argument("outs", nargs="+", type=Path)
    p.add_argument("--out", required=True, type=Path, help="the SVG to write (e.g. docs/img/learning_async.svg)")
    p.add_argument("--labels", nargs="*")
    p.add_argument("--key", default=checks.SCORE)
    p.add_argument("--title", default="")
    q = sub.add_parser("reach", help="training seconds each row needs to reach the first row's final accuracy")
    q.add_argument("outs", nargs="+", type=Path, help="the reference row (sync) first, then the others")
    q.add_argument("--key", default=STRICT, help="a per-step metric (default: the samples' strict accuracy)")
    q.add_argument("--window", type=int, default=10, help="steps averaged (one step's batch is noisy)")
    a = ap.parse_args(argv)
    if a.command == "train-args":
        modes = mode_overrides(a.mode, a.gpus, a.pool, None if a.partial is None else bool(a.partial), a.staleness)
        print("\n".join(train_args(a.recipe, a.model, a.data, a.run, a.budget_s, a.tool_config, modes)))
    elif a.command == "list":
        print("| recipe | config | what |\n| --- | --- | --- |")
        print("\n".join(f"| `{name}` | `{r.config}` | {r.what} |" for name, r in RECIPES.items()))
    elif a.command == "eval-args":
        print("\n".join(eval_args(a.recipe, a.tool_config)))
    elif a.command == "data-args":
        print("\n".join(data_args(a.recipe)))
    elif a.command == "row":
        write_row(a.recipe, Path(a.out))
    elif a.command == "reach":
        print(reach_table(a.outs, a.key, a.window))
    else:
        plot_runs(a.outs, a.labels, a.key, a.out, a.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
