"""Two "nodes" on one machine, made of Linux namespaces (tests/python/test_two_nodes.py).

Each node is one ``unshare`` process tree with its own

- network namespace: one end of a veth pair named ``eth0`` (10.77.0.1/24 and 10.77.0.2/24, addresses
  that exist only inside these two namespaces) and its own loopback; nothing else is reachable;
- mount namespace: a private tmpfs on /dev/shm (so its own budget ledger and segments), its own
  /etc/hosts naming both nodes (torchrun's c10d rendezvous and gloo look the peers' hostnames up),
  and /mnt holding bind mounts of the test's folders (readable by an unprivileged uid, which cannot
  traverse root's 0700 pytest folders);
- UTS namespace (its hostname), IPC namespace and pid namespace (with its own /proc): the node's
  processes see only each other, as on a real host.

Commands run in a node through ``nsenter``. Nothing outlives the harness: each node's ``unshare``
runs under ``setpriv --pdeathsig KILL`` and with ``--kill-child``, so when the harness's process dies
(or :meth:`Nodes.close` SIGKILLs it) the node's pid 1 dies, the kernel kills every process of its pid
namespace, and the network namespace goes with them, taking the veth pair along. No name is left in
/run/netns, no interface in the machine's own namespace.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SUBNET = "10.77.0"
TOOLS = ("unshare", "nsenter", "setpriv", "ip", "mount", "hostname")

# pid 1 of a node: set it up, report, wait for the veth end, configure it, then reap forever.
INIT = r'''
set -eu
name=$1 address=$2 ctl=$3
mount -t tmpfs -o mode=1777,size=512m spindle-node-shm /dev/shm
mount --bind "$ctl/hosts" /etc/hosts
mount -t tmpfs -o mode=755 spindle-node-mnt /mnt
shift 3
while [ $# -gt 0 ]; do            # pairs: name under /mnt, folder to bind there
  mkdir -p "/mnt/$1" && mount --bind "$2" "/mnt/$1"
  shift 2
done
hostname "$name"
touch "$ctl/$name.up"
for _ in $(seq 500); do [ -e "$ctl/link" ] && break; sleep 0.02; done
ip link set lo up
ip addr add "$address/24" dev eth0
ip link set eth0 up
touch "$ctl/$name.net"
while true; do sleep 3600 & wait $! || true; done
'''


class NamespacesRefused(RuntimeError):
    """The kernel (or a missing tool) refused to make the nodes; the message says which and why."""


@dataclass
class Node:
    name: str
    address: str
    process: subprocess.Popen  # setpriv -> unshare, in this (the machine's) pid namespace
    init_pid: int = 0  # the node's pid 1, as this namespace numbers it

    def command(self, argv: list[str], *, uid: Optional[int] = None, cwd: str = "/mnt") -> list[str]:
        """`argv` run inside the node (as `uid` if given: real and effective uid and gid, no groups)."""
        inner = list(argv)
        if uid is not None:
            inner = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *inner]
        return ["nsenter", f"--target={self.init_pid}", "--net", "--mount", "--uts", "--ipc", "--pid",
                f"--wd={cwd}", "--", *inner]

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=30, **kw)


class Nodes:
    """Two (or more) nodes joined by veth pairs in a chain; `binds` are folders bound under /mnt/<name>
    in every node. Use as a context manager; `close()` is idempotent."""

    def __init__(self, ctl: Path, binds: dict[str, str], count: int = 2) -> None:
        self.ctl = ctl
        self.binds = binds
        self.count = count
        self.nodes: list[Node] = []

    def __enter__(self) -> "Nodes":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise NamespacesRefused(f"making network, mount and pid namespaces needs root (this is uid {os.geteuid()})")
        missing = [t for t in TOOLS if shutil.which(t) is None]
        if missing:
            raise NamespacesRefused(f"missing tools: {', '.join(missing)} (Debian packages util-linux, iproute2)")
        assert self.count == 2, "one veth pair joins two nodes"
        self.ctl.mkdir(parents=True, exist_ok=True)
        names = [f"node-{chr(ord('a') + k)}" for k in range(self.count)]
        hosts = "127.0.0.1 localhost\n" + "".join(f"{SUBNET}.{k + 1} {n}\n" for k, n in enumerate(names))
        (self.ctl / "hosts").write_text(hosts)
        os.chmod(self.ctl / "hosts", 0o644)
        (self.ctl / "init.sh").write_text(INIT)
        pairs = [x for name, folder in self.binds.items() for x in (name, folder)]
        for k, name in enumerate(names):
            log = open(self.ctl / f"{name}.init.log", "w")
            process = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", "unshare", "--net", "--mount", "--uts", "--ipc", "--pid",
                 "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
                 "bash", str(self.ctl / "init.sh"), name, f"{SUBNET}.{k + 1}", str(self.ctl), *pairs],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            self.nodes.append(Node(name, f"{SUBNET}.{k + 1}", process))
        for node in self.nodes:
            self._wait(lambda n=node: (self.ctl / f"{n.name}.up").exists(), node, "mounts and hostname")
            node.init_pid = self._child(node.process.pid)
        a, b = self.nodes
        link = subprocess.run(["ip", "link", "add", "name", "eth0", "netns", str(a.init_pid), "type", "veth",
                               "peer", "name", "eth0", "netns", str(b.init_pid)], capture_output=True, text=True)
        if link.returncode:
            raise NamespacesRefused(f"ip link add ... type veth: {link.stderr.strip()}")
        (self.ctl / "link").touch()
        for node in self.nodes:
            self._wait(lambda n=node: (self.ctl / f"{n.name}.net").exists(), node, "its veth address")

    def _wait(self, done, node: Node, what: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if node.process.poll() is not None:
                log = (self.ctl / f"{node.name}.init.log").read_text().strip()
                raise NamespacesRefused(f"{node.name} ended before {what} (exit {node.process.returncode}): {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.name}: no {what} after {timeout} s")
            time.sleep(0.01)

    @staticmethod
    def _child(pid: int) -> int:
        """unshare's one child: the node's pid 1 (setpriv exec'd unshare, so `pid` is unshare)."""
        for _ in range(500):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return int(children[0])
            time.sleep(0.01)
        raise RuntimeError(f"unshare (pid {pid}) has no child")

    def close(self) -> None:
        """SIGKILL to each node's unshare: its child (the node's pid 1) gets SIGKILL too (--kill-child),
        and with it every process of the node's pid namespace; then the namespaces and veths are gone."""
        for node in self.nodes:
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGKILL)
        for node in self.nodes:
            node.process.wait(timeout=30)
        for node in self.nodes:
            if node.init_pid:
                deadline = time.monotonic() + 10
                while Path(f"/proc/{node.init_pid}").exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
        self.nodes = []

    def alive(self) -> list[int]:
        """Pids (this namespace's numbers) of the nodes' processes still alive: [] after close()."""
        return [n.init_pid for n in self.nodes if n.init_pid and Path(f"/proc/{n.init_pid}").exists()]


if __name__ == "__main__":  # a look by hand: python two_nodes.py
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, Nodes(Path(tmp), {}) as nodes:
        for node in nodes.nodes:
            done = node.run(["bash", "-c", "hostname; ip -br addr show eth0; ls -A /dev/shm; ps -e | wc -l"])
            print(node.name, node.init_pid, done.stdout, done.stderr, file=sys.stderr)
