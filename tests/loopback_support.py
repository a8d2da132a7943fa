"""What addresses processes really use, read from /proc (Linux): the sockets they listen on and the peers
they are connected to. Tests use it to check that Spark and TensorFlow stay on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import os
import socket

LISTEN, ESTABLISHED = "0A", "01"


def _decode(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        address = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:   # four little-endian 32-bit words
        address = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return address, int(port, 16)


def _socket_inodes(pids) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    return inodes


def _sockets(pids, state: str) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    inodes = _socket_inodes(pids)
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as handle:
            next(handle)
            for line in handle:
                fields = line.split()
                if fields[3] == state and fields[9] in inodes:
                    found.append((_decode(fields[1]), _decode(fields[2])))
    return found


def listening(pids) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the processes listen on ("::" or "0.0.0.0" = every interface)."""
    return [local for local, _ in _sockets(pids, LISTEN)]


def peers(pids) -> list[tuple[str, int]]:
    """(address, port) of the remote end of every established TCP connection of the processes."""
    return [remote for _, remote in _sockets(pids, ESTABLISHED)]


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback
