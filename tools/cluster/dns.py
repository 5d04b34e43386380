"""One DNS A query over UDP (the standard library has no resolver that takes a server)."""

from __future__ import annotations

import random
import socket
import struct


def query_a(name: str, server: str, port: int = 53, timeout: float = 2.0) -> list[str]:
    """The A records `server` answers for `name` ([] for NXDOMAIN or no answer)."""
    ident = random.randrange(1 << 16)
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split("."))
    packet = struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0) + question + b"\0" + \
        struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (server, port))
        data, _ = sock.recvfrom(4096)
    got_id, flags, qd, an = struct.unpack(">HHHH", data[:8])
    if got_id != ident or flags & 0x000F:
        return []
    offset = 12
    for _ in range(qd):
        offset = _skip_name(data, offset) + 4
    found = []
    for _ in range(an):
        offset = _skip_name(data, offset)
        rtype, _cls, _ttl, length = struct.unpack(">HHIH", data[offset:offset + 10])
        offset += 10
        if rtype == 1 and length == 4:
            found.append(socket.inet_ntoa(data[offset:offset + 4]))
        offset += length
    return found


def _skip_name(data: bytes, offset: int) -> int:
    while True:
        length = data[offset]
        if length == 0:
            return offset + 1
        if length & 0xC0 == 0xC0:  # compression pointer
            return offset + 2
        offset += 1 + length
