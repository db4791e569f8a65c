"""``rlinf-embodied plan CONFIG.yaml [--devices N] [--json]``: the text the command prints."""

from __future__ import annotations

from rlinf_embodied.scheduler.auto import graph_from_config, plan_config, profile_for_config
from rlinf_embodied.scheduler.planner import report_json, report_text

__all__ = ["plan_command"]


def _default_devices(cfg) -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count()
    except ImportError:  # pragma: no cover
        pass
    return max(1, cfg.cluster.num_cpu_devices)


def plan_command(
    config_path: str, devices: int | None, as_json: bool, overrides: list[str]
) -> str:
    """Plan a job and return the report to print.

    The profile is the one cached in the job's run directory for this config and hardware
    (written by ``train ... placement=auto``), else the documented analytic default profile;
    the first line of the report names which.

    Args:
        config_path: Job YAML.
        devices: Devices to plan for; None uses this machine's (CUDA devices, else
            ``cluster.num_cpu_devices``).
        as_json: Return canonical JSON instead of text.
        overrides: Dotted ``key=value`` overrides.

    Returns:
        The report; byte-identical for the same config, devices and profile.

    Raises:
        ConfigError: for an invalid config.
        ValueError: if ``devices`` < 1 or no plan fits in memory.
    """
    from rlinf_embodied.config import load_config
    from rlinf_embodied.reasoning.config import is_reasoning_job

    if is_reasoning_job(config_path):
        from rlinf_embodied.scheduler.reasoning import reasoning_plan_command

        return reasoning_plan_command(config_path, devices, as_json, overrides)
    cfg = load_config(config_path, overrides)
    n = devices if devices is not None else _default_devices(cfg)
    profile = profile_for_config(cfg, cfg.run.run_dir())
    result = plan_config(cfg, n, profile)
    g = graph_from_config(cfg)
    workload = {
        "num_envs": cfg.env.num_envs,
        "rollout_steps": cfg.trainer.rollout_steps,
        "actor_samples": g.node("actor").items,
    }
    if as_json:
        return report_json(result, {"config": str(config_path), "workload": workload}) + "\n"
    header = [
        f"Plan for {config_path}",
        f"Workload per iteration: N={workload['num_envs']} envs x T={workload['rollout_steps']} "
        f"steps, actor trains on {workload['actor_samples']} samples",
    ]
    return report_text(result, header)
