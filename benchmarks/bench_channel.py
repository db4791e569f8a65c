"""Channel throughput between two actors versus plain ray.put/ray.get between the same actors.

Both paths move torch uint8 tensors from a producer actor to a consumer actor on one node, with
at most WINDOW items in flight (the channel's maxsize, or the producer's outstanding calls). The
channel runs its workflow data path: the consumer binds its key, so items go straight to it
(Unix socket, shared memory for large buffers; rlinf_embodied/runtime/transports/same_node.py).
Prints one JSON line last:

    channel_vs_ray_ratio_1mib, channel_vs_ray_ratio_16mib   throughput ratios (target >= 1.0)
    small_items_per_s                                       small dict items through a channel
    round_trip_64b / _4kib / _64kib                         ping-pong between the two actors,
        both keys bound ``caller_reads`` (the env <-> rollout request/reply path of the
        workflow: the thread waiting in get reads the socket): p50/p90 round trip and per-hop
        medians (producer put, wait for the echo, echo put), ms
    small_round_trip_p50_ms                                 the worst p50 of those (target <= 0.5)
    reader_threads_round_trip_64b / _4kib / _64kib          the same with reader threads (the
        default binding, e.g. trajectories to the actor): one more wake-up per message
    reader_threads_small_round_trip_p50_ms                  the worst p50 of those

Usage: python benchmarks/bench_channel.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import ray

from rlinf_embodied.runtime import Channel, Cluster, flush_puts

WINDOW = 4
REPEATS = 3
MIB = 1 << 20


@ray.remote(num_cpus=0)
class Producer:
    def __init__(self):
        import torch

        self.torch = torch

    def payload(self, nbytes):
        return self.torch.ones(nbytes, dtype=self.torch.uint8) if nbytes else {"step": 0}

    def via_channel(self, channel, nbytes, n):
        item = self.payload(nbytes)
        for _ in range(n):
            channel.put(item, key="data")
        flush_puts()  # as a Worker method would on return

    def bind(self, channel, key, caller_reads=False):
        channel.bind(key, caller_reads=caller_reads)

    def ping(self, channel, nbytes, n):
        """n round trips: put on key "ping", wait for the echo on "pong". Per trip, seconds:
        (total, in put, waiting for the echo)."""
        item = self.payload(nbytes)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            channel.put(item, key="ping")
            t1 = time.perf_counter()
            channel.get(key="pong")
            t2 = time.perf_counter()
            out.append((t2 - t0, t1 - t0, t2 - t1))
        flush_puts()
        return out

    def via_ray(self, consumer, nbytes, n):
        item = self.payload(nbytes)
        in_flight = []
        for _ in range(n):
            in_flight.append(consumer.take.remote([ray.put(item)]))  # list: pass the ref itself
            if len(in_flight) >= WINDOW:
                ray.get(in_flight.pop(0))
        ray.get(in_flight)


@ray.remote(num_cpus=0)
class Consumer:
    def __init__(self):
        import torch  # noqa: F401  (same import cost as the producer)

    def via_channel(self, channel, n):
        for _ in range(n):
            self._touch(channel.get(key="data"))

    def bind(self, channel, key, caller_reads=False):
        channel.bind(key, caller_reads=caller_reads)

    def echo(self, channel, n):
        """Return n items from key "ping" on key "pong"; per trip (seconds in get, in put)."""
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            item = channel.get(key="ping")
            t1 = time.perf_counter()
            channel.put(item, key="pong")
            out.append((t1 - t0, time.perf_counter() - t1))
        flush_puts()
        return out

    def take(self, refs):
        self._touch(ray.get(refs[0]))

    @staticmethod
    def _touch(item):
        return item[0] if hasattr(item, "shape") else item


def _timed(*refs) -> float:
    start = time.perf_counter()
    ray.get(list(refs))
    return time.perf_counter() - start


def channel_rate(producer, consumer, nbytes: int, n: int, tag: str) -> float:
    """Items/s from producer to consumer through a Channel (maxsize WINDOW), on the key the
    consumer bound (the workflow's data path)."""
    channel = Channel.create(f"bench-{tag}", maxsize=WINDOW)
    ray.get(consumer.bind.remote(channel, "data"))
    seconds = _timed(
        producer.via_channel.remote(channel, nbytes, n), consumer.via_channel.remote(channel, n)
    )
    channel.delete()
    return n / seconds


def round_trip(producer, consumer, nbytes: int, n: int, tag: str, caller_reads: bool) -> dict:
    """Ping-pong between the two actors through one channel, both keys bound with
    ``caller_reads``: p50/p90 round trip and the per-hop breakdown (medians, ms): producer put,
    producer wait for the echo, consumer put."""
    channel = Channel.create(f"bench-rt-{tag}-{int(caller_reads)}")
    ray.get([consumer.bind.remote(channel, "ping", caller_reads),
             producer.bind.remote(channel, "pong", caller_reads)])
    trips, echoes = ray.get([producer.ping.remote(channel, nbytes, n), consumer.echo.remote(channel, n)])
    channel.delete()
    trips, echoes = trips[n // 10:], echoes[n // 10:]  # drop the warm-up
    ms = lambda xs, q=0.5: round(1000 * statistics.quantiles(xs, n=100)[int(q * 100) - 1], 3)  # noqa: E731
    return {
        "p50_ms": ms([t[0] for t in trips]),
        "p90_ms": ms([t[0] for t in trips], 0.9),
        "put_ms": ms([t[1] for t in trips]),
        "wait_echo_ms": ms([t[2] for t in trips]),
        "echo_put_ms": ms([e[1] for e in echoes]),
    }


def ray_rate(producer, consumer, nbytes: int, n: int) -> float:
    """Items/s from producer to consumer as ray.put refs passed in actor calls."""
    return n / _timed(producer.via_ray.remote(consumer, nbytes, n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer items (CI smoke run)")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    cluster = Cluster(log_to_driver=False)
    producer, consumer = Producer.remote(), Consumer.remote()
    ray.get([producer.payload.remote(0), consumer.take.remote([ray.put(0)])])  # warm up
    channel_rate(producer, consumer, MIB, 8, "warmup")

    result = {"window": WINDOW}
    for label, nbytes, n in (("1mib", MIB, 400), ("16mib", 16 * MIB, 60)):
        count = max(10, int(n * scale))
        chan, plain = [], []
        for r in range(REPEATS):  # interleaved, best of REPEATS: the machine may be shared
            chan.append(channel_rate(producer, consumer, nbytes, count, f"{label}-{r}"))
            plain.append(ray_rate(producer, consumer, nbytes, count))
        result[f"channel_mib_per_s_{label}"] = round(max(chan) * nbytes / MIB, 1)
        result[f"ray_mib_per_s_{label}"] = round(max(plain) * nbytes / MIB, 1)
        result[f"channel_vs_ray_ratio_{label}"] = round(max(chan) / max(plain), 3)
    small_n = max(200, int(3000 * scale))
    result["small_items_per_s"] = round(channel_rate(producer, consumer, 0, small_n, "small"), 1)
    trips = max(100, int(1000 * scale))
    sizes = (("64b", 0), ("4kib", 4096), ("64kib", 64 * 1024))
    for prefix, caller_reads in (("", True), ("reader_threads_", False)):
        for label, nbytes in sizes:
            result[f"{prefix}round_trip_{label}"] = round_trip(producer, consumer, nbytes, trips, label, caller_reads)
        result[f"{prefix}small_round_trip_p50_ms"] = max(result[f"{prefix}round_trip_{x}"]["p50_ms"] for x, _ in sizes)
    result["loadavg"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    cluster.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
