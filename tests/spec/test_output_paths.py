"""Output paths never replace what they point at: a new path or a regular file is written
atomically, a symbolic link is followed (the link stays a link), a character device or FIFO is
written in place, a folder, block device or socket is refused; a failed write leaves no
temporary file. Every command that writes a file is checked against a character device (as
root: `mknod`), a FIFO and a symbolic link."""

import contextlib
import multiprocessing.connection  # noqa: F401 - binds os.write before a test patches it
import os
import select
import socket
import stat
import threading

import pytest
from click.testing import CliRunner

from simfed.cli import main
from simfed.spec import SpecError
from simfed.spec.paths import check_output, write_bytes, write_text_atomic

from ..conftest import ROOT, SCENARIOS

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root (CI "
                               "runs as root)")


def _null_device(path):
    """A character device like /dev/null (major 1, minor 3) at `path`."""
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return path


def _leftovers(folder):
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


# ---- the writer -------------------------------------------------------------------------------
def test_a_new_path_and_a_regular_file_are_written_atomically(tmp_path):
    p = tmp_path / "a" / "b" / "out.json"
    write_text_atomic(p, "one\n")
    assert p.read_text() == "one\n" and stat.S_IMODE(p.stat().st_mode) & 0o044  # not 0600
    os.chmod(p, 0o640)
    inode = p.stat().st_ino
    write_text_atomic(p, "two\n")
    assert p.read_text() == "two\n"
    assert p.stat().st_ino != inode  # replaced by rename, not rewritten in place
    assert stat.S_IMODE(p.stat().st_mode) == 0o640  # its permissions kept
    assert _leftovers(tmp_path) == []


def test_a_symlink_is_followed_and_stays_a_link(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_text_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "later.json")
    write_text_atomic(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "later.json").read_text() == "made"
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(SpecError, match="cannot be followed"):
        check_output(loop, "--json")


@ROOT_ONLY
def test_a_character_device_is_written_in_place(tmp_path):
    dev = _null_device(tmp_path / "null")
    write_text_atomic(dev, "x" * 100_000)
    assert stat.S_ISCHR(os.lstat(dev).st_mode)  # still the device
    link = tmp_path / "to-null"
    link.symlink_to(dev)
    write_text_atomic(link, "y")
    assert link.is_symlink() and stat.S_ISCHR(os.lstat(dev).st_mode)
    assert _leftovers(tmp_path) == []
    check_output(dev, "--json")


def test_a_fifo_is_written_in_place_or_refused_without_a_reader(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="FIFO with no reader"):
        write_text_atomic(fifo, "lost")  # would block forever
    got = []
    opened = threading.Event()

    def reader():
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader before the writer opens
        opened.set()
        data = b""
        try:
            while len(data) < 200_000:
                select.select([fd], [], [], 1.0)
                with contextlib.suppress(BlockingIOError):
                    data += os.read(fd, 65536)
        finally:
            os.close(fd)
            got.append(data)

    t = threading.Thread(target=reader)
    t.start()
    opened.wait(5)
    write_bytes(fifo, b"z" * 200_000)  # more than a pipe buffer: the writer waits for it
    t.join(10)
    assert got == [b"z" * 200_000]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and _leftovers(tmp_path) == []


def test_a_folder_and_a_socket_are_refused(tmp_path):
    with pytest.raises(SpecError, match="is a folder"):
        check_output(tmp_path, "--json")
    sock = tmp_path / "s"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sock))
        with pytest.raises(SpecError, match=r"--json .*is a socket"):
            check_output(sock, "--json")
        with pytest.raises(SpecError, match="is a socket"):
            write_text_atomic(sock, "x")
    finally:
        s.close()
    with pytest.raises(SpecError, match="NUL"):
        check_output("a\x00b", "--json")


@ROOT_ONLY
def test_a_block_device_is_refused(tmp_path):
    blk = tmp_path / "disk"
    os.mknod(blk, 0o600 | stat.S_IFBLK, os.makedev(7, 200))  # a loop device's numbers
    with pytest.raises(SpecError, match=r"--json .*block device"):
        check_output(blk, "--json")
    with pytest.raises(SpecError, match="block device"):
        write_text_atomic(blk, "x")
    assert stat.S_ISBLK(os.lstat(blk).st_mode)


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    p = tmp_path / "out.json"
    p.write_text("good")
    real = os.write

    def full_disk(fd, data):
        if fd > 2:
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_text_atomic(p, "half")
    monkeypatch.setattr(os, "write", real)
    assert p.read_text() == "good" and _leftovers(tmp_path) == []


def test_a_failed_trace_write_leaves_no_tmp_file(tmp_path, monkeypatch):
    """`simfed run --trace` on a full disk: one line, exit 2, no *.tmp left in the folder."""
    real = os.write

    def full_disk(fd, data):
        if fd > 2 and len(data) > 1000:
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    res = CliRunner().invoke(main, ["run", str(SCENARIOS / "cpu4.yaml"), "-q", "--set",
                                    "training.steps=2", "--trace", str(tmp_path / "tr")])
    monkeypatch.setattr(os, "write", real)
    assert res.exit_code == 2, res.output
    assert f"{tmp_path / 'tr'}" in res.output and "No space left on device" in res.output
    assert _leftovers(tmp_path) == []


# ---- every command that writes a file ----------------------------------------------------------
def _special(tmp_path, name, kind):
    """A path of `kind` (device, fifo, link) in `tmp_path` and a check that it is intact."""
    p = tmp_path / name
    if kind == "device":
        _null_device(p)
        return p, lambda: stat.S_ISCHR(os.lstat(p).st_mode)
    if kind == "fifo":
        os.mkfifo(p)
        return p, lambda: stat.S_ISFIFO(os.lstat(p).st_mode)
    target = tmp_path / f"target-{name}"
    target.write_text("old")
    p.symlink_to(target)
    return p, lambda: p.is_symlink() and target.read_bytes() != b"old"


def _invoke(cli, argv):
    res = CliRunner().invoke(cli, argv)
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    return res


H100 = ROOT / "tests" / "fixtures" / "profiler" / "h100.yaml"
NCCL = ROOT / "tests" / "fixtures" / "nccl_tests" / "a3mega-h100-2node-all_reduce_perf.txt"
CPU4 = str(SCENARIOS / "cpu4.yaml")
COMMANDS = {  # name -> argv with {out} for the file written (in the case's folder {dir})
    "run --json": ["run", CPU4, "-q", "--set", "training.steps=2", "--json", "{out}"],
    "run --trace": ["run", CPU4, "-q", "--set", "training.steps=2", "-a", "fsdp", "--trace",
                    "{dir}", "@fsdp.jsonl"],
    "sweep --json": ["sweep", CPU4, "--vary", "training.steps=2,3", "-q", "--json", "{out}"],
    "sweep --csv": ["sweep", CPU4, "--vary", "training.steps=2,3", "-q", "--csv", "{out}"],
    "calibrate --out": ["calibrate", str(NCCL), "--scenario", str(H100), "--out", "{out}",
                        "--report", "{dir}/r.json"],
    "calibrate --report": ["calibrate", str(NCCL), "--scenario", str(H100), "--out",
                           "{dir}/p.yaml", "--report", "{out}"],
    "validate --published --json": ["validate", "--published", str(ROOT / "validation" /
                                                                    "published"),
                                     "--only", "check", "--json", "{out}"],
    "plot --out": ["plot", "phases", CPU4, "--set", "training.steps=2", "--out", "{out}"],
}


@pytest.mark.parametrize("kind", ["device", "fifo", "link"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_command_replaces_a_device_fifo_or_link(tmp_path, command, kind):
    if kind == "device" and os.geteuid() != 0:
        pytest.skip("mknod of a device needs root (CI runs as root)")
    argv = list(COMMANDS[command])
    name = argv.pop()[1:] if argv[-1].startswith("@") else "out.png" if "plot" in command \
        else "out.json"
    path, intact = _special(tmp_path, name, kind)
    res = _invoke(main, [a.replace("{out}", str(path)).replace("{dir}", str(tmp_path))
                         for a in argv])
    if kind == "fifo":  # nobody reads it: refused, not a hang
        assert res.exit_code == 2 and "FIFO with no reader" in res.output, res.output
        assert stat.S_ISFIFO(os.lstat(path).st_mode)
    else:
        assert res.exit_code == 0, res.output
        assert intact(), f"{command} replaced the {kind} {path}"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if c != "run --trace"))
def test_an_empty_output_path_is_refused_by_every_command(tmp_path, monkeypatch, command):
    # plot took --out '' as 'not given' and wrote its default name in the current folder
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{out}", "").replace("{dir}", str(tmp_path)) for a in COMMANDS[command]]
    res = _invoke(main, argv)
    assert res.exit_code == 2 and "an empty path" in res.output, res.output
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".png", ".svg", ".json", ".csv",
                                                              ".yaml")]


@ROOT_ONLY
def test_figures_and_realrun_converge_write_a_device_in_place(tmp_path):
    from realrun.cli import main as realrun

    dev = _null_device(tmp_path / "null.json")
    res = _invoke(realrun, ["converge", CPU4, "-a", "fsdp", "--set", "training.steps=1",
                            "--set", "training.eval_sequences=4", "--json", str(dev)])
    assert res.exit_code == 0, res.output
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    figs = tmp_path / "figs"
    figs.mkdir()
    png = _null_device(figs / "cpu4_phases.png")
    res = _invoke(main, ["figures", "--scenario", CPU4, "--out", str(figs), "--only", "phases",
                         "-q"])
    assert res.exit_code == 0, res.output
    assert stat.S_ISCHR(os.lstat(png).st_mode) and _leftovers(tmp_path) == []


@ROOT_ONLY
def test_realrun_summaries_and_the_study_file_write_a_device_in_place(tmp_path):
    """realrun run's summary.json, bench's bench-summary.json and converge-study's result
    files go through the same writer."""
    from realrun.convergence_study import write_json_atomic

    dev = _null_device(tmp_path / "summary.json")
    write_json_atomic(dev, {"a": 1})
    write_text_atomic(dev, "{}")
    assert stat.S_ISCHR(os.lstat(dev).st_mode)


def test_a_streamed_trace_into_a_fifo_without_a_reader_fails_at_once(tmp_path):
    """realrun's ranks stream their traces (TraceWriter): a FIFO left at a trace's path with
    nobody reading is an error at open, not a rank blocked until the run's timeout."""
    import errno

    from simfed.spec.trace import TraceWriter

    fifo = tmp_path / "trace_rank0.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as exc:
        TraceWriter(fifo, {"rank": 0})
    assert exc.value.errno == errno.ENXIO
    with TraceWriter(tmp_path / "t.jsonl", {"rank": 0}):  # a regular file as before
        pass
    assert (tmp_path / "t.jsonl").read_text().startswith('{"meta":{"rank":0}')


def test_calibrate_to_a_device_needs_its_report_named(tmp_path):
    """The report's default path is OUT.json: beside a device there is no such file to write
    (it would land in /dev). Refused before any input is read."""
    res = _invoke(main, ["calibrate", str(NCCL), "--scenario", str(H100), "--out", "/dev/null"])
    assert res.exit_code == 2, res.output
    assert "--report: --out /dev/null is not a regular file" in res.output
    assert not os.path.exists("/dev/null.json")
    res = _invoke(main, ["calibrate", str(NCCL), "--scenario", str(H100), "--out", "/dev/null",
                         "--report", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r.json").is_file()
