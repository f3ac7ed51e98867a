"""verl YAML as verl's Hydra tree reads it (hybridrl/compat/verl/hydra.py): a defaults list composing files of
a config directory, `${...}` interpolations resolved after the overrides, `--cfg job` printing the result.
The tree here is our own, with the constructs of verl's trainer/config (group@package entries, ../ groups,
a bare name, _self_, _target_, oc.select)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from hybridrl.cli.main import main
from hybridrl.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "trainer.yaml": """
        defaults:
          - actor@actor_rollout_ref.actor: dp_actor
          - rollout@actor_rollout_ref.rollout: rollout
          - optional missing@x: absent
          - _self_
        data:
          train_files: TRAIN
          max_prompt_length: 8
          max_response_length: 4
          train_batch_size: 16
        actor_rollout_ref:
          model:
            path: MODEL
            random_init: true
          actor:
            ppo_mini_batch_size: 8
        critic:
          ppo_epochs: ${actor_rollout_ref.actor.ppo_epochs}
        trainer:
          project_name: proj
          experiment_name: exp
          default_local_dir: OUT/${trainer.project_name}/${trainer.experiment_name}
          logger: [console]
          device: cpu
          total_training_steps: ${oc.env:HYBRIDRL_TEST_STEPS,3}
        """,
    "actor/dp_actor.yaml": """
        defaults:
          - ../optim@optim: fsdp
          - actor
          - _self_
        _target_: verl.workers.config.FSDPActorConfig
        ppo_epochs: 2
        """,
    "actor/actor.yaml": """
        ppo_epochs: 1
        clip_ratio: 0.25
        ppo_mini_batch_size: 256
        """,
    "optim/fsdp.yaml": """
        _target_: verl.workers.config.FSDPOptimizerConfig
        lr: 3e-6
        """,
    "rollout/rollout.yaml": """
        name: hf
        n: 4
        prompt_length: ${oc.select:data.max_prompt_length,512}
        response_length: ${data.max_response_length}
        """,
}


@pytest.fixture()
def tree(tmp_path) -> Path:
    for name, text in FILES.items():
        path = tmp_path / "conf" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = textwrap.dedent(text).replace("TRAIN", str(ROOT / "data/arith/train.jsonl"))
        path.write_text(text.replace("MODEL", str(ROOT / "hybridrl/assets/tiny-arith")).replace("OUT", str(tmp_path / "runs")))
    return tmp_path / "conf" / "trainer.yaml"


def test_defaults_list_composes_in_order_and_interpolations_follow_the_overrides(tree, tmp_path):
    cfg = load_config(tree, ["trainer.experiment_name=other", "actor_rollout_ref.actor.ppo_epochs=3"])
    a = cfg.actor_rollout_ref.actor
    # dp_actor's own ppo_epochs (2) wins over actor.yaml's (1, before _self_); the override over both
    assert a.ppo_epochs == 3 and cfg.critic.ppo_epochs == 3  # ${...} resolved after the override, as Hydra
    assert a.clip_ratio == 0.25 and a.optim.lr == 3e-6  # ../optim@optim lands at actor_rollout_ref.actor.optim
    assert a.ppo_mini_batch_size == 8  # the primary file's _self_ comes last
    assert cfg.actor_rollout_ref.rollout.n == 4 and cfg.actor_rollout_ref.rollout.name == "hf"
    assert cfg.trainer.default_local_dir == str(tmp_path / "runs/proj/other")
    assert cfg.trainer.total_training_steps == 3  # ${oc.env:...,3}


def test_an_unknown_interpolation_or_defaults_file_is_one_line(tree):
    with pytest.raises(ConfigError, match=r"trainer.project_name: cannot resolve an interpolation: .*no_such"):
        load_config(tree, ["trainer.project_name=${data.no_such}"])
    text = tree.read_text().replace("rollout@actor_rollout_ref.rollout: rollout", "rollout@actor_rollout_ref.rollout: sglang")
    tree.write_text(text)
    with pytest.raises(ConfigError, match=r"defaults entry .*sglang.* names .*rollout/sglang.yaml, which does not exist"):
        load_config(tree)


def test_cfg_job_prints_the_resolved_config_and_runs_nothing(tree, tmp_path, capsys):
    assert main(["train", str(tree), "--cfg", "job", "data.max_response_length=6"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["actor_rollout_ref"]["actor"]["optim"]["lr"] == 3e-6
    assert printed["data"]["max_response_length"] == 6 and printed["trainer"]["default_local_dir"] == str(
        tmp_path / "runs/proj/exp"
    )
    assert not (tmp_path / "runs").exists()


def test_cfg_job_on_a_verl_command_line(capsys):
    from hybridrl.cli.verl import main as verl_main

    assert (
        verl_main(
            "ppo", ["--cfg", "job", "data.train_files=a.parquet", "actor_rollout_ref.model.path=m", "data.max_prompt_length=77"]
        )
        == 0
    )
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["max_prompt_length"] == 77 and printed["data"]["train_batch_size"] == 1024  # verl's default
