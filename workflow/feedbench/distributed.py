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
            int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"]), int(env.get("GROUP_RANK", 0))
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


def rank_device(device_type: str, world: World) -> torch.device:
    if device_type != "cuda":
        return torch.device("cpu")
    # Under srun with GPU binding each task may see only its own GPU(s).
    return torch.device("cuda", world.local_rank % torch.cuda.device_count())


def init(world: World, device: torch.device, timeout_s: float = 300) -> None:
    """Join the process group (MASTER_ADDR/MASTER_PORT from the launcher's environment)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if "MASTER_ADDR" not in os.environ and "SLURM_LAUNCH_NODE_IPADDR" in os.environ:
        os.environ["MASTER_ADDR"] = os.environ["SLURM_LAUNCH_NODE_IPADDR"]  # under srun: the launcher's node
    init_method = None
    if world.world_size == 1 and "MASTER_ADDR" not in os.environ:  # a ddp cell of one rank, started directly
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
