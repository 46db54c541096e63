"""Two emulated hosts of two Horovod ranks each on this machine (as root), for bench_e2e.py.

Each host is a network namespace; a veth pair joins them, shaped with tc (tbf) to the slow
link between hosts, while the ranks of a host talk over its own loopback (the fast link).
Only loopback-range addresses are used: host A is 127.1.0.1, host B 127.2.0.1 (each
namespace keeps only 127.0.0.1 on lo, so other 127.x addresses route over the veth).

Ranks are started the way horovodrun starts them (its RendezvousServer and slot
environment), with one workaround: Horovod 0.28.1 builds the Gloo device of every process
set (the global one included) from an interface name it never fills in, so
HOROVOD_GLOO_IFACE is ignored and Gloo advertises what the hostname resolves to (127.0.0.1).
Each rank therefore runs in its own UTS namespace whose hostname is its host's address.
"""
import os
import subprocess
import sys
import threading

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.gloo_run import create_slot_env_vars
from horovod.runner.http.http_server import RendezvousServer

HOSTS = {"hostA": ("deepreduce-host-a", "127.1.0.1"), "hostB": ("deepreduce-host-b", "127.2.0.1")}
LINK = "hv0"


def sh(*cmd, namespace=None):
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    subprocess.run([*prefix, *cmd], check=True, stdout=subprocess.DEVNULL)


def down():
    for namespace, _ in HOSTS.values():
        subprocess.run(["ip", "netns", "delete", namespace], stderr=subprocess.DEVNULL)


def up(rate):
    """(Re)create both hosts, the link between them shaped to `rate` (e.g. "1gbit")."""
    down()
    (a, _), (b, _) = HOSTS.values()
    for namespace in (a, b):
        sh("ip", "netns", "add", namespace)
    sh("ip", "link", "add", LINK, "netns", a, "type", "veth", "peer", "name", LINK, "netns", b)
    for namespace, address in HOSTS.values():
        sh("ip", "link", "set", "lo", "up", namespace=namespace)
        for device in ("all", "default", "lo", LINK):
            sh("sysctl", "-qw", f"net.ipv4.conf.{device}.route_localnet=1", namespace=namespace)
        sh("ip", "route", "del", "table", "local", "127.0.0.0/8", "dev", "lo", namespace=namespace)
        sh("ip", "route", "replace", "table", "local", "local", "127.0.0.1/32", "dev", "lo",
           "proto", "kernel", "scope", "host", "src", "127.0.0.1", namespace=namespace)
        sh("ip", "addr", "add", f"{address}/8", "dev", LINK, namespace=namespace)
        sh("ip", "link", "set", LINK, "up", namespace=namespace)
        sh("tc", "qdisc", "add", "dev", LINK, "root", "tbf", "rate", rate, "burst", "256kb",
           "latency", "50ms", namespace=namespace)


def launch(command, env, timeout):
    """Run `command` as ranks 0,1 on host A and 2,3 on host B; -> (exit code, output with
    each line prefixed by its rank). Needs the hosts to be up; the rendezvous server runs in
    this process, which must itself be inside host A's namespace (see main)."""
    plan = get_host_assignments(parse_hosts("hostA:2,hostB:2"), 4)
    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(plan)
    lines, procs, lock = [], [], threading.Lock()

    def pump(rank, stream):
        for line in iter(stream.readline, b""):
            with lock:
                lines.append(f"[{rank}] {line.decode(errors='replace')}")

    for slot in plan:
        namespace, address = HOSTS[slot.hostname]
        rank_env = {**env, **create_slot_env_vars(slot), "HOROVOD_CONTROLLER": "gloo",
                    "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": LINK,
                    "HOROVOD_GLOO_RENDEZVOUS_ADDR": HOSTS["hostA"][1],
                    "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port)}
        argv = ["ip", "netns", "exec", namespace, "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', address, *command]
        proc = subprocess.Popen(argv, env=rank_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        thread = threading.Thread(target=pump, args=(slot.rank, proc.stdout), daemon=True)
        thread.start()
        procs.append((proc, thread))
    code = 0
    try:
        for proc, _ in procs:
            rc = proc.wait(timeout=timeout)
            code = code or rc
            if rc:  # one rank failed: the others would wait for it forever
                break
    except subprocess.TimeoutExpired:
        code = 124
    finally:
        for proc, thread in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            thread.join(timeout=2)
        server.stop()
    return code, "".join(lines)


def main():
    """python scripts/two_hosts.py TIMEOUT CMD...: inside host A's namespace (bench_e2e.py
    runs it with `ip netns exec`), launch CMD on the 4 ranks; prints their output."""
    code, output = launch(sys.argv[2:], dict(os.environ), float(sys.argv[1]))
    sys.stdout.write(output)
    sys.exit(code)


if __name__ == "__main__":
    main()
