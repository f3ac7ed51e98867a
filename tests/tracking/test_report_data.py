"""What the report, the dashboard and the end-of-run summary compute from a run's files."""

import json
import random
from pathlib import Path

import pytest

from hybridrl.tracking.dashboard import prometheus_text
from hybridrl.tracking.report import downsample, render_page, summarize
from hybridrl.tracking.runlog import find_runs, load_run, read_jsonl
from hybridrl.tracking.samples import append_jsonl, dump_rows, group_dump_rows, normalize_group, prompt_groups
from hybridrl.tracking.summary import build_summary, format_summary
from hybridrl.tracking.tracker import ConsoleLogger


def _write(path, rows, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_read_jsonl_keeps_complete_lines_and_reports_a_partial_last_one(tmp_path):
    p = tmp_path / "metrics.jsonl"
    _write(p, [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}], tail='{"step": 3, "a"')
    rows, notes = read_jsonl(p)
    assert [r["step"] for r in rows] == [1, 2]
    assert len(notes) == 1 and "partial last line" in notes[0] and "15 bytes" in notes[0]
    p.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    rows, notes = read_jsonl(p)
    assert [r["step"] for r in rows] == [1, 2] and "line 2" in notes[0]


def test_downsample_averages_buckets_and_keeps_the_last_step():
    rng = random.Random(4)
    rows = [{"step": s, "r": rng.random()} for s in range(1, 11)]
    rows[4]["val"] = 0.5  # a sparse key: present on one row only
    cols = downsample(rows, max_points=5)
    assert cols["step"] == [2, 4, 6, 8, 10]
    for i in range(5):
        assert cols["r"][i] == pytest.approx((rows[2 * i]["r"] + rows[2 * i + 1]["r"]) / 2)
    assert cols["val"] == [None, None, 0.5, None, None]
    assert downsample(rows, max_points=100)["r"] == [r["r"] for r in rows]  # short runs: untouched


def test_summarize_reward_validation_and_stage_times(tmp_path):
    rows = [{"step": 0, "val-core/arith/reward/mean@1": 0.25}]
    scores = [0.1 * s for s in range(1, 21)]  # 20 steps: first/last 10% = 2 steps
    for s, sc in enumerate(scores, 1):
        rows.append({"step": s, "critic/score/mean": sc, "timing_s/gen": 0.3, "timing_s/update_actor": 0.1, "timing_s/step": 0.5})
    # the first step compiles: 10x the others; step 7 captured a graph
    rows[1].update({"timing_s/step": 5.0, "timing_s/gen": 4.0, "timing_s/update_actor": 0.8})
    rows[7].update({"timing_s/step": 1.4, "timing_s/gen": 1.1})
    rows[10]["val-core/arith/reward/mean@1"] = 0.75
    rows[20]["val-core/arith/reward/mean@1"] = 0.5
    _write(tmp_path / "metrics.jsonl", rows)
    s = summarize(load_run(tmp_path))
    assert s["last_step"] == 20 and s["reward_window"] == 2
    assert s["reward_first"] == pytest.approx(0.15) and s["reward_last"] == pytest.approx(1.95)
    v = s["validation"]["val-core/arith/reward/mean@1"]
    assert (v["first"], v["first_step"], v["last"], v["last_step"], v["best"], v["best_step"]) == (0.25, 0, 0.5, 20, 0.75, 10)
    gen_mean, update_mean = (4.0 + 1.1 + 18 * 0.3) / 20, (0.8 + 19 * 0.1) / 20
    assert s["stage_mean_s"] == {"gen": pytest.approx(gen_mean), "update_actor": pytest.approx(update_mean)}
    assert s["train_time_s"] == pytest.approx(5.0 + 1.4 + 18 * 0.5)
    assert s["mean_step_s"] == pytest.approx((5.0 + 1.4 + 18 * 0.5) / 20)
    # the typical step: the median of steps 2..20, without the first step's compilation
    assert (s["first_step"], s["first_step_s"], s["median_steps"]) == (1, 5.0, [2, 20])
    assert s["median_step_s"] == 0.5 and s["stage_median_s"] == {"gen": 0.3, "update_actor": 0.1}

    d = build_summary(tmp_path, {"data": {"val_files": "v.jsonl", "max_response_length": 4}}, 20, 20, 12.0, tmp_path / "ck")
    text = format_summary(d)
    assert "first 0.15 -> last 1.95" in text and "before 0.25 (step 0) -> after 0.5 (step 20); best 0.75 at step 10" in text
    assert "step time 0.5s (median of steps 2-20; step 1, with compilation and warm-up: 5s): " in text
    assert "): gen 0.3s (75%), update_actor 0.1s (25%)" in text
    assert f"hybridrl eval --model {tmp_path / 'ck'} --data v.jsonl --max-response-length 4" in text
    assert f"hybridrl report {tmp_path}" in text and "hybridrl export" in text


def test_summary_of_a_one_step_run_has_no_warm_up_split(tmp_path):
    _write(tmp_path / "metrics.jsonl", [{"step": 1, "critic/score/mean": 0.5, "timing_s/gen": 2.0, "timing_s/step": 3.0}])
    s = summarize(load_run(tmp_path))
    assert (s["first_step"], s["median_steps"], s["median_step_s"], s["mean_step_s"]) == (1, [1, 1], 3.0, 3.0)
    text = format_summary(build_summary(tmp_path, {}, 1, 1, 4.0, None))
    assert "step time 3s (median of step 1): gen 2s (100%)" in text


def test_prompt_groups_keep_all_n_responses_and_the_verl_dump_round_trips():
    groups = prompt_groups(
        3,
        "train",
        prompts=["a", "a", "b", "b", "c", "c"],
        responses=["1", "2", "3", "4", "5", "6"],
        scores=[1, 0, 0, 0, 1, 1],
        uids=["u1", "u1", "u2", "u2", "u3", "u3"],
        ground_truths=["1", "1", "9", "9", "5", "5"],
        data_sources=["x", "x", "y", "y", "x", "x"],
        advantages=[0.7, -0.7, 0, 0, 0, 0],
        lengths=[2, 2, 1, 1, 3, 3],
        limit=2,
    )
    assert [g["uid"] for g in groups] == ["u1", "u2"]
    assert groups[0]["responses"] == ["1", "2"] and groups[0]["scores"] == [1.0, 0.0] and groups[0]["advantages"] == [0.7, -0.7]
    assert groups[1]["data_source"] == "y" and groups[1]["ground_truth"] == "9" and groups[1]["response_lengths"] == [1, 1]
    back = group_dump_rows(dump_rows(groups), "train")
    for g, h in zip(groups, back):
        assert (h["step"], h["uid"], h["prompt"], h["responses"], h["scores"], h["advantages"]) == (
            g["step"],
            g["uid"],
            g["prompt"],
            g["responses"],
            g["scores"],
            g["advantages"],
        )
    old = normalize_group({"step": 2, "prompt": "p", "response": "r", "score": 0.5})  # the older one-response lines
    assert old["responses"] == ["r"] and old["scores"] == [0.5] and old["kind"] == "train"


def test_run_reads_samples_and_the_rollout_dump_of_steps_samples_lack(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "metrics.jsonl", [{"step": 1, "critic/score/mean": 0.5}, {"step": 2, "critic/score/mean": 0.6}])
    (run / "config.yaml").write_text("trainer:\n  rollout_data_dir: dumps\n")
    g1 = prompt_groups(1, "train", prompts=["p"], responses=["r"], scores=[1.0])
    append_jsonl(run / "samples.jsonl", g1)
    (run / "dumps").mkdir()
    _write(run / "dumps" / "1.jsonl", dump_rows(g1))  # already in samples.jsonl: not twice
    _write(
        run / "dumps" / "2.jsonl", dump_rows(prompt_groups(2, "train", prompts=["q", "q"], responses=["a", "b"], scores=[0, 1]))
    )
    data = load_run(run)
    assert [(g["step"], g["prompt"], g["responses"]) for g in data.samples] == [(1, "p", ["r"]), (2, "q", ["a", "b"])]
    assert find_runs(tmp_path) == [run]


def test_prometheus_text_has_the_last_step_per_run(tmp_path):
    run = tmp_path / "a"
    run.mkdir()
    _write(
        run / "metrics.jsonl",
        [
            {
                "step": 1,
                "critic/score/mean": 0.25,
                "actor/kl_loss": 0.01,
                "perf/throughput": 100.0,
                "timing_s/gen": 0.5,
                "timing_s/step": 1.0,
            },
            {
                "step": 2,
                "critic/score/mean": 0.5,
                "actor/kl_loss": 0.02,
                "perf/throughput": 200.0,
                "timing_s/gen": 0.75,
                "timing_s/step": 1.5,
                "perf/max_memory_allocated_gb": 3.5,
                "val-core/arith/reward/mean@1": 0.625,
            },
        ],
    )
    text = prometheus_text([load_run(run)], now=(run / "metrics.jsonl").stat().st_mtime + 30)
    lines = set(text.splitlines())
    for line in (
        'hybridrl_step{run="a"} 2.0',
        'hybridrl_reward{run="a"} 0.5',
        'hybridrl_kl{run="a"} 0.02',
        'hybridrl_throughput_tokens_per_second{run="a"} 200.0',
        'hybridrl_stage_seconds{run="a",stage="gen"} 0.75',
        'hybridrl_gpu_memory_allocated_gigabytes{run="a"} 3.5',
        'hybridrl_validation_score{run="a",key="val-core/arith/reward/mean@1"} 0.625',
        'hybridrl_last_update_age_seconds{run="a"} 30.0',
        'hybridrl_run_healthy{run="a"} 1.0',
        "# TYPE hybridrl_reward gauge",
    ):
        assert line in lines, line
    stale = prometheus_text([load_run(run)], now=(run / "metrics.jsonl").stat().st_mtime + 500)
    assert 'hybridrl_run_healthy{run="a"} 0.0' in stale.splitlines()


def test_console_eta_honours_the_wall_time_budget():
    c = ConsoleLogger(total_steps=1000, start_step=0, max_wall_time_s=400.0)
    c.t0 = c.launched = 0.0
    assert c.eta(10, now=4.0) == pytest.approx(396.0)  # the budget (400 - 4) beats 0.4 s x 990 steps
    c = ConsoleLogger(total_steps=100, start_step=0)
    c.t0 = 0.0
    assert c.eta(10, now=5.0) == pytest.approx(45.0)
    assert c.eta(100, now=5.0) is None


def test_console_eta_leaves_out_the_first_steps_compilation():
    c = ConsoleLogger(total_steps=100, start_step=0)
    c.t0 = 0.0
    assert c.eta(1, now=30.0) == pytest.approx(30.0 * 99)  # one step: all there is to go on
    c.t1 = 30.0  # the first step compiled for 30 s; the next ten took 2 s each
    assert c.eta(11, now=50.0) == pytest.approx(2.0 * 89)  # not 50 / 11 s per step
    r = ConsoleLogger(total_steps=100, start_step=40)  # resumed: the first step of this process compiles
    r.t0, r.t1 = 0.0, 25.0
    assert r.eta(41, now=25.0) == pytest.approx(25.0 * 59) and r.eta(46, now=40.0) == pytest.approx(3.0 * 54)
    live = ConsoleLogger(total_steps=10, start_step=0)
    live.log({}, 0)
    assert live.t1 is None
    live.log({}, 1)
    t1 = live.t1
    live.log({}, 2)
    assert t1 is not None and live.t1 == t1  # the end of the first step, kept


def test_page_inlines_everything_and_escapes_script_closers():
    page = render_page({"runs": [], "x": "</script><b>"}, title="t")
    assert "</script><b>" not in page and "\\u003c/script\\u003e" in page
    assert "http://" not in page.split("<script>")[0] and "<script src" not in page and "<link" not in page


def test_critic_backbone_load_hides_only_the_lm_head_report(tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    from hybridrl.models.loading import load_causal_lm

    tiny = Path(__file__).resolve().parents[2] / "hybridrl" / "assets" / "tiny-arith"
    model = load_causal_lm(str(tiny), random_init=True, override_config={"tie_word_embeddings": False})
    model.save_pretrained(tmp_path / "m")
    caplog.clear()
    with caplog.at_level("WARNING", logger="transformers.modeling_utils"):
        load_causal_lm(str(tmp_path / "m"), backbone_only=True)
    assert not [r for r in caplog.records if "LOAD REPORT" in r.getMessage()]
    # a report about other keys still shows: drop a backbone weight from the checkpoint
    weights = load_file(str(tmp_path / "m" / "model.safetensors"))
    save_file(
        {k: v for k, v in weights.items() if k != "model.norm.weight"},
        str(tmp_path / "m" / "model.safetensors"),
        metadata={"format": "pt"},
    )
    with caplog.at_level("WARNING", logger="transformers.modeling_utils"):
        load_causal_lm(str(tmp_path / "m"), backbone_only=True)
    reports = [r.getMessage() for r in caplog.records if "LOAD REPORT" in r.getMessage()]
    assert len(reports) == 1 and "norm.weight" in reports[0] and "MISSING" in reports[0]


def test_thin_samples_keeps_whole_steps_evenly_spaced_with_first_and_last():
    from hybridrl.tracking.report import thin_samples

    groups = [{"step": s, "kind": "train", "uid": str(u)} for s in range(1, 101) for u in range(4)]
    groups += [{"step": s, "kind": "val", "uid": str(u)} for s in (0, 50, 100) for u in range(8)]
    kept = thin_samples(groups, max_groups=40)  # 10 steps of 4 training groups; the 24 validation ones all
    train = [g for g in kept if g["kind"] == "train"]
    assert sorted({g["step"] for g in train}) == [1, 12, 23, 34, 45, 56, 67, 78, 89, 100]
    assert len(train) == 40 and len([g for g in kept if g["kind"] == "val"]) == 24
    assert thin_samples(groups, max_groups=1000) == sorted(groups, key=lambda g: (g["step"], g["kind"] != "train"))


def test_console_eta_is_a_median_one_slow_step_barely_moves(monkeypatch):
    import hybridrl.tracking.tracker as tracker

    now = [0.0]
    monkeypatch.setattr(tracker.time, "perf_counter", lambda: now[0])
    c = ConsoleLogger(total_steps=1000, start_step=0)
    c.log({}, 0)
    now[0] = 10.0  # step 1 compiles
    c.log({}, 1)
    for step in range(2, 22):  # then 1 s per step
        now[0] += 1.0
        c.log({}, step)
    before = c.eta(21, now=now[0])
    now[0] += 300.0  # one step of 300 s (a validation, a stall)
    c.log({}, 22)
    after = c.eta(22, now=now[0])
    assert before == pytest.approx(1.0 * 979) and after == pytest.approx(1.0 * 978)  # the mean would give ~15x
