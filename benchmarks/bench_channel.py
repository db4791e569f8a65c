"""Channel throughput between two actors versus plain ray.put/ray.get between the same actors.

Both paths move torch uint8 tensors from a producer actor to a consumer actor on one node, with
at most WINDOW items in flight (the channel's maxsize, or the producer's outstanding calls).
Prints one JSON line last:

    channel_vs_ray_ratio_1mib, channel_vs_ray_ratio_16mib   throughput ratios (target >= 0.8)
    small_items_per_s                                       small dict items through a channel

Usage: python benchmarks/bench_channel.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import time

import ray

from rlinf_embodied.runtime import Channel, Cluster, flush_puts, release_prefetched

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
            channel.put(item)
        flush_puts()  # as a Worker method would on return

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
        channel = channel.with_prefetch()  # a consumer loop: hide the queue round trip
        for _ in range(n):
            self._touch(channel.get())
        release_prefetched()

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
    """Items/s from producer to consumer through a Channel (maxsize WINDOW)."""
    channel = Channel.create(f"bench-{tag}", maxsize=WINDOW)
    seconds = _timed(
        producer.via_channel.remote(channel, nbytes, n), consumer.via_channel.remote(channel, n)
    )
    channel.delete()
    return n / seconds


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
    cluster.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
