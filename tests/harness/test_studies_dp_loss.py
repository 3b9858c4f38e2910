"""The dp loss is computed inside each replica (harness.WithLoss), and that changes no gradient.

Checked with real processes: two gloo ranks on the CPU, each holding a replica of WithLoss under
DistributedDataParallel with half of the batch, must end with the gradients of one process that
computes the loss outside the model on the whole batch (DataParallel itself needs GPUs; its replicas
run the same WithLoss.forward).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from feedbench.harness.loop import WithLoss
from feedbench.harness.models import MLP, TokenLSTM, loss_function
from helpers.cells import tiny_mlp_base
from torch import nn


def _mlp_batch():
    torch.manual_seed(1)
    return torch.randn(8, 16), torch.randn(8, 1)


def _gradients(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("kind", ["mlp", "lstm"])
def test_with_loss_returns_the_loss_and_gradients_of_the_outside_loss(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        model, batch = MLP(16, 32, 2), _mlp_batch()
    else:
        model = TokenLSTM(50, 8, 8, 2, "fused")
        tokens = torch.randint(1, 50, (4, 6))
        batch = (tokens, torch.roll(tokens, -1, 1), torch.full((4,), 6))
    loss_fn = loss_function(kind)
    outside = loss_fn(model(batch[0]), batch)
    outside.backward()
    expected = _gradients(model)
    model.zero_grad()
    inside = WithLoss(model, loss_fn)(*batch)
    assert inside.shape == (1,) and torch.allclose(inside[0], outside)
    inside.mean().backward()
    assert all(
        torch.allclose(a, b, atol=1e-6) for a, b in zip(_gradients(model), expected, strict=True)
    )


def _rank(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = WithLoss(MLP(16, 32, 2), loss_function("mlp"))
        replica = nn.parallel.DistributedDataParallel(model)
        x, y = _mlp_batch()
        part = slice(rank * 4, rank * 4 + 4)
        replica(x[part], y[part]).mean().backward()
        torch.save(_gradients(model), os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_gloo_replicas_with_the_loss_inside_match_one_process_on_the_whole_batch(tmp_path):
    mp.spawn(_rank, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    torch.manual_seed(0)
    model = MLP(16, 32, 2)
    x, y = _mlp_batch()
    loss_function("mlp")(model(x), (x, y)).backward()
    expected = _gradients(model)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, expected, strict=True))


def test_a_dp_cell_trains_through_the_wrapper_and_weight_decay_is_a_knob(run_cell):
    common = tiny_mlp_base(steps=2, warmup_steps=1, device="cpu", torch_threads=1)
    code, result = run_cell(parallel="dp", gpus_per_node=2, weight_decay=1e-5, **common)
    assert code == 0 and result["status"] == "ok", result.get("error")
    assert result["cell"]["weight_decay"] == 1e-5
