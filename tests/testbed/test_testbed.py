"""The testbed: spec arithmetic, refusal without root, and (as root) real namespaces whose
inter-node link runs at the tc rate, removed afterwards on every exit path."""

from __future__ import annotations

import json
import os
import secrets
import signal
import string
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from realrun import testbed as tbmod
from realrun.testbed import Testbed, TestbedError, TestbedSpec, cleanup, list_namespaces
from realrun.testbed import state as tbstate
from simfed.spec import load_scenario, read_trace

ROOT = Path(__file__).resolve().parents[2]
UNAVAILABLE = tbmod.namespaces_unavailable()
needs_netns = pytest.mark.skipif(UNAVAILABLE is not None,
                                 reason=f"cannot create network namespaces: {UNAVAILABLE}")


def fresh_prefix() -> str:
    """A prefix no other test run uses (engineers run the suite side by side)."""
    return "t" + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))


def ours(prefix: str) -> list[str]:
    return [ns for ns in list_namespaces() if ns.startswith(prefix + "-")]


@pytest.fixture
def prefix(tmp_path, monkeypatch):
    monkeypatch.setattr(tbstate, "STATE_DIR", tmp_path / "state")
    p = fresh_prefix()
    yield p
    if UNAVAILABLE is None:
        cleanup(p)  # never leave anything behind, whatever the test did


# ---- no privileges needed -----------------------------------------------------------------


def test_spec_from_the_testbed_scenario():
    spec = TestbedSpec.from_scenario(load_scenario(ROOT / "scenarios/testbed-tiny.yaml"))
    assert (spec.nodes, spec.ranks_per_node, spec.world) == (2, 2, 4)
    assert spec.rate_Gbps == pytest.approx(0.5)  # nics.bw_Gbps 0.5 x count 1
    assert spec.latency_us == 0.0  # netem is opt-in
    assert spec.node_ip(0) == "10.213.0.1" and spec.node_ip(1) == "10.213.0.2"
    assert spec.node_ifname(1) == "sfb-e1" and spec.node_ns(1) == "sfb-n1"
    assert all(len(spec.port_ifname(i)) <= 15 for i in range(spec.nodes))
    # tbf: the rate in bit/s, a burst of at least 32 KiB
    args = spec.tbf_args()
    assert args[args.index("rate") + 1] == "500000000bit"
    assert int(args[args.index("burst") + 1]) >= 32 * 1024


def test_cpu_sets_hand_out_cores_in_turn():
    avail = sorted(os.sched_getaffinity(0))
    spec = TestbedSpec(nodes=2, rate_Gbps=1, cpu_cores=1)
    if len(avail) >= 2:
        assert spec.cpu_set(0) == (avail[0],) and spec.cpu_set(1) == (avail[1],)
        assert spec.host_cores == 2
    assert TestbedSpec(nodes=3, rate_Gbps=1).cpu_set(2) == tuple(avail)  # 0 = no pinning
    wide = TestbedSpec(nodes=2, rate_Gbps=1, cpu_cores=len(avail) + 5)
    assert wide.cpu_set(1) == tuple(avail)  # more cores than the host has: all of them


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nodes": 0, "rate_Gbps": 1}, "nodes: input should be greater than or equal to 1, got 0"),
    ({"nodes": 65, "rate_Gbps": 1}, "nodes: input should be less than or equal to 64, got 65"),
    ({"nodes": 2.5, "rate_Gbps": 1}, "nodes: input should be a valid integer, got 2.5"),
    ({"nodes": 2, "rate_Gbps": 0}, "rate_Gbps: input should be greater than 0, got 0"),
    ({"nodes": 2, "rate_Gbps": 41}, "rate_Gbps: input should be less than or equal to 40, got 41"),
    ({"nodes": 2, "rate_Gbps": float("nan")}, "rate_Gbps: input should be a finite number"),
    ({"nodes": 2, "rate_Gbps": 1, "prefix": "Bad-Name"},
     "prefix: 'Bad-Name': use 1-8 lowercase letters or digits"),
    ({"nodes": 2, "rate_Gbps": 1, "ranks_per_node": 0},
     "ranks_per_node: input should be greater than or equal to 1, got 0"),
    ({"nodes": 2, "rate_Gbps": 1, "subnet": 256},
     "subnet: input should be less than or equal to 255, got 256"),
    ({"nodes": 2, "rate_Gbps": 1, "cores": 2}, "cores: unknown key; valid keys: cpu_cores,"),
])
def test_bad_spec_is_one_line_error(kwargs, message):
    with pytest.raises(TestbedError) as err:
        TestbedSpec(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_refuses_without_root(monkeypatch, prefix):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    before = list_namespaces() if UNAVAILABLE is None else []
    with pytest.raises(TestbedError, match=r"needs root .* \(euid is 1000\)"):
        Testbed(nodes=2, rate_Gbps=0.5, prefix=prefix).up()
    tiny = str(ROOT / "scenarios/testbed-tiny.yaml")
    result = CliRunner().invoke(tbmod.testbed_group, ["up", tiny, "--prefix", prefix])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: realrun testbed needs root")
    if UNAVAILABLE is None:
        assert list_namespaces() == before


def test_bad_scenario_is_one_line_error(tmp_path, prefix):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: {nodes: 2}\n")
    result = CliRunner().invoke(tbmod.testbed_group, ["up", str(bad), "--prefix", prefix])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "Traceback" not in result.output


# ---- real namespaces (root) ---------------------------------------------------------------

PROBE = r"""
import socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    srv = socket.create_server((host, port))
    srv.settimeout(10)
    print("ready", flush=True)
    conn, _ = srv.accept()
    conn.settimeout(10)
    nbytes, start = 0, None
    while chunk := conn.recv(1 << 20):
        start = start or time.perf_counter()
        nbytes += len(chunk)
    print(nbytes, time.perf_counter() - start, flush=True)
else:
    total = int(sys.argv[4])
    conn = socket.create_connection((host, port), timeout=10)
    buf, sent = bytes(1 << 20), 0
    while sent < total:
        sent += conn.send(buf[: min(len(buf), total - sent)])
    conn.close()
"""


def tcp_rate_Gbps(tb: Testbed, src: int, dst: int, nbytes: int, port: int) -> float:
    """Send `nbytes` over TCP from node src to node dst; the receiver's goodput in Gb/s."""
    ip = tb.spec.node_ip(dst)
    recv = subprocess.Popen(tb.exec_argv(dst, [sys.executable, "-c", PROBE, "recv", ip,
                                               str(port)]),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout is not None and recv.stdout.readline().strip() == "ready"
        subprocess.run(tb.exec_argv(src, [sys.executable, "-c", PROBE, "send", ip, str(port),
                                          str(nbytes)]), check=True, timeout=20)
        out, _ = recv.communicate(timeout=20)
    finally:
        if recv.poll() is None:
            recv.kill()
    got, secs = out.split()
    assert int(got) == nbytes
    return nbytes * 8 / float(secs) / 1e9


@pytest.mark.testbed
@needs_netns
def test_rate_limit_is_in_place_and_everything_is_removed(prefix):
    rate_Gbps = 0.2
    with Testbed(nodes=2, rate_Gbps=rate_Gbps, ranks_per_node=2, prefix=prefix) as tb:
        assert sorted(ours(prefix)) == sorted([f"{prefix}-sw", f"{prefix}-n0", f"{prefix}-n1"])
        st = tb.status()
        assert st["complete"]
        assert [n["addr"] for n in st["nodes"]] == ["10.213.0.1/24", "10.213.0.2/24"]
        for n in st["nodes"]:  # both directions of each node's link are shaped
            assert n["egress"] == ["qdisc tbf rate 200Mbit"]
            assert n["ingress"] == ["qdisc tbf rate 200Mbit"]
        # across nodes: at the tc rate (less Ethernet/IP/TCP headers, ~4%)
        inter = tcp_rate_Gbps(tb, 0, 1, nbytes=5_000_000, port=5201)
        assert 0.80 * rate_Gbps < inter < 1.05 * rate_Gbps, inter
        # within a node (to its own address): loopback, not shaped: well past what the tbf
        # lets through (1.05x), though a loaded host's CPU caps it (0.68 Gb/s seen at load 16)
        intra = tcp_rate_Gbps(tb, 1, 1, nbytes=20_000_000, port=5202)
        assert intra > 2 * rate_Gbps, intra
        # the host's own namespace got nothing: no interface of ours there
        host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert prefix not in host_links
    assert ours(prefix) == []
    assert not tbmod.state_path(prefix).exists()


@pytest.mark.testbed
@needs_netns
def test_removed_when_the_body_raises(prefix):
    with pytest.raises(RuntimeError, match="boom"), \
            Testbed(nodes=3, rate_Gbps=1, prefix=prefix):
        assert len(ours(prefix)) == 4
        raise RuntimeError("boom")
    assert ours(prefix) == []


@pytest.mark.testbed
@needs_netns
def test_down_is_idempotent_and_removes_leftovers(prefix):
    Testbed(nodes=2, rate_Gbps=1, prefix=prefix).up()  # as `testbed up`: stays up
    assert len(ours(prefix)) == 3
    attached = Testbed.attach(prefix)
    assert attached.spec.nodes == 2 and attached.is_up
    # a process left inside a node (as after a crash) is ended too
    sleeper = subprocess.Popen(attached.exec_argv(0, ["sleep", "60"]))
    result = CliRunner().invoke(tbmod.testbed_group, ["down", "--prefix", prefix])
    assert result.exit_code == 0, result.output
    assert f"{prefix}-n0" in result.output
    assert sleeper.wait(timeout=10) != 0
    assert ours(prefix) == []
    again = CliRunner().invoke(tbmod.testbed_group, ["down", "--prefix", prefix])
    assert again.exit_code == 0 and "nothing to remove" in again.output


HOLDER = """
import signal, sys, time
from realrun.testbed import Testbed
# a Ctrl-C raises KeyboardInterrupt even where the runner started us with SIGINT ignored (a
# background job of a non-interactive shell inherits SIG_IGN)
signal.signal(signal.SIGINT, signal.default_int_handler)
with Testbed(nodes=2, rate_Gbps=0.5, prefix=sys.argv[1]):
    print("up", flush=True)
    time.sleep(60)
"""


@pytest.mark.testbed
@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_removed_after_a_signal(prefix, tmp_path, sig):
    env = {**os.environ, "SIMFED_TESTBED_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, prefix], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    assert len(ours(prefix)) == 3
    state = json.loads((tmp_path / "state" / f"{prefix}.json").read_text())
    assert state["held"] and state["pid"] == proc.pid
    proc.send_signal(sig)
    proc.wait(timeout=90)  # tear-down of namespaces can be slow on a loaded host
    if sig == signal.SIGKILL:  # nothing runs on SIGKILL: `down` finds the leftovers by prefix
        assert len(ours(prefix)) == 3
        tbstate.STATE_DIR = tmp_path / "state"
        assert f"{prefix}-sw" in cleanup(prefix)
    elif sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM  # SystemExit from the handler
        assert "Traceback" not in proc.stderr.read()
    else:
        assert proc.returncode != 0  # KeyboardInterrupt
    assert ours(prefix) == []


@pytest.mark.testbed
@needs_netns
def test_a_held_testbed_is_not_replaced(prefix):
    with Testbed(nodes=1, rate_Gbps=1, prefix=prefix):
        state = tbmod.state_path(prefix)
        data = json.loads(state.read_text())
        holder = subprocess.Popen(["sleep", "30"])
        try:
            state.write_text(json.dumps({**data, "pid": holder.pid}))
            with pytest.raises(TestbedError, match=f"in use by running process {holder.pid}"):
                Testbed(nodes=1, rate_Gbps=1, prefix=prefix).up()
        finally:
            holder.kill()
            holder.wait()
        assert len(ours(prefix)) == 2  # the refused attempt touched nothing
    assert ours(prefix) == []


@pytest.mark.testbed
@pytest.mark.slow
@needs_netns
def test_launch_runs_torchrun_on_every_node_and_times_out(prefix, tmp_path):
    out = tmp_path / "bench"
    args = ["--out", str(out), "--sizes", "65536", "--ops", "all_reduce", "--groups",
            "inter,world", "--iters", "2", "--flops", "", "--check-iters", "0"]
    # 2 nodes x 1 rank: each torch process costs ~2.5 s of CPU to start on this 2-core host
    with Testbed(nodes=2, rate_Gbps=0.5, ranks_per_node=1, cpu_cores=1, prefix=prefix) as tb:
        result = tb.launch("realrun.bench_worker", args, timeout_s=120, log_dir=tmp_path / "logs")
        assert result.ok, result.summary() + result.nodes[0].output[-2000:]
        assert result.returncodes == [0, 0]
        assert result.command[:4] == ["ip", "netns", "exec", f"{prefix}-n0"]
        assert "--master-addr" in result.command and "10.213.0.1" in result.command
        metas = [json.loads((out / f"bench-rank{r}.jsonl").read_text().splitlines()[0])["meta"]
                 for r in range(2)]
        assert [m["node"] for m in metas] == [0, 1]
        assert {m["ifname"] for m in metas} == {f"{prefix}-e0", f"{prefix}-e1"}
        assert all(m["network"] == "testbed" and m["link_rate_Gbps"] == 0.5 for m in metas)
        assert all(m["cores"] == 1 for m in metas)  # pinned: 1 core per node
        _, spans = read_trace(out / "bench-rank0.jsonl")
        assert {s.group for s in spans} == {"inter"}  # 1 rank per node: world = inter
        assert all(s.attrs["nodes"] == 2 and s.nbytes == 65536 for s in spans)
        # a job that cannot finish in time is ended, on every node, and reported
        slow = tb.launch("realrun.bench_worker", args, timeout_s=1.0)
        assert slow.timed_out and not slow.ok
        assert "timed out" in slow.summary()
        for i in range(2):
            pids = subprocess.run(["ip", "netns", "pids", tb.spec.node_ns(i)],
                                  capture_output=True, text=True).stdout.split()
            assert pids == []
    assert ours(prefix) == []


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("testbed*.yaml")),
                         ids=lambda p: p.stem)
def test_testbed_scenarios_describe_buildable_testbeds(path):
    scn = load_scenario(path)
    spec = TestbedSpec.from_scenario(scn)
    assert spec.world == scn.cluster.world
    assert 0.1 <= spec.rate_Gbps <= 1.0  # slow enough that the link, not the CPU, limits
    assert spec.cpu_cores >= 1  # the scenario says how many cores a node's ranks share
    assert len(scn.algorithms) == 4


def test_one_torchrun_launcher_for_run_bench_and_the_testbed():
    """realrun run, realrun bench on this host and every testbed node build their command with
    realrun.torchrun.torchrun_argv: standalone on one host, node i of N at node 0's address."""
    from realrun.launch import RunRequest, torchrun_command
    from realrun.torchrun import torchrun_argv

    one = torchrun_argv("realrun.bench_worker", ["--iters", "2"], nproc_per_node=4)
    assert one[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in one and "--master-addr" not in one
    assert one[one.index("--nproc-per-node") + 1] == "4"
    assert one[-4:] == ["-m", "realrun.bench_worker", "--iters", "2"]
    node1 = torchrun_argv("m", nproc_per_node=2, nnodes=2, node_rank=1, master_addr="10.213.0.1",
                          master_port=23456)
    assert "--standalone" not in node1
    assert [node1[node1.index(k) + 1] for k in ("--nnodes", "--node-rank", "--master-addr",
                                                 "--master-port")] == ["2", "1", "10.213.0.1",
                                                                       "23456"]
    with pytest.raises(ValueError, match="2 nodes need a master address"):
        torchrun_argv("m", nproc_per_node=1, nnodes=2)
    req = RunRequest(scenario="s.yaml", algorithm="fsdp", out=Path("o"))
    run_cmd = torchrun_command(req, 4)
    assert run_cmd[:run_cmd.index("-m", 3)] == one[:one.index("-m", 3)]
    assert run_cmd[run_cmd.index("-m", 3):][:3] == ["-m", "realrun.train", "s.yaml"]
    spec = TestbedSpec(nodes=2, rate_Gbps=1, prefix="tx")
    tb = Testbed(spec)
    argv = tb.exec_argv(1, node1)
    assert argv[:4] == ["ip", "netns", "exec", "tx-n1"] and argv[-len(node1):] == node1
