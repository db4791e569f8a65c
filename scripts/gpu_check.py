"""One-command check of every accelerator path (`make gpu-check`); prints one JSON line last.

Run on a machine with one CUDA GPU (under 10 minutes there). Each check runs the project's real
code on the GPU: CUDA placement and visibility of a worker, nccl FSDP2 with CPU offload, the
main PPO job on ManiSkill's GPU simulator at a few hundred envs, the tiny OpenVLA-OFT in bf16,
EGL rendering of LIBERO, and vLLM's GPU engine. Without CUDA every check is reported as
``skipped`` with the reason, so the script also runs (in seconds) on CPU machines and in CI.

Usage: ``python scripts/gpu_check.py [--quick] [--only NAME ...]``. Exit code 1 if a check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

CHECKS = ("cuda_placement", "fsdp2_nccl_offload", "maniskill_gpu_ppo", "oft_tiny_bf16",
          "vla_sft_rl_miniature", "libero_egl_render", "vllm_engine")


class Skip(Exception):
    """A check that cannot run here (reason in the message)."""


def _ray():
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, namespace="gpu_check")
    from rlinf_embodied.runtime import Cluster

    return Cluster()


def check_cuda_placement(quick: bool) -> dict:
    """A worker placed on global device 0 sees exactly its GPU and computes on it."""
    from rlinf_embodied.runtime import Worker, WorkerGroup

    class Probe(Worker):
        def facts(self):
            import torch

            x = torch.ones(1024, 1024, device=self.torch_device)
            return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "torch_device": self.torch_device,
                    "device_count": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0),
                    "matmul_sum": float((x @ x).sum())}

    cluster = _ray()
    gpus = [d for d in cluster.devices if d.kind == "gpu"]
    if not gpus:
        raise RuntimeError(f"Ray sees no GPU although torch does: {cluster.describe()}")
    g = WorkerGroup(cluster, Probe, "probe", [gpus[0].global_id])
    try:
        f = g.facts().wait()[0]
    finally:
        g.shutdown()
    ok = f["device_count"] == 1 and f["torch_device"] == "cuda:0" and f["matmul_sum"] == 1024.0 ** 3
    if not ok:
        raise RuntimeError(f"unexpected placement facts {f}")
    return f


def check_fsdp2_nccl_offload(quick: bool) -> dict:
    """A one-rank actor-style group joins an nccl process group and trains an FSDP2 module with
    CPUOffloadPolicy for a few steps (loss must fall)."""
    from rlinf_embodied.runtime import Worker, WorkerGroup

    class Trainer(Worker):
        def train(self, steps):
            import torch
            from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1)).cuda()
            fully_shard(model, offload_policy=CPUOffloadPolicy())
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            x = torch.randn(512, 64, device="cuda")
            y = x[:, :1].clone()
            losses = []
            for _ in range(steps):
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss))
            param_device = str(next(model.parameters()).to_local().device)
            return {"losses": [losses[0], losses[-1]], "param_device": param_device}

    cluster = _ray()
    gpus = [d.global_id for d in cluster.devices if d.kind == "gpu"][:1]
    g = WorkerGroup(cluster, Trainer, "fsdp", gpus)
    try:
        backend = g.init_process_group()
        out = g.train(10 if quick else 50).wait()[0]
    finally:
        g.shutdown()
    if backend != "nccl" or not out["losses"][1] < out["losses"][0] or out["param_device"] != "cpu":
        raise RuntimeError(f"backend {backend}, {out}")
    return {"backend": backend, **out}


def _train_job(cfg, run_dir: Path) -> dict:
    from rlinf_embodied.runners.embodied import EmbodiedRunner

    state = EmbodiedRunner(cfg, run_dir).run()
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    return {"iterations": state["iteration"], "env_steps": state["env_steps"],
            "env_steps_per_s": last.get("time/env_steps_per_s"),
            "episode_return": last.get("rollout/episode_return")}


def check_maniskill_gpu_ppo(quick: bool) -> dict:
    """The main job (configs/maniskill_pushcube_ppo_mlp.yaml) on physx_cuda at 256 envs with
    FSDP offload, for 2 iterations (the main job's own ranks, placement and loss)."""
    from rlinf_embodied.config import load_config

    _ray()
    n = 128 if quick else 256
    cfg = load_config(ROOT / "configs/maniskill_pushcube_ppo_mlp.yaml", [
        "env.sim_backend=physx_cuda", f"env.num_envs={n}", "env.num_processes=0", "trainer.iterations=2",
        "trainer.eval_every=0", "trainer.save_every=0", "trainer.offload=true", "eval.num_videos=0",
        "logging.tensorboard=false", "logging.console=false"])
    with tempfile.TemporaryDirectory() as d:
        out = _train_job(cfg, Path(d) / "run")
    if out["iterations"] != 2 or not out["env_steps"]:
        raise RuntimeError(f"training did not run: {out}")
    return {"num_envs": n, **out}


def check_oft_tiny_bf16(quick: bool) -> dict:
    """The tiny OpenVLA-OFT (configs/libero_spatial_grpo_openvla_oft_tiny.yaml's policy) built in
    bf16 on CUDA: act, then evaluate reproduces the logprobs."""
    import torch
    from rlinf_embodied.policies import build_policy
    from rlinf_embodied.policies.base import SpaceSpec

    from rlinf_embodied.config import load_config
    from rlinf_embodied.workers.common import synthetic_obs

    cfg = load_config(ROOT / "configs/libero_spatial_grpo_openvla_oft_tiny.yaml", ["policy.dtype=bfloat16"])
    s = cfg.env.image_size
    spec = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=cfg.policy.proprio_dim,
                     image_shape=(s, s, 3), wrist_image_shape=(s, s, 3))
    torch.manual_seed(0)
    policy = build_policy(cfg.policy, spec).cuda().eval()
    dtypes = sorted({str(p.dtype) for p in policy.parameters()})
    obs = synthetic_obs(spec.to_dict(), 4, task="put the bowl on the plate")
    obs = {k: v.cuda() if torch.is_tensor(v) else v for k, v in obs.items()}
    with torch.no_grad():
        out = policy.act(obs, mode="sample")
        ev = policy.evaluate(out.forward_inputs, out.actions)
    err = float((ev.logprobs.float() - out.logprobs.float()).abs().max())
    if "torch.bfloat16" not in dtypes or not torch.isfinite(out.actions).all() or err > 1e-2:
        raise RuntimeError(f"dtypes {dtypes}, logprob mismatch {err}")
    return {"param_dtypes": dtypes, "actions_shape": list(out.actions.shape), "logprob_max_abs_err": err}


def check_vla_sft_rl_miniature(quick: bool) -> dict:
    """The miniature OpenVLA-OFT SFT -> RL pipeline (configs/sft/maniskill_lang3_sft_rl_oft.yaml)
    at smoke size on CUDA: 1 demo per task of 2 suite tasks at 32 px (rendered on the GPU; the
    suite mixes tasks per env slot, so physics is physx_cpu per slot), SFT in bf16 on the GPU,
    the step-0 gate, 2 GRPO iterations, evaluation of both checkpoints; about 2 minutes."""
    from rlinf_embodied.sft.pipeline import load_sft_config, run_sft_rl

    _ray()
    with tempfile.TemporaryDirectory() as d:
        cfg = load_sft_config(ROOT / "configs/sft/maniskill_lang3_sft_rl_oft.yaml", [
            f"run.dir={d}/run", f"demos.dir={d}/demos", "demos.num_trajectories=1",
            "env.task_ids=[0,1]", "env.sensor_size=32", "policy.tiny.image_size=32",
            "env.max_episode_steps=24", "bc.steps=30", "bc.batch_size=16", "eval.episodes=1",
            "eval.gate_episodes=1", "rl.overrides=[trainer.iterations=2,trainer.eval_every=0,"
            "trainer.save_every=2,env.num_envs=4,algorithm.group_size=2,algorithm.filter_low=null,"
            "algorithm.filter_high=null,logging.tensorboard=false]"])
        out = run_sft_rl(cfg, log=lambda *_: None)
        import torch
        from rlinf_embodied.policies import load_policy

        dtypes = sorted({str(p.dtype) for p in load_policy(Path(d) / "run/sft/policy").parameters()})
    if "torch.bfloat16" not in dtypes:
        raise RuntimeError(f"the SFT checkpoint's dtypes are {dtypes}, not bf16 (policy.dtype=auto on CUDA)")
    return {"sft_success": out["sft"]["rate"], "rl_success": out["rl"]["rate"],
            "stages": out.get("stages"), "param_dtypes": dtypes, "cuda": torch.cuda.get_device_name(0)}


def check_libero_egl_render(quick: bool) -> dict:
    """A LIBERO env renders its two cameras through EGL on the GPU (MUJOCO_EGL_DEVICE_ID=0)."""
    import torch

    os.environ.setdefault("MUJOCO_EGL_DEVICE_ID", "0")
    from rlinf_embodied.envs import make_env

    from rlinf_embodied.config import load_config

    cfg = load_config(ROOT / "configs/libero_spatial_grpo_openvla_oft_tiny.yaml",
                      ["env.num_envs=1", "env.num_processes=0", "env.image_size=128"])
    env = make_env(cfg.env)
    try:
        t0 = time.perf_counter()
        obs, _ = env.reset(seed=0)
        steps = 5 if quick else 20
        for _ in range(steps):
            obs, *_ = env.step(torch.zeros(1, 7))
        dt = (time.perf_counter() - t0) / (steps + 1)
    finally:
        env.close()
    img = obs["main_images"].float()
    if img.std() == 0:
        raise RuntimeError("rendered image is constant (EGL produced no picture)")
    return {"image_shape": list(obs["main_images"].shape), "seconds_per_step": dt,
            "egl_device": os.environ["MUJOCO_EGL_DEVICE_ID"]}


def check_vllm_engine(quick: bool) -> dict:
    """vLLM's GPU engine generates from a tiny random Llama built from config (no download)."""
    if importlib.util.find_spec("vllm") is None:
        raise Skip("vllm is not installed (optional GPU extra)")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=4, max_position_embeddings=256)).save_pretrained(d)
        llm = LLM(model=d, skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
                  gpu_memory_utilization=0.2, max_model_len=256)
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}] * 8,
                            SamplingParams(max_tokens=32, temperature=1.0, seed=0, detokenize=False))
        dt = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    if tokens == 0:
        raise RuntimeError("vLLM generated no tokens")
    return {"generated_tokens": tokens, "tokens_per_s": tokens / dt}


def run(names, quick: bool) -> dict:
    """Run the named checks; each entry: status ok / skipped / failed, seconds, details."""
    import torch

    cuda = torch.cuda.is_available()
    out = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            if not cuda and name != "vllm_engine":
                raise Skip("no CUDA")
            if not cuda:  # vllm: say first whether it is installed at all
                if importlib.util.find_spec("vllm") is None:
                    raise Skip("no CUDA; vllm is not installed (optional GPU extra)")
                raise Skip("no CUDA")
            entry = {"status": "ok", **globals()[f"check_{name}"](quick)}
        except Skip as s:
            entry = {"status": "skipped", "reason": str(s)}
        except Exception as e:  # noqa: BLE001 - reported in the JSON line, exit code 1
            entry = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc(limit=6)}
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        out[name] = entry
    return {"cuda": cuda, "device": torch.cuda.get_device_name(0) if cuda else None,
            "torch": torch.__version__, "checks": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (half the envs, fewer steps)")
    ap.add_argument("--only", nargs="*", choices=CHECKS, help="run only these checks")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    result = run(args.only or CHECKS, args.quick)
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
    result["seconds"] = round(time.perf_counter() - t0, 3)
    result["summary"] = {s: sum(c["status"] == s for c in result["checks"].values())
                         for s in ("ok", "skipped", "failed")}
    print(json.dumps(result))
    return 1 if result["summary"]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
