"""`hybridrl report`'s config summary: the keys a user changed, not the values derived from them."""

from hybridrl.cli.report import config_diff
from hybridrl.config import load_config, resolve, to_dict


def test_config_diff_lists_changed_keys_and_leaves_out_derived_ones():
    cfg = load_config(
        None,
        ["actor_rollout_ref.model.path=/m", "data.train_batch_size=64", "actor_rollout_ref.actor.clip_ratio_high=0.28"],
        check=False,
    )
    saved = to_dict(resolve(cfg))  # what config.yaml holds: tokenizer_path, critic path, clip_ratio_low filled in
    assert saved["actor_rollout_ref"]["model"]["tokenizer_path"] == "/m"
    assert sorted(config_diff(saved)) == [
        ("actor_rollout_ref.actor.clip_ratio_high", 0.28, None),
        ("actor_rollout_ref.model.path", "/m", ""),
        ("data.train_batch_size", 64, 256),
    ]
    assert config_diff({}) == []
