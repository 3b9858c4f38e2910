"""Model registry: the models a cell can train, and the loss each one uses."""

from __future__ import annotations

import importlib
import inspect
import itertools
import sys
import threading
import time
from typing import Callable

import torch
from torch import nn

from ..core.cell import Cell
from ..core.knobs import KnobError

# Which names a cell may ask for is checked without torch: feedbench.core.model_names.


class MLP(nn.Sequential):
    """The prefetch study's model: Linear+ReLU stacks on wide vectors, one output."""

    def __init__(self, input_size: int, width: int, hidden_layers: int):
        layers: list[nn.Module] = [nn.Linear(input_size, width), nn.ReLU()]
        for _ in range(hidden_layers):
            layers += [nn.Linear(width, width), nn.ReLU()]
        layers.append(nn.Linear(width, 1))
        super().__init__(*layers)


def gpu_cycles_per_ms(device: torch.device) -> float:
    """How many torch.cuda._sleep cycles `device` spins per ms, timed by CUDA events (a host sync,
    about 10 ms)."""
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 10_000_000
        torch.cuda._sleep(cycles)  # warm the kernel up
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / start.elapsed_time(end)


class SleepModel(nn.Module):
    """A fixed compute time per step, for calibration: sleeps on the host, or spins the GPU."""

    def __init__(self, compute_ms: float):
        super().__init__()
        self.compute_ms = compute_ms
        self.weight = nn.Parameter(torch.ones(()))
        # GPU index -> cycles per ms, measured once per GPU. A dict, not a number: DataParallel
        # rebuilds its replicas from a shallow copy of __dict__ at every forward, so a number set in
        # a replica was lost and every step of every GPU paid the calibration again; the replicas
        # share this one dict.
        self._cycles_per_ms: dict[int | None, float] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            torch.cuda._sleep(int(self.compute_ms * self.cycles_per_ms(x.device)))
        else:
            time.sleep(self.compute_ms / 1000)
        return self.weight * x.float().mean()

    def cycles_per_ms(self, device: torch.device, calibrate: Callable = gpu_cycles_per_ms) -> float:
        if device.index not in self._cycles_per_ms:
            self._cycles_per_ms[device.index] = calibrate(device)
        return self._cycles_per_ms[device.index]


class TokenLSTM(nn.Module):
    """Embedding, a multi-layer LSTM (fused nn.LSTM or an LSTMCell loop), and a vocabulary head."""

    def __init__(
        self, vocab_size: int, embedding_dim: int, hidden_size: int, layers: int, impl: str
    ):
        super().__init__()
        self.impl = impl
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        if impl == "fused":
            self.lstm = nn.LSTM(embedding_dim, hidden_size, layers, batch_first=True)
        else:
            sizes = [embedding_dim] + [hidden_size] * (layers - 1)
            self.cells = nn.ModuleList(nn.LSTMCell(size, hidden_size) for size in sizes)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        if self.impl == "fused":
            x, _ = self.lstm(x)
        else:
            for cell in self.cells:
                h = c = x.new_zeros(x.shape[0], cell.hidden_size)
                outputs = []
                for t in range(x.shape[1]):
                    h, c = cell(x[:, t], (h, c))
                    outputs.append(h)
                x = torch.stack(outputs, dim=1)
        return self.head(x)


class RayMLP(nn.Sequential):
    """Ray's prefetch benchmark model: Linear layers from input_size through hidden_layers x width
    to 1, no activation.

    With input_size == width (4096 in the study) that is hidden_layers square layers and a one-unit
    output.
    """

    def __init__(self, input_size: int, width: int, hidden_layers: int):
        sizes = [input_size] + [width] * hidden_layers + [1]
        super().__init__(*(nn.Linear(a, b) for a, b in itertools.pairwise(sizes)))


BUILT_IN_OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def import_dynamo_apart() -> None:
    """Import torch._dynamo, which torch.optim imports at the first optimizer a process builds, in a
    thread of its own.

    That import leaves a frame in a reference cycle (torch.fx.wrap keeps its own frame), and a frame
    holds its callers' frames with their locals: imported from a cell's stack, it kept the first
    cell's model, optimizer and measurement (on a GPU, its parameters and CUDA events) for the
    cyclic collector. A thread's stack holds none of the cell's frames."""
    if "torch._dynamo" not in sys.modules:
        thread = threading.Thread(
            target=importlib.import_module, args=("torch._dynamo",), name="feedbench-import"
        )
        thread.start()
        thread.join()


def build_optimizer(
    cell: Cell, parameters, user: dict | None = None, **extra
) -> torch.optim.Optimizer:
    """The step's optimizer (knob `optimizer`): torch.optim's SGD, Adam or AdamW with the cell's lr
    and weight_decay (and momentum for SGD), then optimizer_args; or the user's, called as f(params,
    **optimizer_args). `extra` (foreach, for the FLOP counter's kernels) goes to a built-in one. The
    training loop and the FLOP counter both build it here, so the step they time and count is the
    same."""
    import_dynamo_apart()
    if user and "optimizer" in user:
        from ..core.plugins import expect

        optimizer = user["optimizer"](parameters, **cell.optimizer_args)
        return expect(
            optimizer,
            (torch.optim.Optimizer,),
            "a torch.optim.Optimizer",
            cell.optimizer,
            "optimizer",
        )
    own = {"momentum": cell.momentum} if cell.optimizer == "sgd" else {}
    args = {"lr": cell.lr, "weight_decay": cell.weight_decay, **own, **extra, **cell.optimizer_args}
    return BUILT_IN_OPTIMIZERS[cell.optimizer](parameters, **args)


def build_model(cell: Cell, user: dict | None = None, ctx=None) -> nn.Module:
    """The cell's model; `user` maps knobs to the user's imported callables
    (feedbench.core.plugins.resolve_all)."""
    if user and "model" in user:
        from ..core.plugins import call_factory, expect

        model = call_factory(user["model"], ctx, cell.model_args)
        return expect(model, (nn.Module,), "a torch.nn.Module", cell.model, "model")
    if cell.model == "mlp":
        return (RayMLP if cell.mlp_style == "ray" else MLP)(
            cell.input_size, cell.width, cell.hidden_layers
        )
    if cell.model == "sleep":
        return SleepModel(cell.compute_ms)
    if cell.model == "lstm":
        return TokenLSTM(
            cell.vocab_size, cell.embedding_dim, cell.hidden_size, cell.lstm_layers, cell.lstm_impl
        )
    import torchvision

    return torchvision.models.get_model(cell.model, weights=None, num_classes=cell.num_classes)


def build_loss(cell: Cell, user: dict | None, device: torch.device | None = None):
    """The user's loss (knob `loss`), built once: a class as cls(**loss_args), a module moved to the
    device (a class weight is a buffer); a function as it is; None without one. The training loop
    and the FLOP counter both take it from here."""
    loss = (user or {}).get("loss")
    if loss is None or not inspect.isclass(loss):
        return loss
    built = loss(**cell.loss_args)
    if not callable(built):
        raise KnobError(
            f"knob 'loss': '{cell.loss}' built a {type(built).__module__}."
            f"{type(built).__qualname__}, which is not callable; allowed: a loss class whose "
            "instances are called as f(output, target), or such a function"
        )
    return built.to(device) if isinstance(built, nn.Module) and device is not None else built


def loss_function(model: str) -> Callable[[torch.Tensor, tuple], torch.Tensor]:
    """loss(output, batch): batch is (inputs, targets[, lengths])."""
    if model == "sleep":
        return lambda out, batch: out
    if model == "mlp":
        return lambda out, batch: nn.functional.mse_loss(out.float(), batch[1])
    if model == "lstm":
        return lambda out, batch: nn.functional.cross_entropy(
            out.float().flatten(0, 1), batch[1].flatten(), ignore_index=0
        )
    return lambda out, batch: nn.functional.cross_entropy(out.float(), batch[1])
