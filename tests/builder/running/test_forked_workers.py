"""``--workers N`` builds fork their SDK workers from one process that imported Beam once
(tfrbeam/builder/running/forked_workers.py)."""

from __future__ import annotations

import ast
import contextlib
import os
import pathlib
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from tfrbeam.builder.running import fork_server_process
from tfrbeam.builder.running.fork_server_process import (
    CLIENT_SCRIPT,
    WorkerForkServer,
    command_line_forks_workers,
    start_early_server,
)
from tfrbeam.builder.running.forked_workers import forks_workers
from tfrbeam.builder.running.runners import choose_workers
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.demo_data import write_demo_data

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO_ROOT / "configs" / "demo.yaml"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers are Linux only")


def _choice(*args: str):
    options = PipelineOptions(list(args))
    return options, choose_workers(options, 1 << 40, cores=2, ram_bytes=64 << 30)


def test_only_workers_of_the_workers_option_on_the_fnapirunner_are_forked():
    assert forks_workers(*_choice("--workers=2", "--runner=FnApiRunner"))  # tfrbeam build's default runner
    assert not forks_workers(*_choice("--direct_num_workers=2", "--direct_running_mode=multi_processing",
                                      "--runner=FnApiRunner"))  # Beam's own options: Beam's own workers
    assert not forks_workers(*_choice("--workers=1", "--runner=FnApiRunner"))
    assert not forks_workers(*_choice("--workers=2", "--runner=DirectRunner"))  # Beam picks the DirectRunner's engine


def _shard_bytes(output: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(output)): path.read_bytes() for path in sorted(output.rglob("*.tfrecord"))}


def _demo_with_a_client_that_logs(tmp_path: pathlib.Path, monkeypatch) -> pathlib.Path:
    """The demo data in ``tmp_path`` (the cwd now), and a fork client that first logs the socket it asks, one line a
    worker, to the file returned."""
    monkeypatch.chdir(tmp_path)
    write_demo_data(tmp_path / "demo_data")
    calls = tmp_path / "client-calls.txt"
    wrapper = tmp_path / "client.py"
    wrapper.write_text(
        "import os, sys\n"
        f"with open({str(calls)!r}, 'a') as log: log.write(sys.argv[1] + '\\n')\n"
        f"os.execv(sys.executable, [sys.executable, '-S', {CLIENT_SCRIPT!r}, *sys.argv[1:]])\n")
    monkeypatch.setattr(fork_server_process, "CLIENT_SCRIPT", str(wrapper))
    return calls


def test_a_workers_2_build_forks_both_workers_and_writes_the_in_process_bytes(tmp_path, monkeypatch):
    """Each of the 2 SDK workers Beam asks for comes through the fork client (it leaves a line), none is started as
    ``sdk_worker_main``, and the shards are the in-process build's."""
    calls = _demo_with_a_client_that_logs(tmp_path, monkeypatch)
    common = [str(DEMO_CONFIG), "--quiet", "--set", "shuffle.seed=3"]
    servers_before = set(pathlib.Path(tempfile.gettempdir()).glob("tfrbeam-workers-*"))
    assert build_main([*common, "--set", "output.path=out/one"]) == 0
    assert build_main([*common, "--set", "output.path=out/two", "--workers=2"]) == 0
    assert len(calls.read_text().splitlines()) == 2
    assert set(pathlib.Path(tempfile.gettempdir()).glob("tfrbeam-workers-*")) == servers_before  # its socket dir went
    one, two = _shard_bytes(tmp_path / "out" / "one"), _shard_bytes(tmp_path / "out" / "two")
    assert one and one == two


def test_the_command_line_alone_says_when_the_fork_server_can_start_before_beam_is_imported():
    assert command_line_forks_workers(["c.yaml", "--workers", "2"])
    assert command_line_forks_workers(["c.yaml", "--workers=4", "--runner=FnApiRunner", "--set", "shuffle.seed=1"])
    assert command_line_forks_workers(["c.yaml", "--workers", "1", "--workers", "2"])  # the last one counts
    assert not command_line_forks_workers(["c.yaml"])  # auto: the plan decides from the input's size
    assert not command_line_forks_workers(["c.yaml", "--workers", "auto"])
    assert not command_line_forks_workers(["c.yaml", "--workers", "1"])
    assert not command_line_forks_workers(["c.yaml", "--workers", "two"])
    assert not command_line_forks_workers(["c.yaml", "--workers", "\u00b2"])  # a digit to str.isdigit, not to int
    assert not command_line_forks_workers(["c.yaml", "--workers", "-3"])
    assert not command_line_forks_workers(["c.yaml", "--workers"])
    assert not command_line_forks_workers(["c.yaml", "--workers", "2", "--runner", "DirectRunner"])
    assert not command_line_forks_workers(["c.yaml", "--workers", "2", "--direct_running_mode=multi_processing"])
    assert not command_line_forks_workers(["c.yaml", "--workers", "2", "--dry-run"])
    assert not command_line_forks_workers(["c.yaml", "--workers", "2", "--dry_run=True"])
    assert not command_line_forks_workers(["--help", "--workers", "2"])


def _children_of(pid: int) -> list[int]:
    """The pids of the live (or not yet reaped) children of process ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if int(pathlib.Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
    return found


def _snapshot(root: pathlib.Path) -> dict[str, bytes | str]:
    """Every path under ``root``: a file's bytes, "dir" for a directory."""
    return {str(path.relative_to(root)): "dir" if path.is_dir() else path.read_bytes() for path in root.rglob("*")}


def _fork_servers_of_this_process() -> list[int]:
    """The pids of this process's children that run the fork server."""
    found = []
    for child in _children_of(os.getpid()):
        with contextlib.suppress(OSError):
            if b"forked_worker_server" in pathlib.Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
    return found


def test_the_fork_server_started_before_beam_serves_the_build_it_was_started_for(tmp_path, monkeypatch):
    """``tfrbeam build --workers 2``: both workers come from the server started for the command line, which ends
    with the build (no process, no socket dir left)."""
    sockets = _demo_with_a_client_that_logs(tmp_path, monkeypatch)
    servers_before = set(pathlib.Path(tempfile.gettempdir()).glob("tfrbeam-workers-*"))
    argv = [str(DEMO_CONFIG), "--quiet", "--set", "output.path=out", "--workers", "2"]
    start_early_server(argv)
    early = fork_server_process._early
    assert early is not None and early.running
    assert build_main(argv) == 0
    assert sockets.read_text().splitlines() == [early.socket_path] * 2
    assert fork_server_process._early is None and not early.running
    assert set(pathlib.Path(tempfile.gettempdir()).glob("tfrbeam-workers-*")) == servers_before
    assert _fork_servers_of_this_process() == []


@pytest.mark.parametrize("failure", ["config", "locked"])
def test_a_build_that_fails_before_its_pipeline_stops_the_fork_server_started_for_it(tmp_path, monkeypatch, failure):
    """A config error (exit 2) or an output another build holds (exit 1): the early server is stopped at once."""
    from tfrbeam.beam.publish import OutputLock
    from tfrbeam.builder.config import load_config
    from tfrbeam.builder.pipeline.plan import plan_build
    from tfrbeam.cli.main import main as tfrbeam_main

    monkeypatch.chdir(tmp_path)
    write_demo_data(tmp_path / "demo_data")
    servers_before = set(pathlib.Path(tempfile.gettempdir()).glob("tfrbeam-workers-*"))
    if failure == "config":
        argv, expected = ["build", str(tmp_path / "missing.yaml"), "--quiet", "--workers", "2"], 2
        held = None
    else:
        argv, expected = ["build", str(DEMO_CONFIG), "--quiet", "--set", "output.path=out", "--workers", "2"], 1
        other = plan_build(load_config(str(DEMO_CONFIG), ["output.path=out"]), PipelineOptions([]))
        held = OutputLock(other.output_root, other.run).acquire()
    try:
        assert tfrbeam_main(argv) == expected
    finally:
        if held is not None:
            held.release()
    assert fork_server_process._early is None
    assert _fork_servers_of_this_process() == []
    assert set(pathlib.Path(tempfile.gettempdir()).glob("tfrbeam-workers-*")) == servers_before


_LOGGING_CLIENT = """
import os, sys
server = sys.argv[2]
with open(os.environ["CLIENT_LOG"], "a") as log:
    command = open(f"/proc/{server}/cmdline", "rb").read().decode().replace("\\0", " ").strip()
    parent = open(f"/proc/{server}/stat").read().rsplit(")", 1)[1].split()[1]
    log.write(f"{server}|{parent}|{command}\\n")
os.execv(sys.executable, [sys.executable, "-S", os.environ["REAL_CLIENT"], *sys.argv[1:]])
"""

_BUILD_WITH_LOGGING_CLIENT = """
import os, runpy, sys
from tfrbeam.builder.running import fork_server_process
from tfrbeam.builder.running import forked_worker_server
fork_server_process.CLIENT_SCRIPT = os.environ["LOGGING_CLIENT"]
if os.environ.get("BREAK_SERVER"):  # the server fails before it listens: forked (as it imports) or started anew
    forked_worker_server.PRELOADED = ("tfrbeam_no_such_module",)
    fork_server_process.SERVER_MODULE = "tfrbeam_no_such_module"
print(os.getpid(), flush=True)
sys.argv = ["tfrbeam.builder", *sys.argv[1:]]
runpy.run_module(os.environ.get("BUILD_MODULE", "tfrbeam.builder"), run_name="__main__")
"""


def _run_build_process(tmp_path: pathlib.Path, *arguments: str, temp_dir: pathlib.Path | None = None,
                       timeout: float = 300, **environ: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``python -m tfrbeam.builder`` (through a driver that only points Beam's worker command at a client that first
    logs the fork server's pid, parent pid and command line) in ``tmp_path``, with a temp dir of its own."""
    temp_dir = temp_dir or tmp_path / "tmp"
    temp_dir.mkdir(exist_ok=True)
    client, driver = tmp_path / "logging_client.py", tmp_path / "driver.py"
    client.write_text(_LOGGING_CLIENT)
    driver.write_text(_BUILD_WITH_LOGGING_CLIENT)
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(temp_dir),
                   "CLIENT_LOG": str(tmp_path / "client.log"),
                   "REAL_CLIENT": CLIENT_SCRIPT, "LOGGING_CLIENT": str(client), **environ}
    done = subprocess.run([sys.executable, str(driver), *arguments], cwd=tmp_path,
                          env=environment, capture_output=True, text=True, timeout=timeout)
    log = tmp_path / "client.log"
    return done, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("module", ["tfrbeam.builder", "pipelines.build_dataset"])
def test_the_command_forks_its_fork_server_from_itself_once_beam_is_imported(tmp_path, module):
    """``python -m tfrbeam.builder --workers 2`` (and the pipelines launcher): the server both workers come from is the
    launching process forked (its child, with its command line: no new interpreter imports Beam again), and the
    shards are the in-process build's; nothing of the server is left after it."""
    write_demo_data(tmp_path / "demo_data")
    common = [str(DEMO_CONFIG), "--quiet", "--set", "shuffle.seed=3"]
    done, calls = _run_build_process(tmp_path, *common, "--set", "output.path=out/two", "--workers", "2",
                                     BUILD_MODULE=module)
    assert done.returncode == 0, done.stderr
    launcher = done.stdout.split()[0]
    assert len(calls) == 2 and len(set(calls)) == 1, calls
    server, parent, command = calls[0].split("|")
    assert parent == launcher
    assert "forked_worker_server" not in command and command.startswith(f"{sys.executable} {tmp_path / 'driver.py'} ")
    assert list((tmp_path / "tmp").iterdir()) == []  # its socket dir went
    assert not os.path.exists(f"/proc/{server}")
    in_process, _ = _run_build_process(tmp_path, *common, "--set", "output.path=out/one")
    assert in_process.returncode == 0, in_process.stderr
    one, two = _shard_bytes(tmp_path / "out" / "one"), _shard_bytes(tmp_path / "out" / "two")
    assert one and one == two


def test_a_command_that_fails_before_its_pipeline_stops_the_server_it_forked(tmp_path):
    """A config error of ``python -m tfrbeam.builder --workers 2`` (exit 2): no server process and no socket dir left."""
    done, calls = _run_build_process(tmp_path, str(tmp_path / "missing.yaml"), "--quiet", "--workers", "2")
    assert done.returncode == 2 and "missing.yaml" in done.stderr
    assert calls == [] and list((tmp_path / "tmp").iterdir()) == []
    launcher = done.stdout.split()[0]
    assert _children_of(int(launcher)) == []


def test_a_temp_dir_deeper_than_a_socket_address_holds_still_gets_its_workers(tmp_path):
    """TMPDIR whose fork socket path is over the ~107 bytes of an AF_UNIX address (as pytest's own temp dirs can be):
    the server and its clients reach the socket through its directory; the build ran its 2 workers (it hung)."""
    write_demo_data(tmp_path / "demo_data")
    deep = tmp_path / ("deep-" * 20)
    assert len(str(deep / "tfrbeam-workers-xxxxxxxx" / "fork.sock")) > 108
    done, calls = _run_build_process(tmp_path, str(DEMO_CONFIG), "--quiet", "--set", "output.path=out", "--workers", "2",
                                     temp_dir=deep, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(calls) == 2
    assert list(deep.iterdir()) == []


def test_a_fork_server_that_cannot_start_fails_the_build_in_one_line(tmp_path):
    """The server fails while it imports: the build stops with exit 1 and a line that names the server and says what
    to run instead (Beam's runner waited for ever for the workers), and leaves no process or socket dir: the directory
    it ran in holds what it held (its inputs unchanged), and only the test harness's own files besides."""
    write_demo_data(tmp_path / "demo_data")
    before = _snapshot(tmp_path)
    done, calls = _run_build_process(tmp_path, str(DEMO_CONFIG), "--quiet", "--set", "output.path=out", "--workers", "2",
                                     timeout=120, BREAK_SERVER="1")
    harness = {name: _snapshot(tmp_path)[name] for name in ("driver.py", "logging_client.py", "tmp")}
    assert _snapshot(tmp_path) == {**before, **harness} and harness["tmp"] == "dir"
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(("tfrbeam build: ", "tfrbeam: ")), last
    assert "fork server ended with exit status 1" in last and "--workers 1" in last, last
    assert "No module named 'tfrbeam_no_such_module'" in done.stderr  # the server's own error, above
    assert calls == [] and list((tmp_path / "tmp").iterdir()) == [] and not (tmp_path / "out").exists()
    assert _children_of(int(done.stdout.split()[0])) == []


_FORKING_LAUNCHER = """
import os, sys, time
from tfrbeam.builder.running.fork_server_process import WorkerForkServer
held = open(sys.argv[1], "w")  # as the output's lock is, in a build
server = WorkerForkServer(fork_this_process=True)
deadline = time.monotonic() + 60
while not os.path.exists(server.socket_path) and time.monotonic() < deadline:
    time.sleep(0.02)
print(server.forked, sorted(os.readlink(f"/proc/{server._process.pid}/fd/{fd}")
                            for fd in os.listdir(f"/proc/{server._process.pid}/fd")), flush=True)
server.close()
print(server.running, os.path.exists(os.path.dirname(server.socket_path)), flush=True)
"""


def test_a_forked_server_keeps_none_of_the_launchers_files_and_stops_when_closed(tmp_path):
    """Forked from a process that holds a file open (the output's lock, in a build): the server has only its stdin,
    stdout, stderr and its sockets; ``close`` ends it and removes its socket dir."""
    held = tmp_path / "held"
    done = subprocess.run([sys.executable, "-c", _FORKING_LAUNCHER, str(held)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    forked, files = first.split(" ", 1)
    assert forked == "True"
    targets = ast.literal_eval(files)  # what each of the server's file descriptors is open on
    assert str(held) not in targets
    assert all(target == "/dev/null" or target.startswith(("pipe:", "socket:")) for target in targets), targets
    assert second == "False False"


def test_a_process_with_another_thread_starts_the_server_as_a_new_interpreter():
    """Forking a process whose other threads may hold locks is not safe: the server is then started anew."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        with WorkerForkServer(fork_this_process=True) as server:
            assert not server.forked
            server.wait_until_listening()  # (a process just exec'd can show an empty cmdline for a moment)
            command = pathlib.Path(f"/proc/{server._process.pid}/cmdline").read_bytes()
            assert b"forked_worker_server" in command
    finally:
        stop.set()
        other.join()


def _load_client():
    """The client script's functions, loaded without running it."""
    return runpy.run_path(CLIENT_SCRIPT)


def test_the_client_fails_in_one_line_when_no_fork_server_answers(tmp_path, capsys):
    client = _load_client()
    client["request_worker"].__globals__["CONNECT_SECONDS"] = 0.2
    assert client["request_worker"](["client", str(tmp_path / "no-server.sock"), str(os.getpid())]) == 1
    assert "did not answer" in capsys.readouterr().err


def test_the_client_fails_at_once_when_the_fork_server_has_ended(tmp_path, capsys):
    """A server that died while importing: the client does not wait out its connect timeout."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    client = _load_client()
    started = time.monotonic()
    assert client["request_worker"](["client", str(tmp_path / "no-server.sock"), str(ended.pid)]) == 1
    assert time.monotonic() - started < 5
    assert "has ended" in capsys.readouterr().err


def test_a_forked_worker_that_fails_gives_its_exit_status_to_the_client(tmp_path, capfd):
    """A worker with no control endpoint to reach fails; Beam's command (the client) exits with that failure."""
    with WorkerForkServer() as server:
        environment = {key: value for key, value in os.environ.items()
                       if key not in ("CONTROL_API_SERVICE_DESCRIPTOR", "LOGGING_API_SERVICE_DESCRIPTOR")}
        done = subprocess.run(server.worker_command(), shell=True, env=environment, capture_output=True, timeout=120)
        assert done.returncode != 0
    # The worker's own traceback says what it missed, on the launcher's stderr (as Beam's own workers write theirs).
    assert "KeyError: 'CONTROL_API_SERVICE_DESCRIPTOR'" in capfd.readouterr().err


_ORPHANING_LAUNCHER = """
import sys, time
from tfrbeam.builder.running.fork_server_process import WorkerForkServer
server = WorkerForkServer(fork_this_process=sys.argv[1] == "forked")
print(server._process.pid, server.socket_path, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("started", ["forked", "new interpreter"])
def test_the_fork_server_leaves_with_its_launcher_and_removes_its_socket(started):
    """kill -9 of the process that started it: the server is sent SIGTERM by the kernel, exits, removes its socket dir."""
    launcher = subprocess.Popen([sys.executable, "-c", _ORPHANING_LAUNCHER, started], cwd=REPO_ROOT,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        server_pid, socket_path = launcher.stdout.readline().split()
        deadline = time.monotonic() + 60
        while not os.path.exists(socket_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(socket_path), "the fork server never listened"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{server_pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{server_pid}"), "the fork server outlived its launcher"
        assert not os.path.exists(os.path.dirname(socket_path))
    finally:
        if launcher.poll() is None:
            launcher.kill()
