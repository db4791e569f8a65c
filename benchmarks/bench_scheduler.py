"""Scheduler benchmark: prediction error on this machine, and plan search time at scale.

1. Prediction error (paper section 5.2 reports < 2% temporal, < 5% spatial). Until the training
   loop exists this measures a *synthetic embodied job* on the real runtime: Ray worker groups
   for an env (sleep, like a simulator step waiting on physics), a rollout (a torch MLP forward)
   and an actor (forward + backward + optimizer step, with offload/onload of its state). Each
   component is profiled alone, then one iteration is run under a temporal plan (all groups on
   device 0, context switched) and a spatial plan (env, rollout, actor on devices 0, 1, 2; env
   and rollout pipelined in 2 micro-batches), and the median measured iteration is compared with
   the cost model's prediction from the profiles.
2. Search time of the planner for the analytic ManiSkill + OpenVLA profile on 8, 64 and 1024
   devices (64 envs per device).

Prints one JSON line last. ``--quick`` runs fewer iterations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

N_ENVS, ROLLOUT_STEPS, ACTOR_BATCH = 16, 10, 64


def _workers():
    import torch

    from rlinf_embodied.runtime.worker import Worker

    class SleepEnv(Worker):
        """Env-like: a fixed plus per-env sleep (physics), a little numpy work."""

        def step(self, batch):
            time.sleep(0.004 + 0.0004 * batch)
            return 0.0

    class MlpRollout(Worker):
        def __init__(self):
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(64, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512),
                torch.nn.Tanh(), torch.nn.Linear(512, 8),
            )

        def forward(self, batch):
            with torch.no_grad():
                for _ in range(4):
                    self.net(torch.randn(batch, 64))
            return 0.0

        def set_weights(self, state):
            self.net.load_state_dict(state)

    class MlpActor(Worker):
        def __init__(self):
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(64, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512),
                torch.nn.Tanh(), torch.nn.Linear(512, 8),
            )
            self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-4)
            self.stash = None

        def train(self, batch):
            loss = self.net(torch.randn(batch, 64)).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            return 0.0

        def swap_out(self):  # context switch out: keep a host copy of the state
            self.stash = {k: v.clone() for k, v in self.net.state_dict().items()}

        def swap_in(self):
            if self.stash is not None:
                self.net.load_state_dict(self.stash)

        def weights(self):
            return self.net.state_dict()

    return SleepEnv, MlpRollout, MlpActor


class PlanRunner:
    """Runs one iteration of a plan tree on worker groups, driver-orchestrated."""

    METHOD = {"env": "step", "rollout": "forward", "actor": "train"}

    def __init__(self, groups):
        self.groups = groups

    def call(self, name, batch):
        return getattr(self.groups[name], self.METHOD[name])(batch)

    def run(self, plan):
        from rlinf_embodied.scheduler.cost_model import Cycle, Leaf, Temporal, even_split

        if isinstance(plan, Leaf):
            for _ in range(plan.stage.rounds):
                left = plan.stage.items
                while left > 0:
                    b = min(plan.batch, left)
                    self.call(plan.name, b).wait()
                    left -= b
        elif isinstance(plan, Cycle):
            sizes = even_split(plan.stage.items, plan.micro_batches)
            if plan.split:
                self._ring(plan.stage.members, sizes, plan.stage.rounds)
            else:
                for _ in range(plan.stage.rounds):
                    for s in sizes:
                        for m in plan.stage.members:
                            self.call(m, s).wait()
        elif isinstance(plan, Temporal):
            self.run(plan.left)
            if plan.offload:
                self.groups["actor"].swap_in().wait()
            self.run(plan.right)
            if plan.offload:
                self.groups["actor"].swap_out().wait()
        else:  # spatial with one chunk: the actor starts when the rollout is complete
            if plan.chunks != 1:
                raise NotImplementedError("chunked spatial plans are not exercised here")
            self.run(plan.left)
            self.run(plan.right)

    def _ring(self, members, sizes, rounds):
        """Micro-batches circulate env -> rollout -> env, one driver thread per micro-batch
        (blocking waits, no polling); each group serves its calls FIFO."""

        def chain(size):
            for _ in range(rounds):
                for m in members:
                    self.call(m, size).wait()

        with ThreadPoolExecutor(len(sizes)) as pool:
            for f in [pool.submit(chain, s) for s in sizes]:
                f.result()

    def sync(self):
        state = self.groups["actor"].weights().wait()[0]
        self.groups["rollout"].set_weights(state).wait()


def _profile(groups):
    from rlinf_embodied.scheduler.profiler import WorkerGroupComponent, profile_workflow

    comps = [
        WorkerGroupComponent("env", groups["env"], "step", include_dispatch=True),
        WorkerGroupComponent("rollout", groups["rollout"], "forward", include_dispatch=True),
        WorkerGroupComponent("actor", groups["actor"], "train", "swap_in", "swap_out", include_dispatch=True),
    ]
    runner = PlanRunner(groups)
    return profile_workflow(
        comps,
        {"env": [1, 4, 8, 16], "rollout": [1, 4, 8, 16], "actor": [16, 32, 64]},
        device_memory_bytes=8e9,
        weight_sync=runner.sync,
        repeats=5,
        link_bandwidth_Bps=1e12,
    )


def measure_prediction(iterations: int) -> dict:
    import ray

    from rlinf_embodied.runtime.cluster import Cluster
    from rlinf_embodied.runtime.worker import WorkerGroup
    from rlinf_embodied.scheduler.cost_model import CostModel, Cycle, Leaf, Spatial, Temporal
    from rlinf_embodied.scheduler.graph import embodied_graph

    SleepEnv, MlpRollout, MlpActor = _workers()
    cluster = Cluster(num_cpus=2, num_cpu_devices=3, log_to_driver=False)
    graph = embodied_graph(N_ENVS, ROLLOUT_STEPS, 1)
    cycle, actor = graph.stages()
    plans = {
        "temporal": (Temporal(Cycle(cycle, 1, False, 1), Leaf(actor, 1, ACTOR_BATCH), True),
                     {"env": "0", "rollout": "0", "actor": "0"}),
        "spatial": (Spatial(Cycle(cycle, 2, True, 2), Leaf(actor, 1, ACTOR_BATCH), 1),
                    {"env": "0", "rollout": "1", "actor": "2"}),
    }
    out = {}
    try:
        for mode, (plan, devices) in plans.items():
            kw = dict(torch_threads=1)
            groups = {
                "env": WorkerGroup(cluster, SleepEnv, "env", devices=devices["env"], **kw),
                "rollout": WorkerGroup(cluster, MlpRollout, "rollout", devices=devices["rollout"], **kw),
                "actor": WorkerGroup(cluster, MlpActor, "actor", devices=devices["actor"], **kw),
            }
            profile = _profile(groups)
            predicted = CostModel(profile).iteration_time(plan)
            runner = PlanRunner(groups)
            times = []
            for it in range(iterations + 1):
                t0 = time.perf_counter()
                runner.run(plan)
                runner.sync()
                if it:  # the first iteration warms up
                    times.append(time.perf_counter() - t0)
            measured = statistics.median(times)
            out[mode] = {
                "predicted_s": round(predicted, 5),
                "measured_s": round(measured, 5),
                "error": round(abs(predicted - measured) / measured, 4),
                "placement": devices,
            }
            for g in groups.values():
                g.shutdown()
    finally:
        cluster.shutdown()
        if ray.is_initialized():
            ray.shutdown()
    return out


def search_times() -> dict:
    from rlinf_embodied.scheduler.graph import embodied_graph
    from rlinf_embodied.scheduler.planner import search
    from rlinf_embodied.scheduler.profiles import analytic_default_profile

    prof = analytic_default_profile("maniskill", "openvla")
    out = {}
    for d in (8, 64, 1024):
        graph = embodied_graph(num_envs=64 * d, rollout_steps=80)
        w, c = time.perf_counter(), time.process_time()
        r = search(graph, prof, d)
        out[d] = (time.perf_counter() - w, time.process_time() - c, r.best.mode)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 measured iterations instead of 8")
    args = ap.parse_args(argv)
    pred = measure_prediction(3 if args.quick else 8)
    for mode, r in pred.items():
        print(f"{mode:<8} predicted {r['predicted_s']:.4f} s  measured {r['measured_s']:.4f} s  "
              f"error {r['error'] * 100:.1f}%  placement {r['placement']}", file=sys.stderr)
    st = search_times()
    for d, (w, c, mode) in st.items():
        print(f"search {d:>5} devices: {w:.3f} s wall, {c:.3f} s CPU -> {mode}", file=sys.stderr)
    result = {
        "bench": "scheduler",
        "measured_job": (
            f"synthetic embodied job on Ray (sleep env, MLP rollout, MLP actor; N={N_ENVS}, "
            f"T={ROLLOUT_STEPS}, actor batch {ACTOR_BATCH}); not the training loop"
        ),
        "temporal_pred_error": pred["temporal"]["error"],
        "spatial_pred_error": pred["spatial"]["error"],
        "temporal_measured_s": pred["temporal"]["measured_s"],
        "temporal_predicted_s": pred["temporal"]["predicted_s"],
        "spatial_measured_s": pred["spatial"]["measured_s"],
        "spatial_predicted_s": pred["spatial"]["predicted_s"],
        "search_s_8": round(st[8][0], 4),
        "search_s_64": round(st[64][0], 4),
        "search_s_1024": round(st[1024][0], 4),
        "search_cpu_s_1024": round(st[1024][1], 4),
        "quick": args.quick,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
