"""`hybridrl report` and `hybridrl dashboard` opened in headless Chromium, on a real (tiny) run.

The page's script runs in the browser (`--dump-dom` prints the DOM after it ran); the checks read
what it wrote there: each chart's last point, the pixels drawn in its first series' colour, the
rollout inspector's match count under a filter, and the dashboard picking up a step written
while the page was open. Chromium is Debian's `chromium` package (CI installs it).
"""

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from cli_helpers import cli, metrics

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(url: str, tmp_path: Path, *extra: str, budget_ms: int = 4000) -> str:
    """The DOM of `url` after its scripts ran for `budget_ms` of virtual time."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    profile = tmp_path / "chromium-profile"
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        "--window-size=1400,3000",
        "--dump-dom",
        *extra,
        url,
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def chart_attrs(dom: str, chart_id: str) -> dict:
    m = re.search(rf'<div class="chart" id="chart-{re.escape(chart_id)}"([^>]*)>', dom)
    assert m, f"chart {chart_id} not rendered"
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(1)))
    attrs["last"] = json.loads(attrs["last"].replace("&quot;", '"'))
    return attrs


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A few GRPO steps of the quickstart task after a short warm-up (some responses are right)."""
    out = tmp_path_factory.mktemp("runs") / "quick" / "arith"
    cli(
        "train",
        ROOT / "configs/quickstart.yaml",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console,jsonl]",
        "trainer.total_training_steps=4",
        "trainer.test_freq=2",
        "trainer.save_freq=-1",
        "warmup.steps=40",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "data.val_max_samples=16",
        "trainer.log_val_samples=16",
        cwd=ROOT,
    )
    return out


def test_report_renders_the_runs_numbers_and_the_sample_filter_works(run_dir, tmp_path):
    html = tmp_path / "report.html"
    proc = cli("report", run_dir, "--out", html)
    assert f"wrote {html}" in proc.stdout
    rows = metrics(run_dir)
    dom = chromium(html.as_uri(), tmp_path)

    # charts: the last point of each curve is the run's last value, and the line was drawn
    last = [r for r in rows if "critic/score/mean" in r][-1]
    reward = chart_attrs(dom, "reward")
    assert reward["last"]["critic/score/mean"] == {"step": last["step"], "value": last["critic/score/mean"]}
    assert int(reward["ink"]) > 20
    val_rows = [r for r in rows if "val-core/arith/reward/mean@1" in r]
    val = chart_attrs(dom, "val")
    assert val["last"]["val-core/arith/reward/mean@1"]["value"] == val_rows[-1]["val-core/arith/reward/mean@1"]
    assert int(val["points"]) == len(rows)
    kl = chart_attrs(dom, "kl")
    assert kl["last"]["actor/kl_loss"]["value"] == rows[-1]["actor/kl_loss"] and int(kl["ink"]) > 20
    timing = chart_attrs(dom, "timing-0")
    assert timing["last"]["gen"]["value"] == rows[-1]["timing_s/gen"]
    groups = chart_attrs(dom, "groups")  # GRPO with n=4: the share of prompts that teach nothing
    assert groups["last"]["critic/groups/no_signal_frac"]["value"] == rows[-1]["critic/groups/no_signal_frac"]
    for chart in ("entropy", "resp_len", "grad_norm", "throughput", "step_time"):
        assert int(chart_attrs(dom, chart)["ink"]) > 0, chart
    assert f">{rows[-1]['step']} / 4<" in dom  # the summary's steps row
    assert " s/step, median of steps 2–4; step 1: " in dom  # the training time row: without the first step's compiling

    # the rollout inspector: the filter in the page's address selects what Python selects
    groups = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {g["kind"] for g in groups} == {"train", "val"}
    assert any(max(g["scores"]) >= 1 for g in groups), "the warm-up should get some answers right"
    for query, keep in (
        ("min=1", lambda g: max(g["scores"]) >= 1),
        ("kind=val&max=0", lambda g: g["kind"] == "val" and min(g["scores"]) <= 0),
        ("kind=train&step=2", lambda g: g["kind"] == "train" and g["step"] == 2),
    ):
        want = [g for g in groups if keep(g)]
        dom = chromium(html.as_uri() + "#inspector?" + query, tmp_path)
        assert re.search(r'<b id="match-count">(\d+)</b>', dom).group(1) == str(len(want)), query
        shown = re.findall(r'<div class="group" data-step="(\d+)" data-kind="(\w+)"[^>]*data-scores="([^"]*)"', dom)
        assert len(shown) == min(10, len(want)) and shown, query
        for step, kind, scores in shown:
            assert keep({"step": int(step), "kind": kind, "scores": json.loads(scores)}), (query, step, kind)


def test_dashboard_serves_the_live_page_and_prometheus_and_picks_up_a_new_step(run_dir, tmp_path):
    from hybridrl.cli.report import config_diff
    from hybridrl.tracking.dashboard import Dashboard

    runs = tmp_path / "runs"
    shutil.copytree(run_dir, runs / "exp1")
    rows = metrics(runs / "exp1")
    new_step = rows[-1]["step"] + 1
    dash = Dashboard(runs, port=0, interval_ms=500, config_diff=config_diff).start()

    def write_a_step(n_served: int) -> None:  # the run trains on while the page is open
        if n_served == 1:
            with (runs / "exp1" / "metrics.jsonl").open("a") as f:
                f.write(
                    json.dumps({"step": new_step, "critic/score/mean": 0.987654, "timing_s/step": 0.5, "timing_s/gen": 0.25})
                    + "\n"
                )

    dash.after_data = write_a_step
    try:
        dom = chromium(dash.url, tmp_path, budget_ms=6000)
        assert dash.requests["data"] >= 2
        reward = chart_attrs(dom, "reward")
        assert reward["last"]["critic/score/mean"] == {"step": new_step, "value": 0.987654}
        assert f'data-last-steps="{{&quot;exp1&quot;:{new_step}}}"' in dom
        text = urllib.request.urlopen(dash.url + "metrics", timeout=10).read().decode()
        assert f'hybridrl_step{{run="exp1"}} {float(new_step)}' in text.splitlines()
        assert 'hybridrl_reward{run="exp1"} 0.987654' in text.splitlines()
        assert 'hybridrl_stage_seconds{run="exp1",stage="gen"} 0.25' in text.splitlines()
    finally:
        dash.stop()
