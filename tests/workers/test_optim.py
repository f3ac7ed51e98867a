"""build_optimizer: AdamW, fused on CUDA, torch's default elsewhere; the same steps either way."""

import io

import pytest
import torch

from hybridrl.config.schema import OptimConfig
from hybridrl.workers.optim import build_optimizer

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _params(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(*shape, generator=g).to(device)) for shape in ((64, 33), (33,), (7, 5, 3))]
    frozen = torch.nn.Parameter(torch.randn(4).to(device), requires_grad=False)
    return ps, frozen


def _steps(opt, ps, n=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(p.device)
        opt.step()


def test_cpu_parameters_keep_torchs_default_and_frozen_ones_are_left_out():
    ps, frozen = _params("cpu")
    opt = build_optimizer([*ps, frozen], OptimConfig(lr=1e-2, weight_decay=0.1))
    assert not opt.defaults["fused"]
    assert [p for g in opt.param_groups for p in g["params"]] == ps


@CUDA
def test_cuda_parameters_get_the_fused_adamw_with_the_default_ones_steps():
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, betas=[0.9, 0.95])
    ps, _ = _params("cuda")
    opt = build_optimizer(ps, cfg)
    assert opt.defaults["fused"]
    ref, _ = _params("cuda")
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), foreach=True)
    _steps(opt, ps)
    _steps(ref_opt, ref)
    for a, b in zip(ps, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the state dict round-trips through a file into a fresh fused optimizer (checkpoint resume)
    again, _ = _params("cuda")
    with torch.no_grad():
        for a, b in zip(again, ps):
            a.copy_(b)
    opt2 = build_optimizer(again, cfg)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    opt2.load_state_dict(torch.load(buf, weights_only=True))
    _steps(opt, ps, seed=2)
    _steps(opt2, again, seed=2)
    for a, b in zip(ps, again):
        assert torch.equal(a, b)


@CUDA
def test_the_on_device_guarded_step_skips_a_non_finite_gradient_without_a_host_read():
    from hybridrl.workers.optim import guarded_step, guarded_step_on_device, steps_on_device

    cfg = OptimConfig(lr=1e-2, weight_decay=0.1)
    mods = []
    for _ in range(2):
        torch.manual_seed(0)
        mods.append(torch.nn.Linear(16, 8).cuda())
    opts = [build_optimizer(m.parameters(), cfg) for m in mods]
    assert all(steps_on_device(o) for o in opts) and not steps_on_device(opts[0], offload_state=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opts[0], lambda s: 1.0)
    x = torch.randn(4, 16, device="cuda")
    for bad in (False, True, False):
        for m in mods:
            m(x).square().sum().backward()
            if bad:
                m.weight.grad[0, 0] = float("nan")
        before = [p.detach().clone() for p in mods[1].parameters()]
        norm0, stepped = guarded_step(mods[0], opts[0], sched, grad_clip=1.0)
        norm1, flag = guarded_step_on_device(mods[1], opts[1], grad_clip=1.0)
        assert isinstance(norm1, torch.Tensor) and norm1.device.type == "cuda"
        assert stepped == (not bad) and flag.read() == bad and float(flag.tensor) == float(bad)
        if bad:
            assert all(torch.equal(a, b) for a, b in zip(before, mods[1].parameters()))
        else:
            assert float(norm1) == pytest.approx(norm0, rel=1e-6)
        for a, b in zip(mods[0].parameters(), mods[1].parameters()):
            assert torch.equal(a, b)
    assert opts[1].state[mods[1].weight]["step"].item() == 2
