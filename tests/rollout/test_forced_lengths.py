"""Forced response lengths (rollout/lengths.py): the distribution's numbers, determinism, bad
settings, and the native and hf engines generating each response to its drawn length, EOS ignored."""

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch
from test_native_engine import TOK, engine_for, hf_model, prompts

from hybridrl.data import keys as K
from hybridrl.models.logprobs import log_probs_from_logits, response_logits
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.hf import HFRolloutEngine
from hybridrl.rollout.lengths import ForcedLengths, from_config, row_limits, uniforms

SCHEDULE = ForcedLengths(median=6.0, sigma=0.8, min_len=1, max_len=14, seed=3)  # tiny: 1..14 tokens
N = 3  # samples per prompt


def _eos_everywhere(model):
    """Every id but a few ends a response: unforced, responses stop at their first or second token."""
    eos = [i for i in range(len(TOK)) if i % 7]  # 6 of each 7 ids
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    return model, eos


def _sampling(**kw):
    kw = {"n": N, "temperature": 1.0, "max_new_tokens": 14, "forced_lengths": SCHEDULE, **kw}
    return SamplingParams(**kw)


# -- the distribution ---------------------------------------------------------------------------
def test_default_schedule_quantiles_over_many_draws():
    """lognormal(median 350, sigma 1) cut at 4096: p50 350, p90 1261, p99 3584, mean 564, 0.70% at the
    cap (worked out from the normal quantiles 1.2816 and 2.3263: 350 e^1.2816 = 1261, 350 e^2.3263 = 3584;
    P(Z > ln(4096 / 350)) = P(Z > 2.460) = 0.0070)."""
    lengths = ForcedLengths(seed=11).draw([f"e0-p{i}" for i in range(25_000)], 8)  # 200,000 draws
    assert lengths.min() >= 1 and lengths.max() == 4096
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    assert abs(p50 - 350) / 350 < 0.02
    assert abs(p90 - 1261) / 1261 < 0.03
    assert abs(p99 - 3584) / 3584 < 0.05
    assert abs((lengths == 4096).mean() - 0.0070) < 0.0012
    assert abs(lengths.mean() - 564) / 564 < 0.02


def test_quantile_function_by_hand():
    f = ForcedLengths(median=100.0, sigma=0.5, max_len=1000)
    # the median exactly; u = Phi(1) = 0.841345 -> 100 e^0.5 = 164.87 -> 165; the cap and the floor
    assert f.quantile(np.array([0.5, 0.8413447460685429, 1 - 1e-12, 1e-300])).tolist() == [100, 165, 1000, 1]
    assert ForcedLengths(sigma=0.0, median=77.0).quantile(np.array([0.01, 0.99])).tolist() == [77, 77]


def test_histogram_schedule(tmp_path):
    # half the mass in [0, 100), none in [100, 1000), half in [1000, 4000): CDF 0, 0.5, 0.5, 1; uniform
    # within a bin: u = 0.25 -> 50, 0.75 -> 1000 + 0.5 * 3000, 0.9001 -> floor(1000 + 0.8002 * 3000); the
    # empty bin is skipped (u = 0.5 -> 1000)
    f = ForcedLengths("histogram", edges=(0.0, 100.0, 1000.0, 4000.0), counts=(5.0, 0.0, 5.0), max_len=4096)
    assert f.quantile(np.array([0.25, 0.5, 0.75, 0.9001])).tolist() == [50, 1000, 2500, 3400]
    lengths = f.draw([f"u{i}" for i in range(4000)], 1)
    assert ((lengths >= 100) & (lengths < 1000)).sum() == 0
    assert abs((lengths < 100).mean() - 0.5) < 0.03
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"edges": [0, 100, 1000, 4000], "counts": [5, 0, 5]}))
    section = _section(distribution="histogram", histogram=str(path))
    assert from_config(section, 4096) == dataclasses.replace(f, seed=0)


def test_draws_are_a_function_of_seed_uid_and_sample_only():
    f = ForcedLengths(seed=5)
    a = f.draw(["e0-p3", "e0-p9", "e1-p3"], 4)
    assert a.tolist() == f.draw(["e0-p3", "e0-p9", "e1-p3"], 4).tolist()  # again: the same
    # a prompt's lengths do not depend on its neighbours or its place in the batch (DP splits, modes)
    assert f.draw(["e0-p9"], 4).tolist() == a[4:8].tolist()
    assert f.draw(["x", "e0-p3"], 4)[4:].tolist() == a[:4].tolist()
    assert len(set(a.tolist())) > 6  # samples, prompts and epochs differ
    assert ForcedLengths(seed=6).draw(["e0-p3", "e0-p9", "e1-p3"], 4).tolist() != a.tolist()


def test_uniforms_are_fixed_numbers():
    """Pinned values of the hash (blake2b, not Python's salted hash()): the same in every process, and a
    change of the hash would silently change every benchmark's workload."""
    assert uniforms(0, ["e0-p0"], 2).tolist() == pytest.approx([0.3359767287180611, 0.2311080148231032], abs=1e-15)


def _section(**kw):
    from hybridrl.config.schema import ForcedLengthsConfig

    return dataclasses.replace(ForcedLengthsConfig(), **kw)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(distribution="pareto"), "distribution='pareto' is not one of lognormal, histogram"),
        (dict(distribution="lognormal", median=0.0), "median=0.0 must be a positive number of tokens"),
        (dict(distribution="lognormal", sigma=-1.0), "sigma=-1.0 must be >= 0"),
        (dict(distribution="lognormal", min=500, max=400), "needs 1 <= min (500) <= max (400)"),
        (dict(distribution="lognormal", max=8192), "max=8192 is over data.max_response_length=4096"),
        (
            dict(distribution="histogram"),
            "distribution=histogram needs actor_rollout_ref.rollout.forced_response_lengths.histogram",
        ),
        (dict(distribution="histogram", histogram="/no/such.json"), "histogram=/no/such.json: no such file"),
        (dict(distribution="lognormal", histogram="h.json"), "histogram is set but distribution=lognormal"),
    ],
)
def test_bad_settings_say_which_key(kw, message):
    with pytest.raises(ValueError, match="actor_rollout_ref.rollout.forced_response_lengths") as e:
        from_config(_section(**kw), 4096)
    assert message in str(e.value)


def test_bad_histogram_files(tmp_path):
    bad = {"edges": [0, 10], "counts": [1, 2]}, {"edges": [5, 1, 9], "counts": [1, 1]}, {"edges": [0, 1]}
    for i, data in enumerate(bad):
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match="forced_response_lengths"):
            from_config(_section(distribution="histogram", histogram=str(path)), 4096)


def test_off_by_default_and_prompts_need_uids():
    from hybridrl.config.schema import ForcedLengthsConfig

    assert from_config(ForcedLengthsConfig(), 512) is None
    assert row_limits(SamplingParams(), prompts()) is None
    with pytest.raises(ValueError, match="over this generation's max_new_tokens=10"):
        row_limits(_sampling(max_new_tokens=10), prompts())
    no_uids = prompts()
    no_uids.non_tensors.pop(K.UID)
    with pytest.raises(ValueError, match="the prompts need their uids"):
        row_limits(_sampling(), no_uids)


# -- the engines ----------------------------------------------------------------------------------
def _check_forced(out, batch, model, temperature):
    """Every row has exactly its drawn length, EOS ids inside it; log-probs are the model's."""
    want = SCHEDULE.draw(list(batch[K.UID]), N)
    mask = out[K.RESPONSE_MASK]
    assert mask.sum(1).long().tolist() == want.tolist()
    assert out[K.RESPONSES].shape[1] == want.max()
    eos = set(model.config.eos_token_id)
    inside = [t for row, m in zip(out[K.RESPONSES].tolist(), mask.bool().tolist()) for t, on in zip(row[:-1], m[:-1]) if on]
    assert sum(t in eos for t in inside) > len(inside) // 2  # most tokens are EOS ids, and none ended a row
    with torch.no_grad():
        logits = response_logits(model.eval(), out[K.PROMPTS], out[K.PROMPT_MASK], out[K.RESPONSES], mask, temperature)
        lp = log_probs_from_logits(logits, out[K.RESPONSES]) * mask
    torch.testing.assert_close(out[K.ROLLOUT_LOG_PROBS], lp, atol=1e-4, rtol=1e-4)
    assert (out[K.ROLLOUT_LOG_PROBS][mask.bool()] < 0).all() and (out[K.ROLLOUT_LOG_PROBS][~mask.bool()] == 0).all()


@pytest.mark.parametrize("steps_per_sync", [1, 3])
def test_native_engine_generates_each_row_to_its_length(steps_per_sync):
    model, _ = _eos_everywhere(hf_model("qwen2", seed=0))
    engine = engine_for(copy.deepcopy(model), decode_steps_per_sync=steps_per_sync)
    batch = prompts()
    unforced = engine.generate(batch, _sampling(forced_lengths=None), seeds=list(range(len(batch) * N)))
    assert unforced[K.RESPONSE_MASK].sum(1).float().mean() < 2  # the EOS set ends them at once
    out = engine.generate(batch, _sampling(), seeds=list(range(len(batch) * N)))
    _check_forced(out, batch, model, 1.0)
    # the seeds' tokens: the forced run's first token of each row is the unforced run's
    assert torch.equal(out[K.RESPONSES][:, 0], unforced[K.RESPONSES][:, 0])


def test_hf_engine_generates_each_row_to_its_length():
    model, _ = _eos_everywhere(hf_model("qwen2", seed=0))
    engine = HFRolloutEngine(model, TOK, max_num_seqs=4)  # several chunks of different longest rows
    batch = prompts()
    torch.manual_seed(0)
    assert engine.generate(batch, _sampling(forced_lengths=None))[K.RESPONSE_MASK].sum(1).float().mean() < 2
    out = engine.generate(batch, _sampling())
    _check_forced(out, batch, model, 1.0)
    assert (out[K.RESPONSES][~out[K.RESPONSE_MASK].bool()] == TOK.pad_token_id).all()


def test_native_and_hf_agree_greedily_under_forced_lengths():
    model, _ = _eos_everywhere(hf_model("qwen2", seed=0))
    greedy = _sampling(do_sample=False, temperature=0.0)
    batch = prompts()
    native = engine_for(copy.deepcopy(model)).generate(batch, greedy)
    hf = HFRolloutEngine(model, TOK).generate(batch, greedy)
    assert torch.equal(native[K.RESPONSE_MASK], hf[K.RESPONSE_MASK])
    assert torch.equal(native[K.RESPONSES], hf[K.RESPONSES])
    torch.testing.assert_close(native[K.ROLLOUT_LOG_PROBS], hf[K.ROLLOUT_LOG_PROBS], atol=1e-4, rtol=1e-4)


# -- a real run's lengths as the schedule (benchmarks/length_histogram.py) --------------------------
def _histogram_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "length_histogram.py"
    spec = importlib.util.spec_from_file_location("length_histogram", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_runs_lengths_become_a_histogram_schedule_that_reproduces_them(tmp_path):
    """Lengths of a lognormal cut at 1024 (2.3% there), written as `hybridrl eval --output` rows and as
    samples.jsonl groups -> histogram JSON -> `distribution=histogram` draws with the same quantiles
    and the same share at the cap."""
    source = ForcedLengths(median=200.0, sigma=0.8, max_len=1024, seed=9).draw([f"p{i}" for i in range(3000)], 4)
    eval_rows = tmp_path / "eval.jsonl"
    eval_rows.write_text("".join(json.dumps({"index": i, "response_length": int(x)}) + "\n" for i, x in enumerate(source[:6000])))
    groups = tmp_path / "samples.jsonl"
    groups.write_text("".join(json.dumps({"response_lengths": source[i : i + 4].tolist()}) + "\n" for i in range(6000, 12000, 4)))
    script, out = _histogram_script(), tmp_path / "lengths.json"
    script.main([str(eval_rows), str(groups), "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["stats"]["n"] == 12000 and written["edges"][-2:] == [1024, 1025]  # the cap: a bin of its own
    assert written["counts"][-1] == int((source == 1024).sum())
    assert abs(written["stats"]["lognormal_sigma"] - 0.8) < 0.05  # the fit sees the (slightly cut) tail
    forced = from_config(_section(distribution="histogram", histogram=str(out), seed=1), 1024)
    redrawn = forced.draw([f"q{i}" for i in range(5000)], 4)
    for q in (25, 50, 90, 99):
        want, got = np.percentile(source, q), np.percentile(redrawn, q)
        assert abs(got - want) / want < 0.08, (q, want, got)
    assert abs((redrawn == 1024).mean() - (source == 1024).mean()) < 0.006


def test_histogram_script_refuses_files_without_lengths(tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text(json.dumps({"response": "42"}) + "\n")
    with pytest.raises(SystemExit, match="line 1: no response_length"):
        _histogram_script().main([str(bad), "--out", str(tmp_path / "h.json")])
