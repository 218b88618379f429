"""Request timings read off the wire: a packet capture of the loopback port, no client's clock.

`capture(port, path)` records the traffic of one TCP port with tcpdump (nanosecond timestamps);
`wire_requests(path, port)` splits it into requests: per connection, a client segment that
starts with `POST ` opens a request, and the server segments after it that carry a streamed
chunk with non-empty "text" are its tokens. For each request: when the request left the client,
when its first and last content chunk reached it, and how many content segments came.

Used by bench/engine_fidelity.py --wire to tell which client's TTFT and TPOT are right.
"""

import contextlib
import re
import statistics
import struct
import subprocess
import time
from collections import defaultdict

PCAP_NANO_MAGIC = 0xA1B23C4D
ETHERNET_HEADER = 14
CONTENT = re.compile(rb'"text":\s*"[^"]')


@contextlib.contextmanager
def capture(port: int, path):
    """tcpdump of 127.0.0.1:port into path while the block runs."""
    argv = ["tcpdump", "-i", "lo", "-w", str(path), "-U", "--time-stamp-precision=nano"]
    argv += ["-B", "65536", "tcp", "port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # tcpdump says "listening on lo" once it captures
    time.sleep(1.0)
    try:
        yield
    finally:
        time.sleep(0.5)
        proc.terminate()
        proc.wait(10)


def _packets(path):
    """(ts s, src port, dst port, payload) of each TCP segment with a payload."""
    with open(path, "rb") as file:
        data = file.read()
    magic = struct.unpack_from("<I", data, 0)[0]
    if magic != PCAP_NANO_MAGIC:
        raise ValueError(f"{path} is not a nanosecond pcap (magic {magic:#x})")
    offset = 24
    while offset + 16 <= len(data):
        seconds, nanos, captured, _ = struct.unpack_from("<IIII", data, offset)
        offset += 16
        frame = data[offset : offset + captured]
        offset += captured
        ip = frame[ETHERNET_HEADER:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ip_header = (ip[0] & 0x0F) * 4
        total = struct.unpack_from(">H", ip, 2)[0]
        tcp = ip[ip_header:total]
        src, dst = struct.unpack_from(">HH", tcp, 0)
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if payload:
            yield seconds + nanos * 1e-9, src, dst, payload


def wire_requests(path, port: int) -> list[dict]:
    """Every request of the capture: {"sent", "first", "last" (epoch s), "chunks"}."""
    open_requests: dict[int, dict] = {}
    done = []
    by_connection = defaultdict(list)
    for ts, src, dst, payload in _packets(path):
        client = src if dst == port else dst
        by_connection[client].append((ts, dst == port, payload))
    for client, segments in by_connection.items():
        for ts, to_server, payload in segments:
            if to_server and payload.startswith(b"POST "):
                if client in open_requests:
                    done.append(open_requests.pop(client))
                open_requests[client] = {"sent": ts, "first": None, "last": None, "chunks": 0}
            elif not to_server and client in open_requests:
                request = open_requests[client]
                hits = len(CONTENT.findall(payload))
                if hits:
                    request["first"] = request["first"] or ts
                    request["last"] = ts
                    request["chunks"] += hits
    done.extend(open_requests.values())
    return [r for r in done if r["first"] is not None]


def medians_ms(requests: list[dict], output_len: int) -> dict:
    """Median TTFT and TPOT (ms) of the captured requests; TPOT over output_len tokens."""
    ttft = [(r["first"] - r["sent"]) * 1000 for r in requests]
    tpot = [(r["last"] - r["first"]) * 1000 / (output_len - 1) for r in requests]
    return {
        "requests": len(requests),
        "median_ttft_ms": statistics.median(ttft),
        "median_tpot_ms": statistics.median(tpot),
    }
