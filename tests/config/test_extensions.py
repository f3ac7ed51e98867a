"""A user's file registers an estimator and a policy loss; the config then selects them by name."""

import sys
import textwrap

import pytest
import torch

from hybridrl.algorithms import ADV_ESTIMATORS, POLICY_LOSSES, get_adv_estimator, get_policy_loss
from hybridrl.config import ConfigError, load_config
from hybridrl.config.docs import render_reference

REQUIRED = ["actor_rollout_ref.model.path=models/tiny", "data.train_files=data/train.parquet", "actor_rollout_ref.rollout.n=2"]
LOSS_KEY = "actor_rollout_ref.actor.policy_loss.loss_mode"

USER_FILE = '''
from hybridrl.algorithms import register_adv_estimator, register_policy_loss


@register_adv_estimator("ext_score_minus_one")
def score_minus_one(*, token_level_rewards, response_mask, **unused):
    """A = (sum of rewards) - 1 on every response token."""
    adv = (token_level_rewards.sum(-1, keepdim=True) - 1) * response_mask
    return adv, adv


@register_policy_loss("ext_neg_logp")
def neg_logp(*, log_prob, response_mask, **unused):
    """Minus the mean log-prob: plain maximum likelihood of the sampled tokens."""
    loss = -(log_prob * response_mask).sum() / response_mask.sum()
    zero = loss.new_zeros(())
    return {"pg_loss": loss, "pg_clipfrac": zero, "pg_clipfrac_lower": zero, "ppo_kl": zero}
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_algos.py"
    path.write_text(textwrap.dedent(USER_FILE))
    yield str(path)
    ADV_ESTIMATORS.pop("ext_score_minus_one", None)
    POLICY_LOSSES.pop("ext_neg_logp", None)
    for name in [m for m in sys.modules if m.startswith("hybridrl_extension_")]:
        del sys.modules[name]


def test_names_registered_by_an_extension_are_selectable(user_file):
    chosen = ["algorithm.adv_estimator=ext_score_minus_one", f"{LOSS_KEY}=ext_neg_logp"]
    with pytest.raises(ConfigError) as e:  # not registered yet: both rejected, the known names listed
        load_config(None, [*REQUIRED, *chosen])
    assert any("algorithm.adv_estimator=ext_score_minus_one is not one of gae, grpo" in m for m in e.value.errors)
    assert any(f"{LOSS_KEY}=ext_neg_logp is not one of vanilla, gspo" in m for m in e.value.errors)

    cfg = load_config(None, [*REQUIRED, *chosen, f"extensions=[{user_file}]"])
    assert cfg.algorithm.adv_estimator == "ext_score_minus_one"
    # the trainer and the actor look the functions up by the configured names
    rewards, mask = torch.tensor([[0.0, 3.0], [2.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, _ = get_adv_estimator(cfg.algorithm.adv_estimator)(token_level_rewards=rewards, response_mask=mask)
    assert adv.tolist() == [[2.0, 2.0], [1.0, 0.0]]
    log_prob = torch.tensor([[-1.0, -2.0], [-3.0, -9.0]])
    out = get_policy_loss(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)(log_prob=log_prob, response_mask=mask)
    assert out["pg_loss"].item() == pytest.approx(2.0)
    assert "`ext_neg_logp`" in render_reference()  # docs list what is registered
    load_config(None, [*REQUIRED, *chosen, f"extensions=[{user_file}]"])  # loading twice is harmless


def test_an_extension_that_cannot_be_imported_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match=r"extensions: file not found: '.*nope.py'"):
        load_config(None, [*REQUIRED, f"extensions=[{tmp_path}/nope.py]"])
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="extensions: importing .*broken.py failed: RuntimeError: boom"):
        load_config(None, [*REQUIRED, f"extensions=[{broken}]"])
    with pytest.raises(ConfigError, match="extensions: cannot import module 'no_such_module_xyz'"):
        load_config(None, [*REQUIRED, "extensions=[no_such_module_xyz]"])
