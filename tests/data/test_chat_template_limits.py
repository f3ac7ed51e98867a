"""A chat template from a model's files is code: one that loops 10^10 times, asks for gigabytes or
renders megabytes of text stops the data loading with one DataError line, in bounded time
(hybridrl/data/chat_template.py); a normal template renders as before."""

from __future__ import annotations

import json
import time

import pytest

from hybridrl.data import chat_template
from hybridrl.data.dataset import DataError, load_prompt_records, render_prompt
from hybridrl.models.tiny import build_tokenizer

BAD = {
    "loops": ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "takes more than 1 s"),
    "memory": ('{{ "x" * 10**10 }}', "needs more than 1 GiB"),
    "text": ('{{ "x" * 10**7 }}', "renders a 4-message conversation to 10,000,000 characters"),
}


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setattr(chat_template, "RENDER_S", 1.0)
    monkeypatch.setattr(chat_template, "_verdicts", {})


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_template_past_the_limits_is_one_line(tmp_path, case):
    template, why = BAD[case]
    tok = build_tokenizer()
    tok.chat_template = template
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+2="}], "data_source": "arith"}) + "\n")
    started = time.monotonic()
    with pytest.raises(DataError) as e:
        load_prompt_records(str(rows), tok, max_prompt_length=64, truncation="left", require_ground_truth=lambda s: False)
    assert time.monotonic() - started < 10
    assert why in str(e.value) and "\n" not in str(e.value) and "chat_template.jinja" in str(e.value)


def test_a_normal_template_renders_and_is_probed_once():
    tok = build_tokenizer()
    messages = [{"role": "user", "content": "1+2="}]
    want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert render_prompt(tok, messages) == want
    assert chat_template._verdicts == {tok.chat_template: None}
    started = time.monotonic()
    for _ in range(200):  # the verdict is kept: no fork per prompt
        render_prompt(tok, messages)
    assert time.monotonic() - started < 2


def test_an_error_in_the_template_is_left_to_the_real_render():
    tok = build_tokenizer()
    tok.chat_template = "{{ raise_exception('this template takes no system message') }}"
    chat_template.check_chat_template(tok)  # not the probe's to judge
    assert chat_template._verdicts[tok.chat_template] is None
