"""realrun's FSDP2 wrapping (realrun.sharding) on 2 CPU ranks (gloo), against the installed
torch: every decoder block resharded after forward, or (`reshard_last_layer_after_forward:
false`, torchtitan's policy that simfed's FSDP2 program models) the last block kept unsharded
until its backward; the root stays unsharded after forward either way."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from realrun.model import Llama
from realrun.sharding import shard_model
from simfed.spec import load_scenario

from ..conftest import SCENARIOS

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sharded_after_forward(model: Llama) -> list[bool]:
    """Per block, whether its parameters are DTensor shards (resharded) after a forward."""
    model(torch.zeros(1, 16, dtype=torch.long))  # forward only
    return [all(isinstance(p, DTensor) for p in block.parameters())
            for block in model.layers]


def _worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("shard",))
        for keep_last in (False, True):
            scn = load_scenario(SCENARIOS / "cpu4.yaml", {
                "algorithms.fsdp.reshard_last_layer_after_forward": not keep_last})
            torch.manual_seed(0)
            model = Llama(scn.model, 16, torch.device("cpu"))
            settings = shard_model(model, mesh, scn.algorithm("fsdp"))
            assert settings["reshard_last_layer_after_forward"] is (not keep_last)
            sharded = _sharded_after_forward(model)
            n = len(model.layers)
            assert sharded == [True] * (n - 1) + [not keep_last], sharded
            # the root (embedding, norm, head) is not resharded after forward
            assert not isinstance(model.embed.weight, DTensor)
    finally:
        dist.destroy_process_group()
    # Passed: leave without the interpreter's teardown, where a gloo thread the device mesh left
    # joinable now and then aborts the process ("terminate called without an active
    # exception", SIGABRT) after the checks above have passed
    os._exit(0)


@pytest.mark.timeout(120)
def test_the_last_block_is_kept_unsharded_after_forward_when_asked():
    mp.start_processes(_worker, args=(_free_port(),), nprocs=WORLD, join=True,
                       start_method="spawn")
