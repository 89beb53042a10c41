#!/usr/bin/env python3
"""Mint idrange IDs over HTTP/JSON from one or more rangesvc replicas.

Standard library only. Each replica serves GET /v1/ids?count=N (rangesvc
serve --http) and answers {"ids": ["<decimal>", ...]}: IDs are strings
because JavaScript numbers lose precision above 2^53; Python ints do not,
so int() is exact.

    python3 mint.py --region 1 --count 1000 http://127.0.0.1:7071 http://10.0.0.2:7071

The script mints --count IDs from every replica, checks that all of them are
unique, decode with the 64-bit layout (docs/id-layout.md) and carry --region,
prints a summary and exits 0; any failure exits 1 with one line on stderr.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

# The 64-bit layout, format version 1 (docs/id-layout.md):
# ID = ms<<22 | region<<20 | worker<<12 | seq, sign bit 0.
EPOCH_MS = 1767225600000  # 2026-01-01T00:00:00Z
TIME_SHIFT, REGION_SHIFT, WORKER_SHIFT = 22, 20, 12
MAX_BATCH = 100000  # the service's limit for one call (service.MaxMintBatch)


def decode(i):
    """Split an ID into (unix ms, region, worker, seq); ValueError if invalid."""
    if not 0 < i < 1 << 63:
        raise ValueError(f"ID {i} is not a positive int64")
    ms = i >> TIME_SHIFT
    region = (i >> REGION_SHIFT) & 0x3
    worker = (i >> WORKER_SHIFT) & 0xFF
    seq = i & 0xFFF
    return EPOCH_MS + ms, region, worker, seq


def mint(base, count, timeout=30):
    """Mint count IDs (1..MAX_BATCH) from the replica at base in one call."""
    url = f"{base.rstrip('/')}/v1/ids?count={count}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as e:
        # The service answers errors as {"code": <gRPC code>, "message": "..."}.
        err = json.load(e)
        raise RuntimeError(f"{url}: HTTP {e.code}, gRPC code {err['code']}: {err['message']}") from None
    ids = body["ids"]
    if not all(isinstance(s, str) for s in ids):
        raise RuntimeError(f"{url}: IDs are not JSON strings")
    return [int(s) for s in ids]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--region", type=int, required=True, help="region the replicas serve (0..3)")
    p.add_argument("--count", type=int, default=1000, help="IDs to mint from each replica")
    p.add_argument("--batch", type=int, default=1000, help=f"IDs per call (1..{MAX_BATCH})")
    p.add_argument("replicas", nargs="+", help="HTTP API base URLs, e.g. http://127.0.0.1:7071")
    a = p.parse_args(argv)
    if not 1 <= a.batch <= MAX_BATCH:
        p.error(f"--batch {a.batch} not in 1..{MAX_BATCH}")

    seen = {}
    now_ms = int(time.time() * 1000)
    for base in a.replicas:
        left = a.count
        while left > 0:
            n = min(left, a.batch)
            ids = mint(base, n)
            if len(ids) != n:
                raise RuntimeError(f"{base}: asked for {n} IDs, got {len(ids)}")
            for i in ids:
                unix_ms, region, worker, _ = decode(i)
                if region != a.region:
                    raise RuntimeError(f"{base}: ID {i} has region {region}, want {a.region}")
                if not EPOCH_MS <= unix_ms <= now_ms + 60_000:
                    raise RuntimeError(f"{base}: ID {i} has time {unix_ms} ms, not near now ({now_ms} ms)")
                if i in seen:
                    raise RuntimeError(f"ID {i} from {base} repeats one from {seen[i]}")
                seen[i] = base
            left -= n
    workers = sorted({decode(i)[2] for i in seen})
    print(f"{len(seen)} unique IDs of region {a.region} from {len(a.replicas)} replica(s), worker codes {workers}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (RuntimeError, ValueError, OSError) as e:
        print(f"mint.py: {e}", file=sys.stderr)
        sys.exit(1)
