"""The shared loop's non-finite guard: one message for every role, naming that role's keys."""

import pytest

from hybridrl.trainer.loop import NonFiniteError, check_finite


def test_below_the_limit_passes():
    check_finite({"actor/nonfinite_in_a_row": 1, "critic/nonfinite_in_a_row": 2, "actor/pg_loss": float("nan")}, limit=3)


@pytest.mark.parametrize(
    "role, where", [("actor", "actor_rollout_ref.actor"), ("critic", "critic"), ("reward_model", "reward_model")]
)
def test_a_role_at_the_limit_stops_with_its_own_keys(role, where):
    metrics = {"actor/nonfinite_in_a_row": 0, f"{role}/nonfinite_in_a_row": 3}
    with pytest.raises(NonFiniteError) as e:
        check_finite(metrics, limit=3)
    assert str(e.value) == (
        f"{role}: 3 updates in a row had a non-finite loss or gradient norm (trainer.max_nonfinite_steps=3); the last "
        f"good checkpoint is intact. Lower {where}.optim.lr, check the data and rewards for inf/NaN, or set {where}.grad_clip."
    )
