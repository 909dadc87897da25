"""Data-parallel training of a small regression model on CPUs, one rank per Slurm task (srun
starts every rank: rank and world size from SLURM_PROCID and SLURM_NTASKS, the rendezvous on
the job's first node). gloo backend. Debian's PyTorch is built without libuv: run with
USE_LIBUV=0 in the environment. Prints the first and last loss and whether the weights are
identical on all ranks."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 300
BATCH = 256
FEATURES = 64
PORT = int(os.environ.get("DDP_PORT", "29500"))

rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])


def first_node() -> str:
    """The job's first node (MASTER_ADDR, when set, wins)."""
    if master := os.environ.get("MASTER_ADDR"):
        return master
    nodelist = os.environ["SLURM_JOB_NODELIST"]
    argv = ["scontrol", "show", "hostnames", nodelist]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.split()[0]


t0 = time.monotonic()
dist.init_process_group(
    "gloo", init_method=f"tcp://{first_node()}:{PORT}", rank=rank, world_size=world
)

# The same target function on every rank, a different shard of samples on each.
torch.manual_seed(0)
truth = torch.randn(FEATURES, 1)
data = torch.Generator().manual_seed(1000 + rank)
model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
ddp = DistributedDataParallel(model)  # rank 0's initial weights go to every rank
optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
losses = []
for _ in range(STEPS):
    x = torch.randn(BATCH, FEATURES, generator=data)
    loss = nn.functional.mse_loss(ddp(x), x @ truth)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())

flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(gathered, flat)
same = all(torch.equal(gathered[0], g) for g in gathered)
print(
    f"rank {rank}/{world} on {socket.gethostname()}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
    f"weights identical on all ranks: {same}, {time.monotonic() - t0:.1f}s",
    flush=True,
)
dist.destroy_process_group()
