"""Start the project's JupyterLab on localhost for the browser test, isolated and offline.

The server gets a free port, a random token, and fresh config, data, runtime, settings and
workspace folders under a temporary directory, so neither the user's own Jupyter settings
nor a running JupyterLab interfere. News, update checks and the PyPI extension manager are
switched off: the test machine has no network.
"""
from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from _processes import stop_group

#: JupyterLab user settings written for the test (plugin id -> settings).
LAB_SETTINGS = {
    # No news feed and no update check: both would fetch from the internet.
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    # Keep every cell in the DOM, so the test can see every prompt and output.
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_settings(settings_dir: Path) -> None:
    for plugin, values in LAB_SETTINGS.items():
        package, name = plugin.split(":")
        path = settings_dir / package / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=2))


class LabServer:
    """A JupyterLab server process serving ``root_dir``; use :meth:`start` and :meth:`stop`."""

    def __init__(self, root_dir: Path, work_dir: Path, env: dict[str, str]):
        self.root_dir = root_dir
        self.work_dir = work_dir
        self.log_path = work_dir / "jupyterlab.log"
        self.token = secrets.token_hex(16)
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.env = dict(env)
        for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
            folder = work_dir / var.lower()
            folder.mkdir(parents=True, exist_ok=True)
            self.env[var] = str(folder)
        for var in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTERLAB_SETTINGS_DIR",
                    "JUPYTERLAB_WORKSPACES_DIR", "JUPYTER_TOKEN", "JUPYTER_PREFER_ENV_PATH"):
            self.env.pop(var, None)
        self.settings_dir = work_dir / "lab-settings"
        self.workspaces_dir = work_dir / "lab-workspaces"
        write_settings(self.settings_dir)
        self.workspaces_dir.mkdir(exist_ok=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}?token={self.token}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",  # a taken port must fail, not move silently
            f"--IdentityProvider.token={self.token}",
            "--ServerApp.password=",
            f"--ServerApp.root_dir={self.root_dir}",
            "--ServerApp.allow_root=True",  # CI runs as root
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
            f"--LabApp.user_settings_dir={self.settings_dir}",
            f"--LabApp.workspaces_dir={self.workspaces_dir}",
        ]

    def start(self, timeout_s: float = 90.0, attempts: int = 3) -> None:
        """Start the server and wait until its REST API answers."""
        for attempt in range(attempts):
            self.port = free_port()
            with open(self.log_path, "ab") as log:
                log.write(f"\n==== start attempt {attempt + 1}, port {self.port}\n".encode())
                log.flush()
                # A new session makes the server its own process group leader, so the
                # group can be signalled as a whole at the end.
                self.proc = subprocess.Popen(
                    self.command(), cwd=self.root_dir, env=self.env, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
            if self._wait_ready(timeout_s):
                return
            port_taken = "already in use" in self.log_tail()
            self.stop()
            if not port_taken:
                break
        raise RuntimeError(f"JupyterLab did not start; server log tail:\n{self.log_tail()}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with self.api("GET", "api/status", timeout=2) as reply:
                    if reply.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        return False

    def api(self, method: str, path: str, timeout: float = 10.0):
        request = urllib.request.Request(
            f"{self.base_url}/{path}", method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        return urllib.request.urlopen(request, timeout=timeout)

    def kernel_of(self, notebook: str) -> dict | None:
        """The server's record of the kernel of ``notebook`` (a path under the root), or
        None while it has no session."""
        with self.api("GET", "api/sessions") as reply:
            sessions = json.load(reply)
        for session in sessions:
            if session.get("path") == notebook and session.get("kernel"):
                return session["kernel"]
        return None

    def stop(self, grace_s: float = 20.0) -> None:
        """Ask the server to shut down (it stops its kernels first), then make sure its
        process group is gone: SIGTERM, and SIGKILL after a timeout."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.api("POST", "api/shutdown", timeout=5).close()
                self.proc.wait(timeout=grace_s)
            except Exception:  # no answer, or still running after grace_s
                pass
        stop_group(self.proc)
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])
