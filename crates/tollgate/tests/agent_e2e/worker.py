"""A worker of the agent's end-to-end test: saturates buckets through an agent.

Runs CONCURRENCY tasks for SECONDS, each acquiring 1 to 5 tokens at a time
from a random one of BUCKETS (waiting up to a second), with the package's
own retries across agent restarts, and prints what it was given, per
bucket, as one JSON object.
"""

import argparse
import asyncio
import json
import random
import time

from tollgate_agent import AsyncLimiter, NotAdmitted


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--buckets", required=True, help="comma-separated; '' is request units")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    buckets = args.buckets.split(",")
    admitted = {bucket: 0 for bucket in buckets}
    counts = {"calls": 0, "not_admitted": 0}
    errors: list = []
    limiter = AsyncLimiter(args.tenant, socket=args.socket, timeout=30)
    end = time.monotonic() + args.seconds

    async def work(task: int) -> None:
        rng = random.Random(args.seed * 1000 + task)
        bucket = buckets[task % len(buckets)]
        while time.monotonic() < end:
            tokens = rng.randint(1, 5)
            counts["calls"] += 1
            try:
                await limiter.acquire(bucket, tokens, max_wait=1.0)
                admitted[bucket] += tokens
            except NotAdmitted:
                counts["not_admitted"] += 1
            except Exception as error:  # reported, and fails the test
                errors.append(repr(error))
                await asyncio.sleep(0.1)

    await asyncio.gather(*(work(task) for task in range(args.concurrency)))
    await limiter.close()
    print(json.dumps({"admitted": admitted, **counts, "errors": errors[:5], "error_count": len(errors)}))


asyncio.run(main())
