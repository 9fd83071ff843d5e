"""The boxes' network: one bridge on the operator's machine, one veth per box.

The bridge holds the gateway address (the subnet's first host) and the machines' public
addresses (the rest of the subnet's lower half: 10.77.1.0-10.77.127.255 by default). Each box's
netns gets `eth0` with an address from the upper half (10.77.128.1 on) and no default route, so
nothing a box sends can leave the machine.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from ipaddress import IPv4Address, IPv4Network

from sandbox.boxes.errors import BoxError


def ip(*batch: str, netns_pid: int | None = None, check: bool = True) -> str:
    """Run `ip -batch` with these commands (inside a process's netns if `netns_pid`)."""
    cmd = ["ip", "-batch", "-"]
    if netns_pid is not None:
        cmd = ["nsenter", "-t", str(netns_pid), "-n", *cmd]
    res = subprocess.run(cmd, input="\n".join(batch) + "\n", capture_output=True, text=True)
    if check and res.returncode != 0:
        raise BoxError(f"ip {'; '.join(batch)}: {res.stderr.strip()}")
    return res.stdout


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def link_exists(name: str) -> bool:
    res = subprocess.run(["ip", "link", "show", "dev", name], capture_output=True)
    return res.returncode == 0


def delete_link(name: str) -> None:
    """Delete a link; one that is already gone is fine."""
    subprocess.run(["ip", "link", "del", "dev", name], capture_output=True)


def mac_of(address: IPv4Address) -> str:
    return "02:42:" + ":".join(f"{b:02x}" for b in address.packed)


class Network:
    def __init__(self, bridge: str, subnet: str) -> None:
        if not 1 <= len(bridge) <= 8 or not bridge.isalnum():
            raise BoxError(f"bridge name {bridge!r}: 1-8 letters or digits (veths add '-<n>')")
        self.bridge = bridge
        self.subnet = IPv4Network(subnet)
        if self.subnet.prefixlen > 24:
            raise BoxError(f"subnet {subnet}: /24 or larger")
        self.gateway = self.subnet.network_address + 1
        self.public_half, self.box_half = self.subnet.subnets()
        self._public: set[IPv4Address] = set()

    def box_address(self, index: int) -> IPv4Address:
        """The `index`-th box address (from 1) in the subnet's upper half."""
        if not 1 <= index < self.box_half.num_addresses - 1:
            raise BoxError(f"no box address left in {self.box_half}")
        return self.box_half.network_address + index

    def veth(self, index: int) -> str:
        return f"{self.bridge}-{index}"

    def up(self) -> None:
        """Create the bridge with the gateway address (or adopt one left by a crashed run).

        Refuses a subnet another device already has addresses in, and a bridge that still has
        boxes on it: both mean another sandbox is up, and sharing would break it.
        """
        taken = _run("ip", "-o", "-4", "addr", "show", "to", str(self.subnet))
        others = sorted({line.split()[1] for line in taken.splitlines()} - {self.bridge})
        if others:
            raise BoxError(f"{self.subnet} is already in use on {', '.join(others)}: another "
                           "sandbox is up (`fleet sandbox down`), or pick another subnet")
        ports = _run("ip", "-o", "link", "show", "master", self.bridge) \
            if link_exists(self.bridge) else ""
        boxes = [p for p in re.findall(r"^\d+: ([^:@\s]+)", ports, re.M)
                 if p != self.veth(0)]
        if boxes:
            raise BoxError(f"bridge {self.bridge} still has boxes on it ({', '.join(boxes)}): "
                           "another sandbox is up, or a crashed one needs `fleet sandbox down`")
        made = not link_exists(self.bridge)
        try:
            if made:
                ip(f"link add {self.bridge} type bridge")
            keeper = self.veth(0)
            if not link_exists(keeper):
                # A bridge without a live port has no carrier, and when its carrier returns the
                # kernel may take up to a second to pass traffic (linkwatch). One veth pair that
                # never goes down keeps it up while boxes come and go.
                ip(f"link add {keeper} type veth peer name {keeper}p")
            # a fixed MAC: a bridge's own follows its ports' as they come and go, and boxes
            # would send to a stale gateway MAC until their ARP entries expire
            ip(f"link set {self.bridge} address {mac_of(self.gateway)}",
               f"addr replace {self.gateway}/{self.subnet.prefixlen} dev {self.bridge}",
               f"link set {keeper} master {self.bridge} up", f"link set {keeper}p up",
               f"link set {self.bridge} up")
        except BaseException:
            if made:  # never a bridge this backend did not make
                self.down()
            raise

    def add_public(self, address: str) -> None:
        addr = ipaddress.ip_address(address)
        if not isinstance(addr, IPv4Address) or addr not in self.public_half \
                or addr in (self.gateway, self.subnet.network_address):
            raise BoxError(f"public address {address} is not a host of {self.public_half} "
                           f"other than the gateway {self.gateway}")
        if addr not in self._public:
            ip(f"addr replace {addr}/32 dev {self.bridge}")
            self._public.add(addr)

    def attach(self, index: int, pid: int, address: str) -> None:
        """Give the netns of `pid` an `eth0` on the bridge with `address`."""
        veth = self.veth(index)
        delete_link(veth)  # a veth of a box whose netns the kernel has not reaped yet
        # The MAC follows the address (as Docker's do), and the host learns it without ARP:
        # an address reused soon after its last box died may have a failed ARP entry (a
        # connection of the dead box still retransmitting), which would refuse connections.
        mac = mac_of(IPv4Address(address))
        ip(f"link add {veth} type veth peer name eth0 address {mac} netns {pid}",
           f"link set {veth} master {self.bridge} up",
           f"neigh replace {address} lladdr {mac} dev {self.bridge} nud permanent")
        ip("link set lo up", f"addr add {address}/{self.subnet.prefixlen} dev eth0",
           "link set eth0 up", netns_pid=pid)

    def detach(self, index: int) -> None:
        delete_link(self.veth(index))
        ip(f"neigh del {self.box_address(index)} dev {self.bridge}", check=False)

    def down(self) -> None:
        """Remove the bridge and with it every address on it."""
        delete_link(self.veth(0))
        delete_link(self.bridge)
        self._public.clear()
