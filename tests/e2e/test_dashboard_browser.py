"""`hybridrl dashboard` over 100 synthetic runs, in headless Chromium: the run list, its filters,
compare-selected, the page's height, and polls that carry only what changed.

The view is driven through the page's address (`#runs?filter=..&status=..&compare=a,b`), which
the list's controls write as they change, so a view can be linked; the checks read what the
page's script wrote into the DOM.
"""

import html
import json
import os
import re
import time
from urllib.parse import quote

import pytest
from test_report_browser import chromium

from hybridrl.tracking.dashboard import Dashboard

pytestmark = pytest.mark.slow
N, STEPS = 100, 60


def name(i: int) -> str:
    return f"proj/exp{i:03d}-{'lr1e-6' if i % 2 else 'lr3e-6'}"


def reward(i: int, step: int) -> float:
    return round(0.001 * i + 0.01 * step, 6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """100 runs: i % 3 == 0 finished (ten minutes ago), == 1 stalled (an hour ago), == 2 running
    (the higher i, the more recently written); run 50 has a config.yaml that is a list (damaged)."""
    root = tmp_path_factory.mktemp("runs")
    now = time.time()
    for i in range(N):
        run = root / name(i)
        run.mkdir(parents=True)
        rows = [
            {"step": s, "critic/score/mean": reward(i, s), "actor/kl_loss": 0.001 * s, "timing_s/gen": 0.3, "timing_s/step": 0.5}
            for s in range(1, STEPS + 1)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "config.yaml").write_text("- 1\n- 2\n" if i == 50 else f"trainer:\n  total_training_steps: {2 * STEPS}\n")
        if i % 3 == 0:
            (run / "run_summary.json").write_text("{}")
        if i == 98:  # the rollout inspector's run: it loads its prompt groups alone
            groups = [
                {"step": s, "kind": "train", "prompt": f"q{s}", "responses": ["a", "b"], "scores": [1.0, 0.0]} for s in (1, 2, 3)
            ]
            (run / "samples.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))
        written = (now - 600, now - 3600, now - 30 + 0.2 * i)[i % 3]
        for f in run.iterdir():
            os.utime(f, (written, written))
    return root


def attr(dom: str, key: str) -> str:
    m = re.search(rf'data-{key}="([^"]*)"', dom)
    assert m, key
    return html.unescape(m.group(1))


def rows(dom: str) -> dict:
    """{run: (status, selected)} of the run list's rows."""
    found = re.findall(r'<tr class="run-row[^"]*" data-run="([^"]+)" data-status="(\w+)" data-selected="(\d)"', dom)
    return {n: (s, sel == "1") for n, s, sel in found}


def chart_last(dom: str, chart_id: str) -> tuple[int, dict]:
    m = re.search(rf'<div class="chart" id="chart-{chart_id}"([^>]*)>', dom)
    assert m, chart_id
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(1)))
    return int(attrs["series"]), json.loads(attrs["last"].replace("&quot;", '"'))


def test_hundred_runs_list_poll_deltas_and_bounded_height(runs, tmp_path):
    grown = [name(98), name(95)]  # the most recently written: they write a step while the page is open

    def write_steps(n_served: int) -> None:
        if n_served == 3:  # the page has loaded: the run list, then the compared runs' curves
            for n in grown:
                with (runs / n / "metrics.jsonl").open("a") as f:
                    f.write(json.dumps({"step": STEPS + 1, "critic/score/mean": 0.875, "timing_s/step": 0.5}) + "\n")

    dash = Dashboard(runs, port=0, interval_ms=500)
    dash.after_data = write_steps
    dash.start()
    try:
        dom = chromium(dash.url, tmp_path, budget_ms=6000)
    finally:
        dash.stop()
    listed = rows(dom)
    assert attr(dom, "runs") == str(N) and len(listed) == N
    want = {name(i): "bad" if i == 50 else ("finished", "stalled", "running")[i % 3] for i in range(N)}
    assert {n: s for n, (s, _) in listed.items()} == want
    assert "holds a list, not the mapping of a resolved config" in dom  # the damaged run's reason, in its row

    # polls: every run's summary, then the compared runs' curves, (nothing new), then only the
    # two runs' new lines, then almost nothing
    sent = json.loads(attr(dom, "bytes"))
    assert len(sent) >= 5 and sent == list(dash.sent)[: len(sent)], (sent, dash.sent)
    print("bytes per poll", sent)
    assert sent[2] < 200 and sent[3] * 20 < sent[0] + sent[1] and max(sent[4:]) < 200, sent
    steps = json.loads(attr(dom, "last-steps"))
    assert all(steps[n] == STEPS + 1 for n in grown) and steps[name(3)] == STEPS

    # by default the five most recently written runs are compared
    assert {n for n, (_, sel) in listed.items() if sel} == {name(i) for i in (98, 95, 92, 89, 86)}
    series, last = chart_last(dom, "reward")
    assert series == 5 and all(last[n] == {"step": STEPS + 1, "value": 0.875} for n in grown)
    # the inspector shows the first compared run's prompt groups, fetched for that run alone
    assert re.search(r'<b id="match-count">(\d+)</b>', dom).group(1) == "3" and dash.requests["samples"] >= 1
    height = int(attr(dom, "height"))
    assert 1500 < height < 6000, height


def test_filter_and_compare_two_runs(runs, tmp_path):
    a, b = name(11), name(42)
    dash = Dashboard(runs, port=0, interval_ms=1000).start()
    try:
        view = "#runs?filter=exp01&status=running&compare=" + quote(f"{a},{b}")
        dom = chromium(dash.url + view, tmp_path, budget_ms=4000)
    finally:
        dash.stop()
    listed = rows(dom)
    assert set(listed) == {name(i) for i in (11, 14, 17)}  # "exp01" in the name, and running
    assert listed[a] == ("running", True) and not listed[name(14)][1]
    series, last = chart_last(dom, "reward")
    assert series == 2 and last == {
        a: {"step": STEPS, "value": reward(11, STEPS)},
        b: {"step": STEPS, "value": reward(42, STEPS)},
    }
    table = re.search(r'<table id="summary-table">(.*?)</table>', dom, re.S).group(1)
    assert re.findall(r"<th>(proj/[^<]+)</th>", table) == [a, b]
    assert int(attr(dom, "height")) < 6000


def test_the_list_controls_filter_and_compare_when_used(runs, tmp_path):
    """The same page as a static report of 12 runs, driven like a user: type in the filter, click
    "compare shown", untick a run (a script added to the page does it, then the DOM is read)."""
    from hybridrl.cli.report import build_report

    page, _ = build_report([str(runs / name(i)) for i in range(12) if i != 50])
    user = """<script>
    const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
    (async () => {
      await sleep(300);
      const q = document.getElementById("run-filter");
      q.value = "exp01"; q.dispatchEvent(new Event("input"));
      await sleep(100);
      document.getElementById("compare-shown").click();
      await sleep(300);
      document.body.dataset.afterCompare = document.getElementById("chart-reward").dataset.series;
      document.querySelector('tr[data-run="exp010-lr3e-6"] input').click();
      await sleep(300);
      document.body.dataset.afterUntick = document.getElementById("chart-reward").dataset.series;
      document.body.dataset.address = location.hash;
    })();
    </script>"""
    out = tmp_path / "twelve.html"
    out.write_text(page.replace("</body>", user + "</body>"))
    dom = chromium(out.as_uri(), tmp_path, budget_ms=3000)
    assert set(rows(dom)) == {"exp010-lr3e-6", "exp011-lr1e-6"}  # a report names runs by their directory
    assert attr(dom, "after-compare") == "2" and attr(dom, "after-untick") == "1"
    series, last = chart_last(dom, "reward")
    assert series == 1 and list(last) == ["critic/score/mean"]  # one run: a line per metric, named by its key
    assert attr(dom, "address") == "#runs?filter=exp01&compare=exp011-lr1e-6"
