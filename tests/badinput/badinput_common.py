"""What the bad-input tests share: a good prompt row, the base config, the in-process runner
and the one-line-error assertion."""

from __future__ import annotations

import json

from hybridrl.cli.main import main

GOOD = {"data_source": "arith", "prompt": [{"role": "user", "content": "1+2="}], "reward_model": {"ground_truth": "3"}}


def jsonl(*rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def good_then(*bad, n: int = 6) -> str:
    """n good prompt rows, then the bad ones (so the bad row is row n, line n + 1)."""
    return jsonl(*[GOOD] * n, *bad)


BASE_YAML = """\
data:
  train_files: {train}
  val_files: {test}
  train_batch_size: 4
  max_prompt_length: 8
  max_response_length: 4
actor_rollout_ref:
  model:
    path: {model}
    random_init: true
  actor:
    ppo_mini_batch_size: 2
    ppo_micro_batch_size_per_gpu: 2
    optim:
      lr: 1.0e-3
  rollout:
    name: hf
    n: 2
algorithm:
  adv_estimator: grpo
trainer:
  device: cpu
  total_training_steps: 2
  default_local_dir: {precious}
  resume_mode: auto
  logger: [console, jsonl]
"""


def run_in_process(argv: list[str], capfd) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capfd.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, fragments) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("hybridrl: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
