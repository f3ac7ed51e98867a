"""Where a weight push waits for the rollout pool (distributed/weight_staging.py): the packing both
stagings share, the host arena's reuse, auto's choice and the option's validation. The pushes
themselves over gloo: tests/distributed/test_weight_channel.py and test_verified_push.py."""

from __future__ import annotations

import pytest
import torch

from hybridrl.distributed.weight_staging import DeviceStaging, HostStaging, Stager

CPU = torch.device("cpu")


def _policy(seed: int, big: int = 700) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, 8, generator=g)
    return [
        ("embed", torch.randn(50, 8, generator=g)),  # 400 elements
        ("w.T", w.t()),  # not contiguous
        ("b", torch.randn(8, generator=g, dtype=torch.float64)),
        ("big", torch.randn(big, generator=g).to(torch.float16)),  # more than a bucket (256 elements)
        ("scale", torch.randn((), generator=g)),
    ]


def _unpack(staged) -> dict[str, torch.Tensor]:
    out = {}
    for i, bucket in enumerate(staged.buckets):
        flat = staged.flat(i, CPU)
        for name, shape, offset, n in bucket.entries:
            out[name] = flat[offset : offset + n].view(shape).clone()
    return out


@pytest.mark.parametrize("cls", [DeviceStaging, HostStaging])
def test_a_push_is_packed_into_buckets_in_the_wire_dtype(cls):
    staged = cls(CPU, torch.bfloat16, bucket_numel=256).stage(_policy(1))
    # a bucket closes when the next tensor would overflow it; "big" alone; "scale" after it in a new one
    assert [[e[0] for e in b.entries] for b in staged.buckets] == [["embed"], ["w.T", "b"], ["big"], ["scale"]]
    assert [b.numel for b in staged.buckets] == [400, 72, 700, 1]
    assert staged.nbytes == 2 * (400 + 72 + 700 + 1) and staged.staging == cls.name and staged.ready is None
    got = _unpack(staged)
    for name, t in _policy(1):
        want = t.to(torch.bfloat16)
        assert got[name].shape == want.shape and torch.equal(got[name].view(torch.int16), want.view(torch.int16)), name


def test_the_host_arena_is_reused_and_carries_only_the_new_push():
    host = HostStaging(CPU, torch.bfloat16, bucket_numel=256)
    first = host.stage(_policy(1))
    buffers = [b.data_ptr() for b in first.buffers]
    assert host.allocations == 4
    second = host.stage(_policy(2))  # the policy moved: same layout, new values
    assert host.allocations == 4 and [b.data_ptr() for b in second.buffers] == buffers
    assert all(torch.equal(second_t, t.to(torch.bfloat16)) for (_, t), second_t in zip(_policy(2), _unpack(second).values()))
    grown = host.stage(_policy(3, big=900))  # a bucket needs more: that one buffer is replaced
    assert host.allocations == 5 and [b.data_ptr() for b in grown.buffers][:2] == buffers[:2]
    assert torch.equal(_unpack(grown)["big"], _policy(3, big=900)[3][1].to(torch.bfloat16))
    grown.release()
    assert len(host.arena) == 4  # the arena outlives the push


def test_device_buckets_are_fresh_each_push_and_freed_on_release():
    device = DeviceStaging(CPU, torch.float32, bucket_numel=256)
    staged = device.stage(_policy(1))
    # one empty bucket a tensor's capacity each (at least bucket_numel)
    assert [b.numel() for b in staged.buffers] == [400, 256, 700, 256]
    staged.release()
    assert staged.buffers == []


def test_auto_stages_on_the_device_when_the_push_fits_in_half_the_free_memory():
    nbytes = 2 * (400 + 72 + 700 + 1)  # the policy in bf16
    budget = {"free": 2 * nbytes}
    stager = Stager("auto", CPU, torch.bfloat16, 256, free=lambda device: budget["free"])
    assert stager.choose() == "host"  # the size is not known yet
    assert stager.choose(numel=nbytes // 2) == "device"  # the caller's estimate
    assert stager.stage(_policy(1), numel=nbytes // 2).staging == "device"
    budget["free"] = 2 * nbytes - 2  # from now on the last push's size: one element too many
    assert stager.choose() == "host" and stager.stage(_policy(2)).staging == "host"
    assert stager.choose(numel=1) == "host"  # the last push's size wins over an estimate
    budget["free"] = None  # no budget (the CPU's default)
    assert stager.choose() == "device"
    assert Stager("host", CPU, torch.bfloat16, 256, free=lambda device: 10**12).choose() == "host"
    assert Stager("device", CPU, torch.bfloat16, 256, free=lambda device: 0).choose() == "device"


def test_auto_on_the_cpu_stages_in_plain_memory():
    stager = Stager("auto", CPU, torch.bfloat16, 256)
    staged = stager.stage(_policy(1))
    assert staged.staging == "device" and not any(b.is_pinned() for b in staged.buffers)
    assert not any(b.is_pinned() for b in Stager("host", CPU, torch.bfloat16, 256).stage(_policy(1)).buffers)


def test_a_bad_staging_fails_with_the_key_and_the_choices():
    from hybridrl.config import ConfigError, load_config

    with pytest.raises(ValueError, match=r"update_weights_staging='gpu' is not one of auto, device, host"):
        Stager("gpu", CPU, torch.bfloat16, 256)
    key = "actor_rollout_ref.rollout.update_weights_staging"
    with pytest.raises(ConfigError, match=rf"{key}=hots is not one of auto, device, host; use e.g. {key}=host"):
        load_config(None, ["actor_rollout_ref.model.path=models/tiny", "data.train_files=d.parquet", f"{key}=hots"])
