"""Policy losses: the registry, and each loss mode against numbers worked out by hand (float64)."""

import math

import pytest
import torch

from hybridrl.algorithms import POLICY_LOSSES, compute_policy_loss, get_policy_loss, register_policy_loss
from hybridrl.config.schema import ActorConfig, PolicyLossConfig

D = torch.float64
LN = math.log


def t(x):
    return torch.tensor(x, dtype=D)


def close(actual, expected):
    torch.testing.assert_close(actual, t(expected), rtol=1e-9, atol=1e-12)


def actor(**policy_loss) -> ActorConfig:
    return ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, policy_loss=PolicyLossConfig(**policy_loss))


def call(mode, old, new, adv, mask, agg="token-mean", cfg=None, **kw):
    log_prob = t(new).requires_grad_(True)
    out = get_policy_loss(mode)(
        old_log_prob=t(old),
        log_prob=log_prob,
        advantages=t(adv),
        response_mask=t(mask),
        loss_agg_mode=agg,
        config=cfg or actor(),
        **kw,
    )
    out["pg_loss"].backward()
    return out, log_prob.grad


def test_registry_lists_every_mode_and_rejects_unknown_and_duplicate_names():
    assert {"vanilla", "gspo", "cispo", "gpg", "clip_cov", "kl_cov", "geo_mean"} <= set(POLICY_LOSSES)
    with pytest.raises(ValueError, match="unknown policy loss 'gsp'; known: .*'gspo'"):
        get_policy_loss("gsp")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(lambda **kw: {})


def test_every_loss_returns_the_same_keys_as_0_dim_tensors():
    g = torch.Generator().manual_seed(0)
    old, new = torch.randn(3, 4, generator=g, dtype=D), torch.randn(3, 4, generator=g, dtype=D)
    adv, mask = torch.randn(3, 4, generator=g, dtype=D), (torch.rand(3, 4, generator=g) > 0.3).to(D)
    for name, fn in POLICY_LOSSES.items():
        out = fn(
            old_log_prob=old,
            log_prob=new,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode="token-mean",
            config=actor(clip_cov_ratio=0.5, kl_cov_ratio=0.5),
        )
        for key in ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
            assert out[key].dim() == 0 and torch.isfinite(out[key]), (name, key)


def test_vanilla_is_compute_policy_loss_exactly():
    g = torch.Generator().manual_seed(1)
    old, new = torch.randn(4, 5, generator=g, dtype=D), torch.randn(4, 5, generator=g, dtype=D)
    adv, mask = torch.randn(4, 5, generator=g, dtype=D), (torch.rand(4, 5, generator=g) > 0.3).to(D)
    cfg = ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=2.5)
    for agg in ("token-mean", "seq-mean-token-mean"):
        ref = compute_policy_loss(
            old_log_prob=old,
            log_prob=new,
            advantages=adv,
            response_mask=mask,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            clip_ratio_c=2.5,
            loss_agg_mode=agg,
            global_tokens=17,
            global_seqs=6,
        )
        out = get_policy_loss("vanilla")(
            old_log_prob=old,
            log_prob=new,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode=agg,
            config=cfg,
            global_tokens=17,
            global_seqs=6,
        )
        assert out.keys() == ref.keys()
        for k in ref:
            assert torch.equal(out[k], ref[k]), k


def test_vanilla_multiplies_token_losses_by_rollout_is_weights():
    # ratio 1 everywhere: loss_t = -A_t * w_t = [-0.5, -2, -6] over 3 tokens
    out, _ = call(
        "vanilla",
        [[0, 0], [0, 0]],
        [[0, 0], [0, 0]],
        [[1, 2], [3, 5]],
        [[1, 1], [1, 0]],
        rollout_is_weights=t([[0.5, 1], [2, 1]]),
    )
    assert out["pg_loss"].item() == pytest.approx(-8.5 / 3)


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    # row 0: token ratios 1.21 and 1 -> s = exp((ln 1.21 + 0) / 2) = 1.1 (not clipped, A = 1): loss -1.1 per token
    # row 1: ratio 1.1, A = -2: loss 2.2 on its one token (the padding's 7.0 is ignored)
    # seq-mean-token-mean: ((-1.1 - 1.1) / 2 + 2.2) / 2 = 0.55
    out, grad = call("gspo", [[0, 0], [0, 0]], [[LN(1.21), 0], [LN(1.1), 7.0]], [[1, 1], [-2, -2]], [[1, 1], [1, 0]])
    assert out["pg_loss"].item() == pytest.approx(0.55)
    # every token of a sequence gets -A * s_i / (len_i * S): the sequence ratio, not its own
    close(grad, [[-1.1 / 4, -1.1 / 4], [2 * 1.1 / 2, 0.0]])
    assert out["pg_clipfrac"].item() == 0.0
    assert out["ppo_kl"].item() == pytest.approx(-(LN(1.21) + LN(1.1)) / 3)


def test_gspo_clips_the_sequence_ratio_and_ignores_loss_agg_mode():
    # s = exp(ln 2 / 2) = 1.414 > 1 + 0.28: the loss is -1.28 per token and has no gradient
    out, grad = call("gspo", [[0, 0]], [[LN(2), 0]], [[1, 1]], [[1, 1]], agg="token-mean")
    assert out["pg_loss"].item() == pytest.approx(-1.28)
    assert grad.abs().sum().item() == 0.0
    assert out["pg_clipfrac"].item() == 1.0


def test_cispo_scales_the_log_prob_gradient_by_the_clipped_detached_ratio():
    # ratios 1.5, 0.5, 1 -> clipped 1.28, 0.8, 1; loss_t = -clip(r_t) * A_t * logp_t
    new = [[LN(1.5), LN(0.5), 0.0]]
    out, grad = call("cispo", [[0, 0, 0]], new, [[2, 1, 3]], [[1, 1, 1]])
    assert out["pg_loss"].item() == pytest.approx((-1.28 * 2 * LN(1.5) - 0.8 * 1 * LN(0.5) - 0) / 3)
    close(grad, [[-1.28 * 2 / 3, -0.8 / 3, -3 / 3]])
    assert out["pg_clipfrac"].item() == pytest.approx(2 / 3)
    assert out["ppo_kl"].item() == pytest.approx(-(LN(1.5) + LN(0.5)) / 3)


def test_gpg_is_the_plain_policy_gradient():
    # loss_t = -A_t * logp_t = [1, 2, -1] over 3 tokens; the padding (9.0) is ignored
    out, grad = call("gpg", [[-1, -2], [-0.5, 0]], [[-1, -2], [-0.5, 9]], [[1, 1], [-2, -2]], [[1, 1], [1, 0]])
    assert out["pg_loss"].item() == pytest.approx(2 / 3)
    close(grad, [[-1 / 3, -1 / 3], [2 / 3, 0]])
    assert out["ppo_kl"].item() == 0.0


# clip_cov / kl_cov: A = [2, 1, 1, -4] (mean 0), logp = [0, -1, -1, -2] (mean -1)
# -> centered covariance c = [2*1, 0, 0, -4*-1] = [2, 0, 0, 4]
COV_ADV, COV_LOGP = [[2, 1, 1, -4]], [[0.0, -1.0, -1.0, -2.0]]


@pytest.mark.parametrize(
    "ub, detached, loss",
    [
        (5.0, [0, 3], (-1 - 1) / 4),  # both c = 2 and c = 4 lie in (1, 5): tokens 0 and 3 lose their term
        (3.0, [0], (-1 - 1 + 4) / 4),  # only c = 2 lies in (1, 3)
    ],
)
def test_clip_cov_detaches_the_tokens_whose_covariance_lies_in_the_band(ub, detached, loss):
    cfg = actor(clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=ub)  # budget int(0.5 * 4) = 2 tokens
    out, grad = call("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, [[1, 1, 1, 1]], cfg=cfg)  # ratio 1: PPO clips nothing
    assert out["pg_loss"].item() == pytest.approx(loss)
    expected = [0.0 if i in detached else -COV_ADV[0][i] / 4 for i in range(4)]
    close(grad, [expected])
    assert out["pg_clipfrac"].item() == pytest.approx(len(detached) / 4)


def test_clip_cov_detaches_at_most_its_budget_drawn_among_the_candidates():
    cfg = actor(clip_cov_ratio=0.1, clip_cov_lb=1.0, clip_cov_ub=5.0)  # budget max(int(0.4), 1) = 1 of 2 candidates
    torch.manual_seed(0)
    seen = set()
    for _ in range(20):
        out, _ = call("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, [[1, 1, 1, 1]], cfg=cfg)
        assert out["pg_clipfrac"].item() == pytest.approx(0.25)
        seen.add(round(out["pg_loss"].item(), 9))
    assert seen == {round((-1 - 1 + 4) / 4, 9), round((-2 - 1 - 1) / 4, 9)}  # token 0 or token 3


@pytest.mark.parametrize("ratio, penalty", [(0.25, 0.1 * 0.2), (0.5, 0.1 * 0.2 + 0.1 * 0.1)])
def test_kl_cov_penalises_the_tokens_of_largest_covariance(ratio, penalty):
    d = [0.1, 0.0, 0.0, -0.2]  # logp - logp_old
    old = [[lp - x for lp, x in zip(COV_LOGP[0], d)]]
    cfg = actor(kl_cov_ratio=ratio, ppo_kl_coef=0.1)  # k = max(1, int(4 * ratio)): token 3 (c = 4), then token 0 (c = 2)
    out, _ = call("kl_cov", old, COV_LOGP, COV_ADV, [[1, 1, 1, 1]], cfg=cfg)
    unclipped = -2 * math.exp(0.1) - 1 - 1 + 4 * math.exp(-0.2)
    assert out["pg_loss"].item() == pytest.approx((unclipped + penalty) / 4)
    assert out["ppo_kl"].item() == pytest.approx(0.3 / 4)  # mean |logp - logp_old|


def test_geo_mean_clips_token_log_ratios_and_takes_the_geometric_mean():
    # row 0: d = [0.5, -0.1], A = 1 -> clipped [0.28, -0.1], ratio exp(0.09), loss -exp(0.09)
    # row 1: d = [-0.5], A = -2 -> -min(0.5, 0.2) = -0.2, ratio exp(-0.2), loss 2 exp(-0.2)
    old, new = [[0, 0], [0, 0]], [[0.5, -0.1], [-0.5, 3.0]]
    adv, mask = [[1, 1], [-2, -2]], [[1, 1], [1, 0]]
    out, grad = call("geo_mean", old, new, adv, mask)
    assert out["pg_loss"].item() == pytest.approx((-math.exp(0.09) + 2 * math.exp(-0.2)) / 2)
    # gradient only through unclipped tokens: row 0 token 1, -A * ratio / len / S
    close(grad, [[0.0, -math.exp(0.09) / 2 / 2], [0.0, 0.0]])
    assert out["pg_clipfrac"].item() == pytest.approx(1 / 3)
    assert out["pg_clipfrac_lower"].item() == pytest.approx(1 / 3)
    weighted, _ = call("geo_mean", old, new, adv, mask, rollout_is_weights=t([[4, 1], [0.5, 100]]))
    # per-sequence weight: geometric mean of the token weights, 2 and 0.5
    assert weighted["pg_loss"].item() == pytest.approx((-2 * math.exp(0.09) + 2 * 0.5 * math.exp(-0.2)) / 2)


def test_micro_batch_losses_add_up_to_the_mini_batch_loss_for_every_mode():
    g = torch.Generator().manual_seed(2)
    old, new = torch.randn(4, 5, generator=g, dtype=D), torch.randn(4, 5, generator=g, dtype=D)
    adv, mask = torch.randn(4, 5, generator=g, dtype=D), (torch.rand(4, 5, generator=g) > 0.2).to(D)
    cfg = actor(kl_cov_ratio=0.5)
    for name in ("vanilla", "gspo", "cispo", "gpg", "geo_mean"):  # the cov modes select tokens per micro-batch
        fn = get_policy_loss(name)
        counts = dict(global_tokens=mask.sum(), global_seqs=4)
        whole = fn(
            old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask, loss_agg_mode="token-mean", config=cfg, **counts
        )["pg_loss"]
        parts = sum(
            fn(
                old_log_prob=old[s],
                log_prob=new[s],
                advantages=adv[s],
                response_mask=mask[s],
                loss_agg_mode="token-mean",
                config=cfg,
                **counts,
            )["pg_loss"]
            for s in (slice(0, 1), slice(1, 4))
        )
        assert parts.item() == pytest.approx(whole.item()), name
