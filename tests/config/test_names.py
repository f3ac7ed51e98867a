"""Every allowed-name set of the config (config/names.py) equals the registry it copies.

The config layer cannot import the registries (they sit above it and pull in torch), so the
sets are written out there; this test is what keeps them from drifting apart.
"""

import pytest

from hybridrl.algorithms import kl, losses, preference, rollout_correction
from hybridrl.config import names
from hybridrl.data import dataset
from hybridrl.data import preference as preference_data
from hybridrl.models import packing
from hybridrl.rewards import assembly
from hybridrl.rollout.agent import parser
from hybridrl.tracking import tracker

PAIRS = [
    (names.TRUNCATIONS, dataset.TRUNCATION_MODES),
    (names.LOSS_AGG_MODES, losses.LOSS_AGG_MODES),
    (names.KL_ESTIMATORS, kl.KL_TYPES),
    (names.DPO_LOSS_TYPES, preference.DPO_LOSS_TYPES),
    (names.ROLLOUT_IS_LEVELS, rollout_correction.ROLLOUT_IS_LEVELS),
    (names.ROLLOUT_RS_OPTIONS, rollout_correction.ROLLOUT_RS_OPTIONS),
    (names.REWARD_MANAGERS, assembly.REWARD_MANAGERS),
    (names.LOGGERS, tracker.LOGGERS),
    (names.PACKED_ATTN_BACKENDS, packing.BACKENDS),
    (names.TOOL_CALL_FORMATS, parser.FORMATS),
    (names.ALGORITHM_NAMES, ("rl", *preference_data.KINDS)),
]


@pytest.mark.parametrize("config_set, registry", PAIRS, ids=[str(p[0][:2]) for p in PAIRS])
def test_a_config_name_set_equals_its_registry(config_set, registry):
    assert set(config_set) == set(registry)


def test_every_trainer_mode_has_a_depth():
    from types import SimpleNamespace

    from hybridrl.trainer.async_rollout import depth

    def cfg(mode):
        return SimpleNamespace(trainer=SimpleNamespace(mode=mode), async_training=SimpleNamespace(max_staleness=3))

    # async_rollout.depth knows sync and one_step_off by name; every other mode reads the staleness bound
    assert [depth(cfg(mode)) for mode in names.TRAINER_MODES] == [0, 1, 3]


def test_the_config_module_is_torch_free():
    import subprocess
    import sys

    code = "import sys, hybridrl.config.names, hybridrl.config.validate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
