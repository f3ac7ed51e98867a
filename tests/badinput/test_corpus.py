"""The bad-input corpus: every case is a user error that must end in ONE line on stderr,
`hybridrl: error: ...` naming the key / file / row, exit status 2, no traceback, and nothing
lost from an existing run directory.

The cases run in-process (`hybridrl.cli.main.main(argv)`), so the whole table takes seconds;
`test_real_entry_point` runs a few of them through `python -m hybridrl` to prove the real
entry point prints no traceback either. Most cases stop while the config or the data loads;
a few go as far as building the tiny model (the warm-up and missing-weights cases).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hybridrl.cli.main import main

sys.path.insert(0, str(Path(__file__).parent))
from badinput_common import BASE_YAML, GOOD, assert_one_line_error, good_then, jsonl, run_in_process  # noqa: E402


def row(**changes) -> dict:
    r = json.loads(json.dumps(GOOD))
    for k, v in changes.items():
        if v is _DROP:
            r.pop(k)
        else:
            r[k] = v
    return r


def msg(role="user", content="1+2=", **extra) -> dict:
    return {"role": role, "content": content, **extra}


_DROP = object()
PAIR = {"prompt": "1+2=", "chosen": "3", "rejected": "4"}
KTO = {"prompt": "1+2=", "completion": "3", "label": True}
SFT = {"prompt": "1+2=", "response": "3"}


@dataclass
class Case:
    id: str
    cmd: str  # "explain" / "train" (base config + over), or "raw" (argv given in `over`)
    over: tuple = ()
    expect: tuple = ()  # fragments of the one error line, formatted like `over`
    files: dict = field(default_factory=dict)  # name -> str | bytes | None (a directory) | callable(path)
    yaml: str | bytes | None = None  # replaces the base config
    slow: bool = False  # builds the tiny model before failing


def parquet(rows):
    return lambda p: pq.write_table(pa.Table.from_pylist(rows), p)


def cut_parquet(p):
    pq.write_table(pa.Table.from_pylist([GOOD] * 8), p)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


NONFINITE_KEYS = (
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.clip_ratio",
    "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.grad_clip",
    "actor_rollout_ref.rollout.temperature",
    "actor_rollout_ref.rollout.top_p",
    "algorithm.gamma",
    "algorithm.lam",
    "algorithm.kl_ctrl.kl_coef",
    "critic.optim.lr",
    "warmup.lr",
)

# fmt: off
CASES = [
    # ---- the config file itself
    Case("cfg_missing", "raw", ("explain", "{d}/nope.yaml"), ("cannot read config file", "nope.yaml", "check the path")),
    Case("cfg_is_dir", "raw", ("explain", "{d}"), ("cannot read config file",)),
    Case("yaml_unclosed", "explain", yaml="data: [1, 2\ntrainer: {}\n", expect=("not valid YAML", "c.yaml:")),
    Case("yaml_tab", "explain", yaml="data:\n\ttrain_batch_size: 4\n", expect=("not valid YAML", "c.yaml:2")),
    Case("yaml_list", "explain", yaml="- data\n- trainer\n", expect=("must hold a mapping of sections",)),
    Case("yaml_scalar", "explain", yaml="hello\n", expect=("must hold a mapping of sections",)),
    Case("yaml_dup_section", "explain",
         yaml="data:\n  train_batch_size: 4\ntrainer:\n  device: cpu\ndata:\n  max_prompt_length: 8\n",
         expect=("c.yaml:5", "key 'data' appears twice (lines 1 and 5)", "merge them")),
    Case("yaml_dup_key", "explain", yaml="trainer:\n  device: cpu\n  device: cuda\n",
         expect=("c.yaml:3", "key 'device' appears twice")),
    Case("yaml_dup_deep", "explain", yaml="actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1\n      lr: 2\n",
         expect=("key 'lr' appears twice (lines 4 and 5)",)),
    Case("yaml_latin1", "explain", yaml=b"trainer:\n  experiment_name: caf\xe9\n", expect=("c.yaml:2", "not valid UTF-8",
         "0xe9")),
    Case("yaml_utf16", "explain", yaml="data: {}\n".encode("utf-16"), expect=("c.yaml:1", "not valid UTF-8")),
    Case("yaml_binary", "explain", yaml=b"\x89PNG\r\n\x1a\n\x00\x00", expect=("not valid UTF-8",)),
    Case("yaml_nul", "explain", yaml="data:\x00 1\n", expect=("not valid YAML",)),
    Case("yaml_alias", "explain", yaml="data: *nope\n", expect=("not valid YAML", "nope")),
    # a "billion laughs": 9 levels of 9 aliases, 500 bytes on disk, 9^9 values once walked (the load hung)
    Case("yaml_alias_bomb", "explain", yaml="a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
         + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)) + "data:\n  train_files: *a8\n",
         expect=("c.yaml:1", "not valid YAML", "expand to more than 100,000 values", "alias bomb")),
    Case("yaml_alias_cycle", "explain", yaml="data: &d\n  train_files: *d\n", expect=("not valid YAML", "alias bomb")),
    Case("yaml_python_tag", "explain", yaml="data: !!python/object/apply:os.system ['touch {d}/pwned']\n",
         expect=("not valid YAML",)),
    Case("yaml_section_scalar", "explain", yaml="data: 5\n", expect=("data: expected a section",)),
    Case("yaml_unknown_section", "explain", yaml="datta:\n  train_batch_size: 4\n",
         expect=("unknown key 'datta.train_batch_size'", "'data.train_batch_size'")),
    Case("yaml_empty", "explain", yaml="", expect=("actor_rollout_ref.model.path is empty",)),
    Case("yaml_comment_only", "explain", yaml="# nothing\n", expect=("data.train_files",)),
    # ---- overrides
    Case("ov_no_equals", "explain", ("data.train_batch_size",), ("'data.train_batch_size' is not of the form key=value",)),
    Case("ov_double_equals", "explain", ("trainer.experiment_name==x",), ("has '=='", "trainer.experiment_name=x")),
    Case("ov_double_equals_int", "explain", ("data.train_batch_size==8",), ("has '=='", "data.train_batch_size=8")),
    Case("ov_empty_key", "explain", ("=5",), ("not of the form key=value",)),
    Case("ov_typo", "explain", ("data.train_batch_sise=4",), ("unknown key 'data.train_batch_sise'", "'data.train_batch_size'")),
    Case("ov_misplaced", "explain", ("actor_rollout_ref.actor.lr=1e-6",), ("actor_rollout_ref.actor.optim.lr",)),
    Case("ov_unknown_top", "explain", ("foo=1",), ("unknown key 'foo'",)),
    Case("ov_bad_yaml_value", "explain", ("data.train_files=[a",), ("cannot parse the value",)),
    Case("ov_through_leaf", "explain", ("data.train_batch_size.x=1",), ("data.train_batch_size holds a value",)),
    Case("ov_section_scalar", "explain", ("data=5",), ("data: expected a section",)),
    Case("ov_int_str", "explain", ("data.train_batch_size=abc",), ("data.train_batch_size: expected int", "'abc'")),
    Case("ov_int_float", "explain", ("data.train_batch_size=4.5",), ("data.train_batch_size: expected int",)),
    Case("ov_int_bool", "explain", ("data.train_batch_size=true",), ("data.train_batch_size: expected int",)),
    Case("ov_bool_str", "explain", ("data.shuffle=maybe",), ("data.shuffle: expected bool",)),
    Case("ov_float_str", "explain", ("actor_rollout_ref.actor.optim.lr=fast",),
         ("actor_rollout_ref.actor.optim.lr: expected float",)),
    Case("ov_list_dict", "explain", ("trainer.logger={{a: 1}}",), ("trainer.logger: expected",)),
    Case("ov_dict_list", "explain", ("custom_reward_function.reward_kwargs=[1]",),
         ("custom_reward_function.reward_kwargs: expected",)),
    Case("ov_int_list", "explain", ("actor_rollout_ref.rollout.n=[2]",), ("actor_rollout_ref.rollout.n: expected int",)),
    *[Case(f"nonfinite_{k.replace('actor_rollout_ref.', '').replace('.', '_')}_{name}", "explain", (f"{k}={v}",), (k,
         "must be a finite number"))
      for k in NONFINITE_KEYS for name, v in (("inf", ".inf"), ("neginf", "-.inf"), ("nan", ".nan"))],
    Case("nonfinite_in_yaml", "explain", yaml=BASE_YAML.replace("lr: 1.0e-3", "lr: .inf"),
         expect=("actor_rollout_ref.actor.optim.lr", "finite")),
    # ---- values out of range, unknown choices, rules between keys
    Case("range_batch_zero", "explain", ("data.train_batch_size=0",), ("data.train_batch_size",)),
    Case("range_batch_negative", "explain", ("data.train_batch_size=-4",), ("data.train_batch_size",)),
    Case("range_n_zero", "explain", ("actor_rollout_ref.rollout.n=0",), ("actor_rollout_ref.rollout.n",)),
    Case("range_prompt_len_zero", "explain", ("data.max_prompt_length=0",), ("data.max_prompt_length",)),
    Case("range_clip_negative", "explain", ("actor_rollout_ref.actor.clip_ratio=-0.1",), ("actor_rollout_ref.actor.clip_ratio",)),
    Case("range_temperature_negative", "explain", ("actor_rollout_ref.rollout.temperature=-1",), ("rollout.temperature",)),
    Case("range_top_p_above_1", "explain", ("actor_rollout_ref.rollout.top_p=1.5",), ("actor_rollout_ref.rollout.top_p",)),
    Case("range_lr_negative", "explain", ("actor_rollout_ref.actor.optim.lr=-1e-3",), ("actor_rollout_ref.actor.optim.lr",)),
    Case("range_warmup_steps_negative", "explain", ("warmup.steps=-1",), ("warmup.steps",)),
    Case("choice_estimator", "explain", ("algorithm.adv_estimator=foo",), ("algorithm.adv_estimator",)),
    Case("choice_truncation", "explain", ("data.truncation=center",), ("data.truncation",)),
    Case("choice_resume_mode", "explain", ("trainer.resume_mode=sometimes",), ("trainer.resume_mode",)),
    Case("choice_device", "explain", ("trainer.device=tpu",), ("trainer.device",)),
    Case("choice_logger", "explain", ("trainer.logger=[console,foo]",), ("trainer.logger",)),
    Case("choice_rollout", "explain", ("actor_rollout_ref.rollout.name=sglang",), ("actor_rollout_ref.rollout.name",)),
    Case("choice_algorithm", "explain", ("algorithm.name=ppo2",), ("algorithm.name",)),
    Case("choice_kl_loss_type", "explain", ("actor_rollout_ref.actor.kl_loss_type=xx",), ("kl_loss_type",)),
    Case("choice_loss_agg", "explain", ("actor_rollout_ref.actor.loss_agg_mode=mean",), ("loss_agg_mode",)),
    Case("rule_mini_batch", "explain", ("actor_rollout_ref.actor.ppo_mini_batch_size=3",), ("ppo_mini_batch_size",)),
    # GRPO with n=1 runs as verl's does (a notice); RLOO's leave-one-out needs n > 1
    Case("rule_rloo_n1", "explain", ("algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=1"), ("rollout.n",)),
    Case("rule_resume_path", "explain", ("trainer.resume_mode=resume_path",), ("trainer.resume_from_path",)),
    Case("rule_warmup_no_files", "explain", ("warmup.steps=5",), ("warmup.files",)),
    Case("rule_model_empty", "explain", ("actor_rollout_ref.model.path=",), ("actor_rollout_ref.model.path",)),
    # ---- paths, checked before anything loads
    Case("model_missing", "explain", ("actor_rollout_ref.model.path={d}/nomodel",),
         ("actor_rollout_ref.model.path=", "nomodel", "does not exist", "--local-dir")),
    Case("model_hub_id", "explain", ("actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",),
         ("'Qwen/Qwen2.5-0.5B-Instruct' does not exist",)),
    Case("model_is_file", "explain", ("actor_rollout_ref.model.path={train}",), ("actor_rollout_ref.model.path=", "is a file")),
    Case("model_empty_dir", "explain", ("actor_rollout_ref.model.path={d}/m",), ("has no config.json (it is empty)",),
         files={"m": None}),
    Case("model_no_config", "explain", ("actor_rollout_ref.model.path={d}/m",), ("has no config.json",),
         files={"m/README.md": "weights elsewhere"}),
    Case("tokenizer_missing", "explain", ("actor_rollout_ref.model.tokenizer_path={d}/tok",),
         ("actor_rollout_ref.model.tokenizer_path=", "does not exist")),
    Case("critic_model_missing", "explain", ("algorithm.adv_estimator=gae", "critic.model.path={d}/critic"),
         ("critic.model.path=", "does not exist")),
    Case("train_missing", "explain", ("data.train_files={d}/train.jsonl",), ("data.train_files:", "train.jsonl",
         "does not exist")),
    Case("train_is_dir", "explain", ("data.train_files={d}/x.jsonl",), ("data.train_files:", "is a directory"),
         files={"x.jsonl": None}),
    Case("train_csv", "explain", ("data.train_files={d}/t.csv",), ("data.train_files:", "'.csv'", ".jsonl or .parquet"),
         files={"t.csv": "prompt,answer\n1+2=,3\n"}),
    Case("train_json", "explain", ("data.train_files={d}/t.json",), ("'.json'",), files={"t.json": "[]"}),
    Case("train_txt", "explain", ("data.train_files={d}/t.txt",), ("'.txt'",), files={"t.txt": "1+2="}),
    Case("train_no_suffix", "explain", ("data.train_files={d}/train",), ("'(none)'",), files={"train": "x"}),
    Case("train_empty_jsonl", "explain", ("data.train_files={d}/e.jsonl",), ("e.jsonl", "is empty (0 bytes)"),
         files={"e.jsonl": ""}),
    Case("train_empty_parquet", "explain", ("data.train_files={d}/e.parquet",), ("e.parquet", "is empty"),
         files={"e.parquet": b""}),
    Case("train_list_one_missing", "explain", ("data.train_files=[{train},{d}/more.jsonl]",), ("more.jsonl", "does not exist")),
    Case("val_missing", "explain", ("data.val_files={d}/val.jsonl",), ("data.val_files:", "val.jsonl")),
    Case("val_csv", "explain", ("data.val_files={d}/v.csv",), ("data.val_files:", "'.csv'"), files={"v.csv": "a\n"}),
    Case("warmup_missing", "explain", ("warmup.steps=2", "warmup.files={d}/sft.jsonl"), ("warmup.files:", "does not exist")),
    Case("warmup_empty", "explain", ("warmup.steps=2", "warmup.files={d}/sft.jsonl"), ("warmup.files:", "is empty"),
         files={"sft.jsonl": ""}),
    Case("warmup_csv", "explain", ("warmup.steps=2", "warmup.files={d}/sft.csv"), ("warmup.files:", "'.csv'"),
         files={"sft.csv": "a"}),
    Case("reward_missing", "explain", ("custom_reward_function.path={d}/reward.py",),
         ("custom_reward_function.path=", "does not exist")),
    Case("reward_is_dir", "explain", ("custom_reward_function.path={d}/r",), ("custom_reward_function.path=",),
         files={"r": None}),
    Case("reward_syntax", "explain", ("custom_reward_function.path={d}/reward.py",),
         ("custom_reward_function.path=", "line 2", "SyntaxError", "fix the file"),
         files={"reward.py": "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return (\n"}),
    Case("reward_indent", "explain", ("custom_reward_function.path={d}/reward.py",), ("IndentationError",),
         files={"reward.py": "def compute_score(a, b, c, d):\nreturn 1.0\n"}),
    Case("reward_nul", "explain", ("custom_reward_function.path={d}/reward.py",), ("custom_reward_function.path=",),
         files={"reward.py": b"x = 1\x00\n"}),
    Case("resume_path_missing", "explain", ("trainer.resume_mode=resume_path", "trainer.resume_from_path={d}/ckpt"),
         ("trainer.resume_from_path=", "does not exist")),
    Case("run_dir_under_file", "explain", ("trainer.default_local_dir={train}/run",), ("trainer.default_local_dir:",
         "is a file")),
    Case("run_dir_not_writable", "explain", ("trainer.default_local_dir=/proc/hybridrl_run",),
         ("trainer.default_local_dir:", "cannot write in", "writable directory")),
    Case("device_cuda", "explain", ("trainer.device=cuda",), ("trainer.device=cuda", "trainer.device=cpu")),
    Case("several_problems", "explain", ("data.train_files={d}/a.jsonl", "actor_rollout_ref.model.path={d}/m2"),
         ("2 problems in", "(1)", "(2)", "a.jsonl", "m2")),
    # ---- the same checks stop `train` before any model work
    Case("train_model_missing", "train", ("actor_rollout_ref.model.path={d}/nomodel",), ("nomodel", "does not exist")),
    Case("train_model_hub_id", "train", ("actor_rollout_ref.model.path=meta-llama/Llama-3.2-1B",), ("does not exist",)),
    Case("train_data_csv", "train", ("data.train_files={d}/t.csv",), ("'.csv'",), files={"t.csv": "a,b\n"}),
    Case("train_lr_inf", "train", ("actor_rollout_ref.actor.optim.lr=.inf",), ("actor_rollout_ref.actor.optim.lr", "finite")),
    Case("train_device_cuda", "train", ("trainer.device=cuda",), ("trainer.device=cuda",)),
    Case("train_double_equals", "train", ("trainer.total_training_steps==3",), ("has '=='",)),
    Case("train_dup_yaml", "train", yaml=BASE_YAML + "trainer:\n  seed: 3\n", expect=("key 'trainer' appears twice",)),
    # ---- prompt data files: read and checked before any model work
    Case("jsonl_latin1", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl:7", "not valid UTF-8", "0xe9", "UTF-8"),
         files={"t.jsonl": good_then().encode() + b'{"data_source": "caf\xe9"}\n'}),
    Case("jsonl_lone_surrogate", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl, row 6", "lone UTF-16 surrogate"),
         files={"t.jsonl": good_then({**GOOD, "prompt": "1+\ud800="})}),
    Case("jsonl_deep", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl:7", "nested too deep"),
         files={"t.jsonl": good_then("[" * 100_000 + "]" * 100_000)}),
    Case("jsonl_huge_int", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl:7", "digits", "as a string"),
         files={"t.jsonl": good_then('{"prompt": "1+2=", "data_source": "arith", "reward_model": {"ground_truth": 1'
                                     + "0" * 5000 + "}}")}),
    Case("ground_truth_nan", "train", ("data.train_files={d}/t.jsonl",),
         ("row 6: reward_model.ground_truth holds nan", "finite number or a string"),
         files={"t.jsonl": good_then(row(reward_model={"ground_truth": float("nan")}))}),
    Case("ground_truth_inf_in_list", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "ground_truth holds inf"),
         files={"t.jsonl": good_then(row(reward_model={"ground_truth": ["3", float("inf")]}))}),
    Case("ground_truth_lone_surrogate", "train", ("data.train_files={d}/t.jsonl",),
         ("row 6: reward_model.ground_truth", "lone UTF-16 surrogate"),
         files={"t.jsonl": good_then(row(reward_model={"ground_truth": "3\ud800"}))}),
    Case("data_fifo", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl", "not a regular file"),
         files={"t.jsonl": lambda p: os.mkfifo(p)}),
    Case("experiment_name_300", "explain", ("trainer.experiment_name=" + "x" * 300,),
         ("trainer.experiment_name is 300 bytes long", "at most 255")),
    Case("experiment_name_newline", "explain", ('trainer.experiment_name="a\\nb"',),
         ("trainer.experiment_name='a\\nb' holds a control character",)),
    Case("project_name_tab", "explain", ('trainer.project_name="p\\tq"',), ("trainer.project_name", "control character")),
    Case("jsonl_unknown_source", "train", ("data.train_files={d}/t.jsonl",), ("'mystery' (1 row(s)", "no built-in reward"),
         files={"t.jsonl": good_then({**GOOD, "data_source": "mystery"})}),
    Case("jsonl_utf16", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl:1", "not valid UTF-8"),
         files={"t.jsonl": good_then().encode("utf-16")}),
    Case("jsonl_truncated", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl:7", "last line is cut off", "truncated"),
         files={"t.jsonl": good_then() + json.dumps(GOOD)[:30]}),
    Case("jsonl_bad_line", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl:3", "invalid JSON", "one JSON object"),
         files={"t.jsonl": jsonl(GOOD, GOOD, "{data_source: arith}", GOOD)}),
    Case("jsonl_trailing_comma", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl:7", "invalid JSON"),
         files={"t.jsonl": good_then('{"prompt": "1+2=",}')}),
    Case("jsonl_pretty_printed", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl:1", "invalid JSON"),
         files={"t.jsonl": json.dumps(GOOD, indent=2) + "\n"}),
    Case("jsonl_array_line", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl, row 0", "a row must be a mapping"),
         files={"t.jsonl": jsonl([GOOD, GOOD])}),
    Case("row_number", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl, row 6", "a row must be a mapping"),
         files={"t.jsonl": good_then("42")}),
    Case("row_string", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "a row must be a mapping"),
         files={"t.jsonl": good_then('"1+2="')}),
    Case("blank_lines_only", "train", ("data.train_files={d}/t.jsonl",), ("t.jsonl", "no rows"), files={"t.jsonl": "\n\n  \n"}),
    Case("prompt_missing", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "missing the prompt field 'prompt'"),
         files={"t.jsonl": good_then(row(prompt=_DROP))}),
    Case("prompt_null", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "missing the prompt field"),
         files={"t.jsonl": good_then(row(prompt=None))}),
    Case("prompt_int", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "string or a non-empty list"),
         files={"t.jsonl": good_then(row(prompt=3))}),
    Case("prompt_empty_string", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "empty string"),
         files={"t.jsonl": good_then(row(prompt=""))}),
    Case("prompt_blank_string", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "empty string"),
         files={"t.jsonl": good_then(row(prompt="   "))}),
    Case("prompt_empty_list", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "non-empty list"),
         files={"t.jsonl": good_then(row(prompt=[]))}),
    Case("prompt_dict", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "non-empty list"),
         files={"t.jsonl": good_then(row(prompt=msg()))}),
    Case("message_string", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "message 0 must be a dict"),
         files={"t.jsonl": good_then(row(prompt=["1+2="]))}),
    Case("message_no_role", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'role' and 'content'"),
         files={"t.jsonl": good_then(row(prompt=[{"content": "1+2="}]))}),
    Case("message_no_content", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'role' and 'content'"),
         files={"t.jsonl": good_then(row(prompt=[{"role": "user"}]))}),
    Case("message_content_int", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'content' must be a string"),
         files={"t.jsonl": good_then(row(prompt=[msg(content=3)]))}),
    Case("message_content_null", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'content' must be a string"),
         files={"t.jsonl": good_then(row(prompt=[msg(content=None)]))}),
    Case("message_content_list", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'content' must be a string"),
         files={"t.jsonl": good_then(row(prompt=[msg(content=[{"type": "text", "text": "1+2="}])]))}),
    Case("message_role_human", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "role 'human'", "system, user, assistant"),
         files={"t.jsonl": good_then(row(prompt=[msg(role="human")]))}),
    Case("message_role_capital", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "role 'User'"),
         files={"t.jsonl": good_then(row(prompt=[msg(role="User")]))}),
    Case("message_role_int", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "role 1"),
         files={"t.jsonl": good_then(row(prompt=[msg(role=1)]))}),
    Case("message_empty_content", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "message 1 (user) has empty content"),
         files={"t.jsonl": good_then(row(prompt=[msg(role="system", content="add"), msg(content="")]))}),
    Case("message_blank_content", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "empty content"),
         files={"t.jsonl": good_then(row(prompt=[msg(content=" \n")]))}),
    Case("source_missing", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "missing 'data_source'", "data.reward_fn_key"),
         files={"t.jsonl": good_then(row(data_source=_DROP))}),
    Case("source_null", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "missing 'data_source'"),
         files={"t.jsonl": good_then(row(data_source=None))}),
    Case("source_empty", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'data_source'", "non-empty string"),
         files={"t.jsonl": good_then(row(data_source=""))}),
    Case("source_list", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'data_source'", "non-empty string"),
         files={"t.jsonl": good_then(row(data_source=["arith"]))}),
    Case("source_bool", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'data_source'", "got True"),
         files={"t.jsonl": good_then(row(data_source=True))}),
    Case("extra_info_list", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'extra_info' must be a mapping", "list"),
         files={"t.jsonl": good_then(row(extra_info=[1, 2]))}),
    Case("extra_info_string", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'extra_info' must be a mapping", "str"),
         files={"t.jsonl": good_then(row(extra_info="train"))}),
    Case("extra_info_number", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "'extra_info'"),
         files={"t.jsonl": good_then(row(extra_info=7))}),
    Case("ground_truth_missing", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "reward_model.ground_truth"),
         files={"t.jsonl": good_then(row(reward_model={"style": "rule"}))}),
    Case("reward_model_missing", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "reward_model.ground_truth"),
         files={"t.jsonl": good_then(row(reward_model=_DROP))}),
    Case("reward_model_string", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "reward_model.ground_truth"),
         files={"t.jsonl": good_then(row(reward_model="3"))}),
    Case("prompt_too_long", "train", ("data.train_files={d}/t.jsonl",), ("row 6", "tokens > data.max_prompt_length=8",
         "data.truncation"),
         files={"t.jsonl": good_then(row(prompt=[msg(content="12345+67890=")]))}),
    Case("prompt_key_wrong", "train", ("data.prompt_key=question",), ("row 0", "missing the prompt field 'question'")),
    Case("reward_fn_key_wrong", "train", ("data.reward_fn_key=source",), ("row 0", "missing 'source'")),
    Case("batch_larger_than_data", "train", ("data.train_files={d}/t.jsonl",), ("data.train_batch_size=4", "use at most 3"),
         files={"t.jsonl": jsonl(GOOD, GOOD, GOOD)}),
    Case("val_bad_row", "train", ("data.val_files={d}/v.jsonl",), ("v.jsonl, row 1", "missing the prompt field"),
         files={"v.jsonl": jsonl(GOOD, row(prompt=_DROP))}),
    Case("val_truncated", "train", ("data.val_files={d}/v.jsonl",), ("v.jsonl:2", "cut off"),
         files={"v.jsonl": jsonl(GOOD) + '{"data_source": "ar'}),
    Case("parquet_garbage", "train", ("data.train_files={d}/t.parquet",), ("t.parquet", "not a readable parquet file"),
         files={"t.parquet": os.urandom(256)}),
    Case("parquet_is_jsonl", "train", ("data.train_files={d}/t.parquet",), ("t.parquet", "not a readable parquet file"),
         files={"t.parquet": good_then()}),
    Case("parquet_cut", "train", ("data.train_files={d}/t.parquet",), ("t.parquet", "not a readable parquet file"),
         files={"t.parquet": cut_parquet}),
    Case("parquet_wrong_columns", "train", ("data.train_files={d}/t.parquet",), ("t.parquet, row 0", "missing the prompt field"),
         files={"t.parquet": parquet([{"question": "1+2=", "answer": "3"}] * 6)}),
    Case("parquet_bad_row", "train", ("data.train_files={d}/t.parquet",), ("t.parquet, row 6", "missing 'data_source'"),
         files={"t.parquet": parquet([GOOD] * 6 + [row(data_source=None)])}),
    Case("parquet_no_rows", "train", ("data.train_files={d}/t.parquet",), ("t.parquet", "no rows"),
         files={"t.parquet": lambda p: pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), p)}),
    # ---- preference / SFT rows
    Case("dpo_missing_rejected", "train", ("algorithm.name=dpo", "data.val_files=null", "data.train_files={d}/p.jsonl"),
         ("p.jsonl, row 4", "missing 'rejected'"), files={"p.jsonl": jsonl(*[PAIR] * 4, {"prompt": "1+2=", "chosen": "3"})}),
    Case("dpo_chosen_empty", "train", ("algorithm.name=dpo", "data.val_files=null", "data.train_files={d}/p.jsonl"),
         ("row 4", "'chosen' is an empty string"), files={"p.jsonl": jsonl(*[PAIR] * 4, {**PAIR, "chosen": ""})}),
    Case("dpo_chosen_int", "train", ("algorithm.name=dpo", "data.val_files=null", "data.train_files={d}/p.jsonl"),
         ("row 4", "'chosen' must be a string"), files={"p.jsonl": jsonl(*[PAIR] * 4, {**PAIR, "chosen": 3})}),
    Case("dpo_messages_vs_text", "train", ("algorithm.name=dpo", "data.val_files=null", "data.train_files={d}/p.jsonl"),
         ("row 4", "plain text"), files={"p.jsonl": jsonl(*[PAIR] * 4, {**PAIR, "chosen": [msg("assistant", "3")]})}),
    Case("dpo_prompt_role", "train", ("algorithm.name=dpo", "data.val_files=null", "data.train_files={d}/p.jsonl"),
         ("row 4", "role 'gpt'"), files={"p.jsonl": jsonl(*[PAIR] * 4, {**PAIR, "prompt": [msg("gpt", "1+2=")]})}),
    Case("kto_label_string", "train", ("algorithm.name=kto", "data.val_files=null", "data.train_files={d}/k.jsonl"),
         ("row 4", "'label' must be true"), files={"k.jsonl": jsonl(*[KTO] * 4, {**KTO, "label": "yes"})}),
    Case("kto_label_missing", "train", ("algorithm.name=kto", "data.val_files=null", "data.train_files={d}/k.jsonl"),
         ("row 4", "missing 'label'"), files={"k.jsonl": jsonl(*[KTO] * 4, {"prompt": "1+2=", "completion": "3"})}),
    Case("sft_messages_string", "train", ("algorithm.name=sft", "data.val_files=null", "data.train_files={d}/s.jsonl"),
         ("row 4", "'messages' must be a list of chat messages", "'prompt' and 'response'"),
         files={"s.jsonl": jsonl(*[SFT] * 4, {"messages": "user: 1+2= assistant: 3"})}),
    Case("sft_messages_end_user", "train", ("algorithm.name=sft", "data.val_files=null", "data.train_files={d}/s.jsonl"),
         ("row 4", "must end with an assistant message"), files={"s.jsonl": jsonl(*[SFT] * 4, {"messages": [msg(), msg()]})}),
    Case("sft_messages_single", "train", ("algorithm.name=sft", "data.val_files=null", "data.train_files={d}/s.jsonl"),
         ("row 4", "must end with an assistant message"), files={"s.jsonl": jsonl(*[SFT] * 4, {"messages": [msg("assistant",
              "3")]})}),
    Case("sft_messages_empty_answer", "train", ("algorithm.name=sft", "data.val_files=null", "data.train_files={d}/s.jsonl"),
         ("row 4", "(assistant) has empty content"),
         files={"s.jsonl": jsonl(*[SFT] * 4, {"messages": [msg(), msg("assistant", "")]})}),
    Case("sft_missing_response", "train", ("algorithm.name=sft", "data.val_files=null", "data.train_files={d}/s.jsonl"),
         ("row 4", "missing 'response'"), files={"s.jsonl": jsonl(*[SFT] * 4, {"prompt": "1+2="})}),
    Case("sft_blank_file", "train", ("algorithm.name=sft", "data.val_files=null", "data.train_files={d}/s.jsonl"),
         ("s.jsonl", "no rows"),
         files={"s.jsonl": "\n"}),
    # ---- model directories that pass the path check but cannot be loaded
    Case("model_no_tokenizer", "train", ("actor_rollout_ref.model.path={d}/m",), ("has no tokenizer", "tokenizer_path"),
         files={"m/config.json": lambda p: p.write_text((Path(_MODEL[0]) / "config.json").read_text())}),
    Case("model_config_corrupt", "train", ("actor_rollout_ref.model.path={d}/m",), ("actor_rollout_ref.model.path=",
         "does not load"),
         files={"m": lambda p: _copy_model(p, {"config.json": "{not json"})}),
    Case("model_tokenizer_corrupt", "train", ("actor_rollout_ref.model.path={d}/m",), ("the tokenizer does not load",),
         files={"m": lambda p: _copy_model(p, {"tokenizer.json": '{"version": "1.0", "model": 5}'})}),
    Case("model_no_weights", "train", ("actor_rollout_ref.model.random_init=false",), ("has a config.json but no weights",
         "random_init"),
         slow=True),
    # ---- warm-up rows (read once the model is built)
    Case("warmup_no_response", "train", ("warmup.steps=2", "warmup.files={d}/w.jsonl"), ("w.jsonl, row 1", "missing 'response'"),
         files={"w.jsonl": jsonl(SFT, {"prompt": "1+2="})}, slow=True),
    Case("warmup_blank", "train", ("warmup.steps=2", "warmup.files={d}/w.jsonl"), ("w.jsonl", "no rows", "warmup.steps=0"),
         files={"w.jsonl": "\n"}, slow=True),
    # ---- custom reward files (imported once before any model work)
    Case("reward_import_error", "train", ("custom_reward_function.path={d}/reward.py",),
         ("custom_reward_function.path=", "line 1", "ModuleNotFoundError", "nonexistent_scorer_lib"),
         files={"reward.py": "import nonexistent_scorer_lib\n"}),
    Case("reward_raises_on_import", "train", ("custom_reward_function.path={d}/reward.py",),
         ("line 2", "ZeroDivisionError"), files={"reward.py": "x = 1\ny = x / 0\n"}),
    Case("reward_exits_on_import", "train", ("custom_reward_function.path={d}/reward.py",),
         ("SystemExit",), files={"reward.py": "import sys\nsys.exit(3)\n"}),
    Case("reward_wrong_name", "train", ("custom_reward_function.path={d}/reward.py", "custom_reward_function.name=score"),
         ("custom_reward_function.path=", "score"), files={"reward.py": "def compute_score(**kw):\n    return 0.0\n"}),
    Case("reward_not_callable", "train", ("custom_reward_function.path={d}/reward.py",),
         ("custom_reward_function.path=",), files={"reward.py": "compute_score = 3\n"}),
    Case("reward_syntax_train", "train", ("custom_reward_function.path={d}/reward.py",), ("line 1", "SyntaxError"),
         files={"reward.py": "def compute_score(:\n"}),
    # ---- other commands
    Case("eval_model_missing", "raw", ("eval", "--model", "{d}/m", "--data", "{test}"), ("--model=", "does not exist")),
    Case("eval_model_hub_id", "raw", ("eval", "--model", "Qwen/Qwen2.5-0.5B", "--data", "{test}"), ("--model=",
         "does not exist")),
    Case("eval_model_empty", "raw", ("eval", "--model", "{d}/m", "--data", "{test}"), ("--model=", "it is empty"),
         files={"m": None}),
    Case("eval_model_no_weights", "raw", ("eval", "--model", "{model}", "--data", "{test}"), ("--model=", "no weights")),
    Case("export_not_checkpoint", "raw", ("export", "{d}", "{d}/out"), ("is not a hybridrl checkpoint",)),
    Case("export_missing", "raw", ("export", "{d}/nothing", "{d}/out"), ("is not a hybridrl checkpoint",)),
    Case("data_gsm8k_no_input", "raw", ("data", "gsm8k"), ("needs --input",)),
    Case("data_gsm8k_missing_input", "raw", ("data", "gsm8k", "--input", "{d}/in.jsonl", "--output", "{d}/o.parquet"),
         ("in.jsonl",)),
    Case("data_gsm8k_csv_output", "raw", ("data", "gsm8k", "--input", "{d}/in.jsonl", "--output", "{d}/o.csv"),
         ("'.csv'",), files={"in.jsonl": jsonl({"question": "q", "answer": "#### 1"})}),
    Case("cli_unknown_command", "raw", ("trian", "x.yaml"), ("invalid choice: 'trian'",)),
    # no config file = verl's defaults (a verl command line), which name no model or data
    Case("cli_no_config", "raw", ("explain",), ("actor_rollout_ref.model.path is empty", "data.train_files")),
    Case("cli_bad_dtype", "raw", ("export", "a", "b", "--dtype", "int8"), ("argument --dtype",)),
]
# fmt: on

_MODEL: list[str] = []  # the session's tiny model directory, for the file builders above


def _copy_model(p: Path, replace: dict[str, str]) -> None:
    p.mkdir()
    for f in Path(_MODEL[0]).iterdir():
        (p / f.name).write_bytes(f.read_bytes())
    for name, text in replace.items():
        (p / name).write_text(text)


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tiny_model_dir, arith_data):
    """A workspace: the tiny model, the arithmetic data, and an existing run that must survive."""
    _MODEL[:] = [tiny_model_dir]
    root = tmp_path_factory.mktemp("badinput")
    precious = root / "runs" / "existing"
    (precious / "checkpoints" / "step_2").mkdir(parents=True)
    (precious / "metrics.jsonl").write_text(jsonl({"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}))
    (precious / "samples.jsonl").write_text(jsonl({"step": 1, "prompt": "1+2=", "response": "3"}))
    (precious / "config.yaml").write_text("trainer:\n  seed: 1\n")
    (precious / "checkpoints" / "step_2" / "model.bin").write_bytes(os.urandom(64))
    (precious / "checkpoints" / "latest").write_text("step_2")
    fmt = dict(model=tiny_model_dir, train=arith_data["train"], test=arith_data["test"], sft=arith_data["sft"], precious=precious)
    return {"root": root, "precious": precious, "fmt": fmt, "snapshot": _snapshot(precious)}


def _argv(case: Case, ws, d: Path) -> list[str]:
    fmt = {**ws["fmt"], "d": d}
    if case.cmd == "raw":
        return [a.format(**fmt) for a in case.over]
    cfg = d / "c.yaml"
    text = BASE_YAML.format(**fmt) if case.yaml is None else case.yaml
    if isinstance(text, str):
        text = text.replace("{d}", str(d)).replace("{model}", fmt["model"]).replace("{train}", fmt["train"])
        text = text.replace("{test}", fmt["test"]).replace("{precious}", str(fmt["precious"])).encode()
    cfg.write_bytes(text)
    argv = [case.cmd, str(cfg), *[o.format(**fmt) for o in case.over]]
    if case.cmd == "train":  # a fresh run directory: the existing run must not be touched either way
        argv.append(f"trainer.default_local_dir={d / 'run'}")
    return argv


def _write_files(case: Case, d: Path) -> None:
    for name, content in case.files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            p.mkdir()
        elif callable(content):
            content(p)
        else:
            p.write_bytes(content if isinstance(content, bytes) else content.encode())


def test_the_corpus_is_large_and_ids_unique():
    assert len(CASES) >= 150
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, ws, capfd, monkeypatch):
    if case.id.endswith("device_cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if case.id == "run_dir_not_writable" and os.access("/proc", os.W_OK) and not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    d = ws["root"] / case.id
    d.mkdir()
    _write_files(case, d)
    fmt = {**ws["fmt"], "d": d}
    expect = [e.format(**fmt) for e in case.expect]
    monkeypatch.delenv("HYBRIDRL_DEBUG", raising=False)
    started = time.perf_counter()
    rc, _, err = run_in_process(_argv(case, ws, d), capfd)
    assert_one_line_error(rc, err, expect)
    assert time.perf_counter() - started < 30  # nothing waited on the network
    assert _snapshot(ws["precious"]) == ws["snapshot"]  # the existing run lost nothing
    assert not (d / "pwned").exists()


def test_debug_env_shows_the_traceback(ws, capfd, monkeypatch):
    monkeypatch.setenv("HYBRIDRL_DEBUG", "1")
    d = ws["root"] / "debug"
    d.mkdir()
    case = Case("debug", "train", ("data.train_files={d}/t.jsonl",), files={"t.jsonl": good_then("{oops")})
    _write_files(case, d)
    from hybridrl.data.errors import DataError

    with pytest.raises(DataError, match="t.jsonl:7: invalid JSON"):
        main(_argv(case, ws, d))


def test_a_bug_keeps_its_traceback(ws, capfd, monkeypatch):
    """An unexpected exception is not turned into a one-line error: it propagates (a traceback)."""
    import hybridrl.config.paths as paths

    def broken(cfg, *args):
        raise KeyError("a bug")

    monkeypatch.setattr(paths, "missing_paths", broken)
    d = ws["root"] / "bug"
    d.mkdir()
    with pytest.raises(KeyError, match="a bug"):
        main(_argv(Case("bug", "explain"), ws, d))
