"""A term holder in its own process, for the test that SIGSTOPs it (tests/test_halog.py).

    python halog_holder.py PREFIX NODE_ID TTL ENDPOINT...

Campaigns, prints ``epoch N``, then for each ``append TXID`` line on stdin appends
``from NODE_ID`` at TXID and prints ``ok REVISION``, ``fenced MESSAGE`` or ``error MESSAGE``.
"""

import sys

import trio

from meta.ha.log import Fenced, HALog


async def main(prefix: str, node: str, ttl: float, endpoints: list[str]) -> None:
    async with HALog.open(endpoints, prefix, ttl=ttl) as halog:
        term = await halog.campaign(node, timeout=30)
        print(f"epoch {term.epoch}", flush=True)
        stdin = trio.lowlevel.FdStream(0)
        buf = b""
        while True:
            while b"\n" not in buf:
                chunk = await stdin.receive_some()
                if not chunk:
                    return
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            cmd, arg = line.decode().split()
            assert cmd == "append", cmd
            try:
                rev = await halog.append(term, int(arg), f"from {node}".encode())
                print(f"ok {rev}", flush=True)
            except Fenced as exc:
                print(f"fenced {exc}", flush=True)
            except Exception as exc:  # reported to the test, which fails on it
                print(f"error {exc!r}", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:])
