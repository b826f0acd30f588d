"""Executors: a local process pool, Dask or Ray; each yields (task index, result) as tasks
finish."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ..spec import SpecError

# (scenario file or its data, overrides, algorithms)
Task = tuple["str | dict[str, Any]", dict[str, Any], tuple[str, ...]]
Executor = Callable[[Callable[..., Any], list[Task], int, "str | None"], Iterator[tuple[int, Any]]]


def _local(fn: Callable[..., Any], tasks: list[Task], jobs: int,
           address: str | None) -> Iterator[tuple[int, Any]]:
    """A process pool on this machine. On Linux the workers are forked at once, before any
    progress-bar thread exists (fast, and no `if __name__ == "__main__"` guard needed in
    scripts); elsewhere they are spawned."""
    if address:
        raise SpecError("--address is for --executor dask or ray, not local")
    if jobs <= 1 or len(tasks) <= 1:
        return ((i, fn(*t)) for i, t in enumerate(tasks))
    import multiprocessing
    import sys
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if sys.platform.startswith("linux") else "spawn"
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context(method))
    try:
        futures = {pool.submit(fn, *t): i for i, t in enumerate(tasks)}
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    return _drain_pool(pool, futures)


def _drain_pool(pool: Any, futures: dict[Any, int]) -> Iterator[tuple[int, Any]]:
    from concurrent.futures import as_completed

    try:
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _dask(fn: Callable[..., Any], tasks: list[Task], jobs: int,
          address: str | None) -> Iterator[tuple[int, Any]]:
    """Dask distributed: the scheduler at `address`, or a local cluster of `jobs` processes."""
    try:
        import logging

        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise SpecError("--executor dask needs the 'distributed' extra: "
                        "pip install 'simfed[distributed]'") from None
    cluster = None
    if address:
        client = Client(address)
    else:
        cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
    try:
        tag = uuid.uuid4().hex[:8]
        futures = [client.submit(fn, *t, key=f"simfed-point-{tag}-{i}", pure=False)
                   for i, t in enumerate(tasks)]
        index = {f.key: i for i, f in enumerate(futures)}
        for fut in as_completed(futures):
            yield index[fut.key], fut.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _ray(fn: Callable[..., Any], tasks: list[Task], jobs: int,
         address: str | None) -> Iterator[tuple[int, Any]]:
    """Ray: the cluster at `address`, or a local one with `jobs` CPUs."""
    try:
        import ray
    except ImportError:
        raise SpecError("--executor ray needs Ray: pip install 'ray[default]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address or None, num_cpus=None if address else jobs,
                 include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1)(fn)
        refs = {remote.remote(*t): i for i, t in enumerate(tasks)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield refs[ref], ray.get(ref)
    finally:
        if started:
            ray.shutdown()


EXECUTORS: dict[str, Executor] = {"local": _local, "dask": _dask, "ray": _ray}


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


