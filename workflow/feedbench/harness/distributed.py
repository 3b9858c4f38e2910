"""Multi-process cells: where this process stands in the job, how ranks meet, what rank 0 gathers.

Ranks are started by torchrun (locally: one torchrun per node, several nodes
emulated on localhost) or by srun (on Slurm: one task per GPU). Either way
each rank reads its place from the environment and joins one process group:
NCCL on GPUs, gloo on CPU, where the "GPUs" are processes.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..core.knobs import KnobError


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def world_from_env(env=os.environ) -> World:
    """This rank's place, from torchrun's variables or, under srun, from Slurm's."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return World(
            int(env["RANK"]),
            int(env.get("LOCAL_RANK", 0)),
            int(env["WORLD_SIZE"]),
            int(env.get("GROUP_RANK", 0)),
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return World(
            int(env["SLURM_PROCID"]),
            int(env.get("SLURM_LOCALID", 0)),
            int(env["SLURM_NTASKS"]),
            int(env.get("SLURM_NODEID", 0)),
        )
    return World()


def free_port() -> int:
    """A TCP port nobody listens on now, on this host (for a rendezvous started here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def visible_gpus() -> list[str]:
    """This host's GPUs as CUDA_VISIBLE_DEVICES names them (indices, UUIDs or MIG ids), else
    0..n-1."""
    count = torch.cuda.device_count()
    names = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (
        [n.strip() for n in names.split(",")][:count]
        if names is not None
        else [str(i) for i in range(count)]
    )


def node_gpus(nodes: int, gpus_per_node: int, visible: list[str]) -> list[str]:
    """The CUDA_VISIBLE_DEVICES of each node on this host: its own gpus_per_node of the visible
    GPUs.

    torchrun numbers LOCAL_RANK from 0 on every emulated node, so without a slice of its own each
    node's ranks would land on the first node's GPUs (NCCL: "Duplicate GPU detected"). Ranks beyond
    the GPUs are refused: two ranks on one GPU would measure another job, and NCCL refuses it
    anyway.
    """
    need = nodes * gpus_per_node
    if need > len(visible):
        asked = f"{gpus_per_node} x nodes {nodes}" if nodes > 1 else f"{gpus_per_node}"
        raise KnobError(
            f"knob 'gpus_per_node': value {asked} is more than the {len(visible)} GPU(s) "
            f"visible; allowed: at most {len(visible)} rank(s) on this host, one GPU each"
        )
    return [
        ",".join(visible[node * gpus_per_node : (node + 1) * gpus_per_node])
        for node in range(nodes)
    ]


def rank_device(device_type: str, world: World, gpu_count: int | None = None) -> torch.device:
    """This process's device; a CUDA one always with its index (set_device and init_process_group
    refuse it bare).

    Each node's ranks see their own GPUs (node_gpus; under srun with GPU binding, maybe only their
    own one).
    """
    if device_type != "cuda":
        return torch.device("cpu")
    count = torch.cuda.device_count() if gpu_count is None else gpu_count
    return torch.device("cuda", world.local_rank % count)


def init(world: World, device: torch.device, timeout_s: float = 300) -> None:
    """Join the process group (MASTER_ADDR/MASTER_PORT from the launcher's environment)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if "MASTER_ADDR" not in os.environ and "SLURM_LAUNCH_NODE_IPADDR" in os.environ:
        # under srun: the launcher's node
        os.environ["MASTER_ADDR"] = os.environ["SLURM_LAUNCH_NODE_IPADDR"]
    init_method = None
    # a ddp cell of one rank, started directly
    if world.world_size == 1 and "MASTER_ADDR" not in os.environ:
        init_method = f"tcp://127.0.0.1:{free_port()}"
    dist.init_process_group(
        init_method=init_method,
        backend="nccl" if device.type == "cuda" else "gloo",
        rank=world.rank,
        world_size=world.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )


def gather(obj) -> list:
    """Every rank's `obj`, in rank order (all ranks get the list; rank 0 uses it)."""
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def finish() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def combine_ranks(own: dict, ranks: list[dict]) -> dict:
    """Rank 0's metrics, plus the job-wide throughput and every rank's summary."""
    metrics = dict(own)
    per_rank = [
        {
            "rank": r["rank"],
            "node": r["node"],
            "samples": r["metrics"].get("samples", 0),
            "window_s": r["metrics"].get("window_s"),
            "samples_per_s": r["metrics"].get("samples_per_s"),
            "step_ms_median": r["metrics"].get("step_ms", {}).get("median"),
            "stall_pct": r["metrics"].get("stall_pct"),
            "phases_median_ms": {
                k: v["median_ms"] for k, v in r["metrics"].get("phases", {}).items()
            },
            "comm": r["comm"],
            "torch_threads": r.get("torch_threads"),
        }
        for r in ranks
    ]
    slowest = max(per_rank, key=lambda r: r["window_s"] or 0)
    window_s = slowest["window_s"]
    metrics.update(
        world_size=len(ranks),
        samples=sum(r["samples"] for r in per_rank),
        samples_per_s=sum(r["samples"] for r in per_rank) / window_s if window_s else None,
        tokens_per_s=sum(r["metrics"]["tokens_per_s"] * r["metrics"]["window_s"] for r in ranks)
        / window_s
        if window_s and own.get("tokens_per_s") is not None
        else None,
        slowest_rank=slowest["rank"],
        ranks=per_rank,
    )
    comms = [
        r["comm"]["comm_share"]
        for r in per_rank
        if r["comm"] and r["comm"]["comm_share"] is not None
    ]
    if comms:
        metrics["comm_share"] = max(comms)
    return metrics
