"""Multi-node scenarios on real raylets, run in a fresh process by tests/runtime/test_multinode.py
(the test session's own Ray stays untouched). Prints one JSON line last.

Usage: python tests/runtime/multinode_scenarios.py RUN_ROOT [--iterations N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MAIN_JOB = ROOT / "configs" / "maniskill_pushcube_ppo_mlp.yaml"
SMALL = ["env.num_envs=4", "env.num_processes=0", "env.max_episode_steps=10",
         "env.success_hold_steps=1", "env.success_hold_ramp=null",
         "trainer.rollout_steps=20", "trainer.update_epochs=1", "trainer.num_minibatches=2",
         "trainer.eval_every=0", "eval.num_videos=0", "trainer.target_success=null",
         "logging.tensorboard=false", "logging.console=false", "cluster.num_cpu_devices=1"]


def placement(root: Path, name: str, env_device: str) -> str:
    p = root / f"{name}.yaml"
    p.write_text("placement: {context_switch: true, groups: {env: {devices: '%s'}, "
                 "rollout: {devices: '0'}, actor: {devices: '0'}}}\n" % env_device)
    return str(p)


def worker_nodes(group) -> list:
    return [devs[0].node_id for devs in group.rank_devices]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--iterations", type=int, default=2)
    args = ap.parse_args()
    root = Path(args.root)
    it = args.iterations

    from rlinf_embodied.config import load_config
    from rlinf_embodied.elastic.multinode import LocalMultiNodeCluster
    from rlinf_embodied.elastic.runner import ElasticEmbodiedRunner, load_records
    from rlinf_embodied.runners.embodied import EmbodiedRunner

    out: dict = {}
    with LocalMultiNodeCluster(head_cpus=2, preemptible_nodes=1, node_cpus=2, reserved_nodes=1) as mn:
        out["head"] = mn.head_node_id
        out["second"] = mn.worker_node_ids()[0]
        out["reserved_worker"] = mn.reserved[0]
        # 1) the main job, placed: env workers on the reserved worker node (device 1; the
        #    preemptible node has no device id), rollout + actor on the head
        cfg = load_config(MAIN_JOB, SMALL + [f"trainer.iterations={it}", "trainer.save_every=0",
                                             f"placement={placement(root, 'env_on_second', '1')}"])
        r = EmbodiedRunner(cfg, root / "placed")
        out["placed"] = {"env_nodes": worker_nodes(r.g.env), "rollout_nodes": worker_nodes(r.g.rollout),
                         "actor_nodes": worker_nodes(r.g.actor)}
        state = r.run()
        out["placed"].update(iterations=state["iteration"], env_steps=state["env_steps"])

        # 2) elastic: 1 reserved worker on the head, 2 preemptible on the second node; the
        #    second node is killed right after its first shard request of iteration 0 and
        #    comes back at once (a fresh raylet); then the same job without the kill.
        head_only = placement(root, "head_only", "0")
        el = SMALL + [f"trainer.iterations={it}", f"trainer.save_every={it}", f"placement={head_only}",
                      "elastic.enabled=true", "elastic.reserved_workers=1", "elastic.preemptible_workers=2",
                      "elastic.shard_envs=1", "elastic.wait_for_joins=true"]
        kill = el + ["elastic.preemption.mode=schedule", "elastic.preemption.target=node",
                     "elastic.preemption.restart=immediate",
                     "elastic.preemption.schedule=[{iteration: 0, dispatch: 0}]"]
        runs = {}
        for name, over in (("killed", kill), ("clean", el)):
            run_dir = root / name
            runner = ElasticEmbodiedRunner(load_config(MAIN_JOB, over), run_dir, node_provider=mn)
            runs[name] = {"state": runner.run(), "records": load_records(run_dir),
                          "metrics": [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]}
        out["elastic"] = {k: {"iterations": v["state"]["iteration"], "records": v["records"],
                              "metrics": v["metrics"]} for k, v in runs.items()}
        out["killed_nodes"] = mn.killed
        out["live_worker_nodes"] = mn.worker_node_ids()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
