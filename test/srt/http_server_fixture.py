"""Start a real `python -m sglang.launch_server` for a test module and stop it after.

One server per test module (module-scoped fixtures call `start_server`); the
process runs in its own session so teardown can stop the whole group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

STARTUP_TIMEOUT_S = 300.0
# Keep the KV pool small: several engineers' servers share the machine's memory.
SMALL_SERVER_FLAGS = ["--max-total-tokens", "32768", "--num-threads", "1", "--log-level", "warning"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_dist_port(nnodes: int = 2) -> int:
    """A --dist-init-addr port whose node-link ports (node_link_ports: the port + 100 and
    up) are free too: a free base port alone left them to chance (a client socket's
    ephemeral port there failed a node 0 start with "Address already in use")."""
    from sglang.srt.arg_groups.parallel import node_link_ports

    for _ in range(100):
        port = free_port()
        linked = [p for rank in range(1, nnodes) for p in node_link_ports(port, rank)]
        if all(p < 65536 and _bindable(p) for p in linked):
            return port
    raise RuntimeError("no free --dist-init-addr port with free node-link ports")


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    base_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Signal the server, wait for it; kill the group if it hangs. The exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        _kill_group_quietly(self.proc.pid)
        return self.proc.returncode


def _kill_group_quietly(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start_server(
    model_dir: Path, log_path: Path, *extra: str, env: dict[str, str] | None = None
) -> ServerProcess:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
           "--port", str(port), *SMALL_SERVER_FLAGS, *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        wait_healthy(server)
    except BaseException:
        server.stop(signal.SIGKILL)
        raise
    return server


def wait_healthy(server: ServerProcess, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log()}")
        try:
            if requests.get(server.base_url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"server not healthy after {timeout_s} s:\n{server.log()}")
