"""A real multi-node Ray cluster on this one machine, for tests and benchmarks.

``ray start --head`` and ``ray start --address`` each with a temp dir and ports of their
own (so nothing collides with another Ray on the machine), stopped by pid: every process
naming one of our temp dirs, plus each raylet's children (the actors and agents, which
rename themselves "ray::..."), recorded while the raylet lives because they outlive it
as orphans. Never ``ray stop``, which would end every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psutil

RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")
START_TIMEOUT = 120  # seconds for one `ray start` on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _other_ports() -> list[str]:
    # fixed defaults (dashboard agent 52365, metrics, runtime env agent) would collide between nodes
    return [
        f"--object-manager-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
    ]


class Node:
    def __init__(self, temp_dir: str, resources: dict):
        self.temp_dir, self.resources = temp_dir, resources
        self.raylet_port = free_port()  # how the driver tells this node from the others in ray.nodes()
        self.raylet: psutil.Process | None = None
        self.children: list[psutil.Process] = []

    def node_id(self, timeout: float = 60) -> str:
        """This node's id once the connected driver sees it alive (a joined node registers asynchronously)."""
        import ray

        deadline = time.monotonic() + timeout
        while True:
            for node in ray.nodes():
                if node["Alive"] and int(node["NodeManagerPort"]) == self.raylet_port:
                    return node["NodeID"]
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node in {self.temp_dir} is not alive after {timeout}s: {ray.nodes()}")
            time.sleep(0.2)

    def raylet_alive(self) -> bool:
        try:
            return self.raylet is not None and self.raylet.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def processes(self) -> list[psutil.Process]:
        """This node's processes now: those naming its temp dir, and the raylet's children."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            if self.temp_dir in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        if self.raylet is not None:
            try:
                self.children += [c for c in self.raylet.children(recursive=True) if c not in self.children]
            except psutil.Error:
                pass
        return found + [c for c in self.children if c not in found]

    def find_raylet(self) -> psutil.Process:
        for proc in self.processes():
            try:
                if os.path.basename(proc.cmdline()[0]) == "raylet":
                    return proc
            except (psutil.Error, IndexError):
                continue
        raise RuntimeError(f"no raylet found for the node in {self.temp_dir}")

    def kill_raylet(self) -> None:
        """The node dies as a machine would: its raylet first (its workers exit when it goes)."""
        self.processes()  # record the raylet's children before they become orphans
        self.raylet.kill()

    def kill(self) -> None:
        for proc in self.processes():
            try:
                proc.kill()
            except psutil.Error:
                pass


class LocalCluster:
    """A head of ``head_cpus`` CPUs; ``add_node`` joins more. Use as a context manager."""

    def __init__(self, head_cpus: int = 1, head_resources: dict | None = None, env: dict | None = None):
        self.port = free_port()
        self.env = {**os.environ, **(env or {})}
        self.nodes: list[Node] = []
        self.address = f"127.0.0.1:{self.port}"
        head = [
            "--head",
            f"--port={self.port}",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
        ]
        try:
            self._start(head, head_cpus, head_resources or {})
        except BaseException:
            self.stop()
            raise

    def add_node(self, num_cpus: int = 1, resources: dict | None = None) -> Node:
        return self._start([f"--address={self.address}"], num_cpus, resources or {})

    def _start(self, role: list[str], num_cpus: int, resources: dict) -> Node:
        node = Node(tempfile.mkdtemp(prefix="sfr"), resources)  # short: socket paths must fit in 107 bytes
        self.nodes.append(node)  # before starting: a start that fails half-way is stopped too
        args = [
            RAY_CLI,
            "start",
            *role,
            f"--temp-dir={node.temp_dir}",
            f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources)}",
            "--disable-usage-stats",
            f"--node-manager-port={node.raylet_port}",
            *_other_ports(),
        ]
        done = subprocess.run(args, capture_output=True, text=True, timeout=START_TIMEOUT, env=self.env)
        if done.returncode != 0:
            raise RuntimeError(f"ray start failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        node.raylet = node.find_raylet()
        return node

    @property
    def head(self) -> Node:
        return self.nodes[0]

    def stop(self) -> None:
        for node in reversed(self.nodes):  # workers first, the head (GCS) last
            node.kill()
        deadline = time.monotonic() + 20
        for node in self.nodes:
            for proc in node.processes():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except (psutil.Error, psutil.TimeoutExpired):
                    pass
            shutil.rmtree(node.temp_dir, ignore_errors=True)

    def leftovers(self) -> list[int]:
        """Pids of this cluster's processes still running (none, after stop())."""
        alive = []
        for node in self.nodes:
            for proc in node.processes():
                try:
                    if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                        alive.append(proc.pid)
                except psutil.Error:
                    pass
        return alive

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
