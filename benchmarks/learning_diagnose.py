"""Why a learning-table row ends where it does (issue 51: "find why from its samples and metrics"), from
the files a row brings back (OUT/results/ or OUT/run/):

    python benchmarks/learning_diagnose.py windows OUT [--window 25]   # the run in windows of steps
    python benchmarks/learning_diagnose.py flips OUT_A OUT_B            # two rows' test answers, question by question

`windows` prints, per window of steps: the training seconds reached, the samples' strict accuracy and
`####` rate, the entropy, the KL to the reference, the response length, the pass over the training set,
and how many prompts could teach a group-relative estimator anything: the share whose samples all
scored alike (`critic/groups/no_signal_frac`) and the share all at the top score (solved every time).
Runs from before that metric count the groups logged in samples.jsonl instead (a few per step) and
say so. A DAPO row trains on the groups dynamic sampling kept, so there the shares count every generated
group (`train/generated/*`; older DAPO runs: the dropped share, 1 - kept / generated).

`flips` pairs two rows' greedy test answers (eval_after.jsonl): right in both, in one only, in
neither, and McNemar's test of the difference: with two models this close, a quarter of the answers
flip between them, so a gap of a few points needs this test before it means anything.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_checks import load_steps, read_jsonl  # noqa: E402

STRICT, FORMAT = "reward/gsm8k_strict_acc/mean", "reward/gsm8k_format/mean"
NO_SIGNAL, ALL_TOP = "critic/groups/no_signal_frac", "critic/groups/all_top_frac"
# dynamic sampling (DAPO): every generated group, before the filter; older runs have only the counts
GEN_NO_SIGNAL, GEN_ALL_TOP = "train/generated/no_signal_frac", "train/generated/all_top_frac"
GENERATED, KEPT = "train/num_groups_generated", "train/num_groups_kept"
DYNAMIC_NOTE = (
    "Dynamic sampling: the trained batch holds only groups whose scores differ, so the shares above count every "
    "generated group, before the filter. The samples' columns are each step's last generation round, all of its responses."
)
COLUMNS = (  # (metric, header, format)
    ("timing_s/step", "training s (end)", None),
    (STRICT, "strict (samples)", "{:.3f}"),
    (FORMAT, "`####` (samples)", "{:.3f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("actor/kl_loss", "KL to ref", "{:.3f}"),
    ("response_length/mean", "length", "{:.0f}"),
    ("training/epoch", "epoch (last step)", "{:.0f}"),
)


def row_file(out: Path, name: str) -> Path:
    """A row's file: OUT/run/NAME on the machine that trained it, OUT/results/NAME once fetched, or OUT/NAME."""
    for path in (out / "run" / name, out / "results" / name, out / name):
        if path.is_file():
            return path
    raise SystemExit(f"{out}: no {name} in run/, results/ or itself: pass a learning-table row's OUT")


def _mean(v: list[float]) -> float | None:
    return sum(v) / len(v) if v else None


def logged_groups(samples: list[dict], lo: int, hi: int, top: float) -> tuple[float, float, int] | None:
    """(share of the training groups logged in steps lo..hi whose scores are all equal, share all equal
    to `top`, number of groups); None when none has more than one sample. The definition of
    hybridrl.trainer.metrics.group_metrics, without torch (these scripts stay light)."""
    groups = [s["scores"] for s in samples if s.get("kind") == "train" and lo <= s["step"] <= hi and len(s["scores"]) > 1]
    if not groups:
        return None
    alike = [max(g) - min(g) <= 1e-6 for g in groups]
    at_top = [a and abs(min(g) - top) <= 1e-6 for a, g in zip(alike, groups)]
    return sum(alike) / len(groups), sum(at_top) / len(groups), len(groups)


def _group_shares(steps: list[dict]):
    """(the column's source, part -> (share alike, share at the top)) from the per-step metrics, or None when
    the run logged none (then samples.jsonl's groups are counted). With dynamic sampling, every generated
    group (train/generated/*), or for runs before that metric the dropped share, 1 - kept / generated."""

    def means(a_key, t_key):
        return lambda part: (_mean([r[a_key] for r in part if a_key in r]), _mean([r[t_key] for r in part if t_key in r]))

    if any(GEN_NO_SIGNAL in r for r in steps):
        return "every generated group, per step (train/generated/*)", means(GEN_NO_SIGNAL, GEN_ALL_TOP)
    if any(GENERATED in r for r in steps):

        def dropped(part):
            counted = [r for r in part if GENERATED in r and KEPT in r]
            gen = sum(r[GENERATED] for r in counted)
            return (1 - sum(r[KEPT] for r in counted) / gen if gen else None), None

        return "dropped by dynamic sampling, 1 - kept / generated groups", dropped
    if any(NO_SIGNAL in r for r in steps):
        return "per step (critic/groups/*)", means(NO_SIGNAL, ALL_TOP)
    return None


def windows(out: Path, window: int) -> str:
    if window < 1:
        raise SystemExit(f"--window {window}: a window holds at least one step")
    steps = [r for r in load_steps(row_file(out, "metrics.jsonl")) if "timing_s/step" in r]
    if not steps:
        raise SystemExit(f"{out}: metrics.jsonl has no training step")
    try:
        samples = read_jsonl(row_file(out, "samples.jsonl"))
    except SystemExit:
        samples = []
    scores = [x for s in samples if s.get("kind") == "train" for x in s["scores"]]
    top = max(scores) if scores else 0.0
    shares = _group_shares(steps)
    source = shares[0] if shares else "groups logged in samples.jsonl"
    head = [f"steps ({window} a window)"] + [h for _, h, _ in COLUMNS] + [f"alike ({source})", "all at the top score"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    clock = 0.0
    for i in range(0, len(steps), window):
        part = steps[i : i + window]
        lo, hi = part[0]["step"], part[-1]["step"]
        clock += sum(r["timing_s/step"] for r in part)
        cells = [f"{lo}-{hi}", f"{clock:.0f}"]
        for key, _, fmt in COLUMNS[1:]:
            m = part[-1].get(key) if key == "training/epoch" else _mean([r[key] for r in part if key in r])
            cells.append("-" if m is None else fmt.format(m))
        if shares:
            a, t = shares[1](part)
            cells += ["-" if a is None else f"{a:.2f}", "-" if t is None else f"{t:.2f}"]
        else:
            g = logged_groups(samples, lo, hi, top)
            cells += ["-", "-"] if g is None else [f"{g[0]:.2f} (of {g[2]})", f"{g[1]:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if any(GENERATED in r for r in steps):
        lines += ["", DYNAMIC_NOTE]
    return "\n".join(lines)


def _answers(out: Path) -> dict:
    rows = read_jsonl(row_file(out, "eval_after.jsonl"))
    try:
        return {r["index"]: r["score"] >= 1.0 for r in rows}
    except KeyError as e:
        raise SystemExit(f"{out}: eval_after.jsonl rows need 'index' and 'score' (missing {e})") from None


def mcnemar(only_a: int, only_b: int) -> float:
    """Two-sided exact p-value of McNemar's test: under "equally good", each discordant question is a fair
    coin, so min(only_a, only_b) or fewer of them going one way is a binomial tail."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def flips(a: Path, b: Path) -> str:
    ra, rb = _answers(a), _answers(b)
    if set(ra) != set(rb):
        raise SystemExit(f"{a} and {b} answered different questions ({len(ra)} and {len(rb)}): compare rows of one test set")
    both = sum(ra[i] and rb[i] for i in ra)
    only_a = sum(ra[i] and not rb[i] for i in ra)
    only_b = sum(rb[i] and not ra[i] for i in ra)
    n, differ = len(ra), only_a + only_b
    return "\n".join([
        f"| A: {a} | B: {b} | questions | A | B | right in both | A only | B only | neither | differ | McNemar exact p |",
        "|" + " --- |" * 11,
        f"| | | {n} | {100 * (both + only_a) / n:.1f}% | {100 * (both + only_b) / n:.1f}% | {both} | {only_a} | {only_b} "
        f"| {n - both - differ} | {differ} ({100 * differ / n:.0f}%) | {mcnemar(only_a, only_b):.3f} |",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("windows", help="the run in windows of steps: accuracy, entropy, KL, groups without signal")
    w.add_argument("out", type=Path)
    w.add_argument("--window", type=int, default=25)
    f = sub.add_parser("flips", help="two rows' greedy test answers, question by question")
    f.add_argument("outs", nargs=2, type=Path)
    a = ap.parse_args(argv)
    print(windows(a.out, a.window) if a.command == "windows" else flips(*a.outs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
