"""π0 / π0.5 checkpoints in the two published PyTorch layouts.

**LeRobot** (``lerobot/pi0_base``, ``lerobot/pi05_base``, ``lerobot/pi05_libero``; written by
``PreTrainedPolicy.save_pretrained``): ``config.json`` with ``type`` ``pi0`` / ``pi05``,
``paligemma_variant``, ``action_expert_variant``, ``chunk_size``, ``n_action_steps``,
``max_state_dim``, ``max_action_dim``, ``num_inference_steps``, ``image_resolution``,
``tokenizer_max_length``, ``input_features`` / ``output_features``, ``normalization_mapping``;
``model.safetensors`` whose keys are the module tree of ``PI0Pytorch`` prefixed by ``model.``;
``policy_preprocessor.json`` whose ``normalizer_processor`` step names a safetensors file of
``observation.state.{mean,std,q01,q99,...}`` and ``action.{...}`` statistics (and the matching
``policy_postprocessor`` files). Source: huggingface/lerobot ``src/lerobot/policies/pi0/``,
``pi05/``, ``pi_gemma.py``, ``processor/normalize_processor.py``, ``processor/pipeline.py``.

**openpi** (``examples/convert_jax_model_to_pytorch.py`` of Physical-Intelligence/openpi):
``config.json`` with ``action_dim``, ``action_horizon``, ``paligemma_variant``,
``action_expert_variant``, ``precision``; ``model.safetensors`` with the same key names
without the prefix; ``assets/<asset id>/norm_stats.json`` (``{"norm_stats": {"state": {...},
"actions": {...}}}``). The layout does not say π0 or π0.5: the keys do (``time_mlp_in`` and
adaptive norms ``*.dense.*`` are π0.5's).

Both files are written with ``safetensors.torch.save_model``, which keeps one name of tied
tensors: PaliGemma's token embedding is stored as ``paligemma.lm_head.weight`` (tied to
``...language_model.embed_tokens.weight``), and the action expert's unused vocabulary head
``gemma_expert.lm_head.weight`` is stored too (random in openpi's conversion). The loader maps
the first onto the embedding and drops the second; every other key must match the model
exactly (no missing or unexpected keys), with the shapes of ``config.json``'s variants.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from rlinf_embodied.policies.pi0_arch import VOCAB_SIZE, PiArch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

__all__ = ["PiCheckpoint", "detect_layout", "load_pi_checkpoint", "published_keys", "save_pi_checkpoint"]

PREFIX = "paligemma_with_expert."
EMBED = PREFIX + "paligemma.model.language_model.embed_tokens.weight"
VLM_HEAD = PREFIX + "paligemma.lm_head.weight"
EXPERT_HEAD = PREFIX + "gemma_expert.lm_head.weight"
WEIGHTS = "model.safetensors"
PRE, POST = "policy_preprocessor.json", "policy_postprocessor.json"


def published_keys(arch: PiArch, layout: str = "openpi") -> list[str]:
    """Every key of a published ``model.safetensors`` for ``arch``, as upstream writes them.

    Written out from the published module tree (openpi ``convert_jax_model_to_pytorch.py``
    targets; LeRobot prepends ``model.``): 812 keys for π0.5 and 777 for π0 at full size.
    """
    v, p = PREFIX + "paligemma.model.vision_tower.vision_model.", PREFIX + "paligemma.model."
    keys = [v + "embeddings.patch_embedding.weight", v + "embeddings.patch_embedding.bias",
            v + "embeddings.position_embedding.weight"]
    for i in range(arch.vision.depth):
        blk = f"{v}encoder.layers.{i}."
        keys += [blk + f"{m}.{w}" for m in ("layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2",
                                             "self_attn.q_proj", "self_attn.k_proj",
                                             "self_attn.v_proj", "self_attn.out_proj")
                 for w in ("weight", "bias")]
    keys += [v + "post_layernorm.weight", v + "post_layernorm.bias",
             p + "multi_modal_projector.linear.weight", p + "multi_modal_projector.linear.bias"]

    def gemma(root: str, depth: int, adaptive: bool) -> list[str]:
        out = []
        norm = ("dense.weight", "dense.bias") if adaptive else ("weight",)
        for i in range(depth):
            blk = f"{root}layers.{i}."
            out += [blk + f"self_attn.{n}_proj.weight" for n in ("q", "k", "v", "o")]
            out += [blk + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
            out += [blk + f"{n}.{w}" for n in ("input_layernorm", "post_attention_layernorm") for w in norm]
        return out + [root + f"norm.{w}" for w in norm]

    keys += gemma(p + "language_model.", arch.vlm.depth, False) + [VLM_HEAD]
    keys += gemma(PREFIX + "gemma_expert.model.", arch.expert.depth, arch.pi05) + [EXPERT_HEAD]
    proj = ["action_in_proj", "action_out_proj"] + (
        ["time_mlp_in", "time_mlp_out"] if arch.pi05
        else ["state_proj", "action_time_mlp_in", "action_time_mlp_out"])
    keys += [f"{n}.{w}" for n in proj for w in ("weight", "bias")]
    return ["model." + k for k in keys] if layout == "lerobot" else keys


def detect_layout(path: str | os.PathLike) -> str:
    """``lerobot`` or ``openpi`` from ``config.json``.

    Raises:
        FileNotFoundError: no ``config.json`` / ``model.safetensors``.
        ValueError: a ``config.json`` of neither layout.
    """
    p = Path(path)
    for name in ("config.json", WEIGHTS):
        if not (p / name).is_file():
            raise FileNotFoundError(
                f"{p / name} is missing: policy.pretrained must be a π0 / π0.5 checkpoint directory "
                "in LeRobot's or openpi's PyTorch layout (config.json + model.safetensors)."
            )
    cfg = json.loads((p / "config.json").read_text())
    if cfg.get("type") in ("pi0", "pi05"):
        return "lerobot"
    if "action_horizon" in cfg and "paligemma_variant" in cfg:
        return "openpi"
    raise ValueError(
        f"{p / 'config.json'} is neither LeRobot's π0 layout (type pi0 / pi05) nor openpi's "
        f"PyTorch conversion (action_horizon, paligemma_variant); keys: {sorted(cfg)}."
    )


class PiCheckpoint:
    """A published checkpoint directory, read: architecture, statistics, settings.

    Attributes:
        layout: ``lerobot`` or ``openpi``.
        arch: the :class:`~rlinf_embodied.policies.pi0_arch.PiArch` of its weights.
        config: the parsed ``config.json``.
        stats: ``{"state": {...}, "action": {...}}`` statistics (lists of floats).
        modes: normalisation per key (``mean_std``, ``quantiles``, ``identity``).
        cameras: image inputs the model was trained with (LeRobot: the VISUAL features; openpi:
            None, not recorded).
    """

    def __init__(self, path: str | os.PathLike, unnorm_key: str | None = None):
        self.path = Path(path)
        self.layout = detect_layout(self.path)
        self.config = json.loads((self.path / "config.json").read_text())
        with safe_open(str(self.path / WEIGHTS), "pt") as f:
            self.shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        strip = "model." if self.layout == "lerobot" else ""
        names = {k.removeprefix(strip) for k in self.shapes}
        pi05 = "time_mlp_in.weight" in names
        if self.layout == "lerobot" and (self.config["type"] == "pi05") != pi05:
            raise ValueError(f"{self.path}: config.json says {self.config['type']} but the weights are "
                             f"{'π0.5' if pi05 else 'π0'}'s.")
        c = self.config
        vocab = self.shapes.get(strip + EMBED, self.shapes.get(strip + VLM_HEAD, (VOCAB_SIZE,)))[0]
        image = c.get("image_resolution", [None])[0]
        # Padded widths from the weights (openpi's config has one action_dim for both).
        action_dim = self.shapes[strip + "action_in_proj.weight"][1]
        state_dim = self.shapes.get(strip + "state_proj.weight", (0, action_dim))[1]
        self.arch = PiArch.from_variants(c.get("vision_variant", "so400m_14"), c["paligemma_variant"],
                                         c["action_expert_variant"], pi05=pi05, vocab_size=int(vocab),
                                         image_size=image, action_dim=int(action_dim), state_dim=int(state_dim))
        self.cameras = None
        self.unnorm_key = unnorm_key
        if self.layout == "lerobot":
            feats = c.get("input_features") or {}
            self.cameras = [k for k, f in feats.items() if f.get("type") == "VISUAL"]
            self.stats, self.modes = self._lerobot_stats()
        else:
            self.stats, self.modes = self._openpi_stats(unnorm_key), {
                k: "quantiles" if pi05 else "mean_std" for k in ("state", "action")}

    @property
    def horizon(self) -> int:
        """H the model was trained with (LeRobot ``chunk_size``, openpi ``action_horizon``)."""
        return int(self.config.get("chunk_size", self.config.get("action_horizon", 50)))

    def _openpi_stats(self, key: str | None) -> dict[str, dict[str, list[float]]]:
        found = {str(f.parent.relative_to(self.path / "assets")): f
                 for f in sorted((self.path / "assets").rglob("norm_stats.json"))} if (self.path / "assets").is_dir() else {}
        if not found:
            raise FileNotFoundError(f"{self.path} has no assets/<asset id>/norm_stats.json (openpi layout).")
        if key is None and len(found) > 1:
            raise ValueError(f"{self.path} has statistics for {sorted(found)}; set policy.unnorm_key to one.")
        if key is not None and key not in found:
            raise ValueError(f"policy.unnorm_key={key!r} is not in {self.path}/assets (valid keys: {sorted(found)}).")
        if key is None:
            key = next(iter(found))
        self.unnorm_key = key
        raw = json.loads(found[key].read_text())["norm_stats"]
        return {"state": raw["state"], "action": raw["actions"]}

    def _lerobot_stats(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        if not (self.path / PRE).is_file():
            raise FileNotFoundError(f"{self.path / PRE} is missing: LeRobot keeps the normalisation "
                                    "statistics there (copy the processor files of the checkpoint).")
        steps = json.loads((self.path / PRE).read_text()).get("steps", [])
        step = next((s for s in steps if s.get("registry_name") == "normalizer_processor"), None)
        if step is None or "state_file" not in step:
            raise ValueError(f"{self.path / PRE} has no normalizer_processor step with a state_file.")
        flat = load_file(str(self.path / step["state_file"]))
        norm_map = step["config"].get("norm_map", {})
        names = {"MEAN_STD": "mean_std", "QUANTILES": "quantiles", "IDENTITY": "identity"}
        modes = {}
        for key, feat in (("state", "STATE"), ("action", "ACTION")):
            mode = norm_map.get(feat, "IDENTITY")
            if mode not in names:
                raise ValueError(f"{self.path / PRE}: {feat} normalisation {mode} is not supported "
                                 f"(supported: {', '.join(names)}).")
            modes[key] = names[mode]
        stats = {"state": {}, "action": {}}
        for k, v in flat.items():
            feat, stat = k.rsplit(".", 1)
            key = {"observation.state": "state", "action": "action"}.get(feat)
            if key is not None:
                stats[key][stat] = v.float().tolist()
        return stats, modes

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under :class:`~rlinf_embodied.policies.pi0_model.PiFlowModel`'s names
        (tied embedding mapped, the expert's vocabulary head dropped)."""
        raw = load_file(str(self.path / WEIGHTS))
        if self.layout == "lerobot":
            raw = {k.removeprefix("model."): v for k, v in raw.items()}
        head = raw.pop(VLM_HEAD, None)
        if EMBED not in raw and head is not None:
            raw[EMBED] = head
        raw.pop(EXPERT_HEAD, None)
        return raw


def load_pi_checkpoint(model: torch.nn.Module, ckpt: PiCheckpoint) -> None:
    """Load ``ckpt``'s weights into ``model`` strictly.

    Raises:
        ValueError: missing or unexpected keys, or shapes that differ (names the first few).
    """
    sd = ckpt.state_dict()
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
    bad = [k for k in set(own) & set(sd) if tuple(own[k].shape) != tuple(sd[k].shape)]
    if missing or unexpected or bad:
        raise ValueError(
            f"{ckpt.path / WEIGHTS} does not fit the {ckpt.config.get('type', 'openpi')} model of its "
            f"config.json: {len(missing)} missing keys {missing[:5]}, {len(unexpected)} unexpected "
            f"{unexpected[:5]}, {len(bad)} shape mismatches {sorted(bad)[:5]}."
        )
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in sd.items()}, strict=True)


def save_pi_checkpoint(model: torch.nn.Module, path: str | os.PathLike, layout: str, *,
                       config: dict[str, Any], stats: dict[str, dict[str, Any]],
                       modes: dict[str, str], asset_id: str = "rlinf_embodied") -> Path:
    """Write ``model`` in a published layout (the inverse of :class:`PiCheckpoint`).

    The tied embedding is written as ``paligemma.lm_head.weight`` and the expert's unused
    vocabulary head as zeros, as upstream's ``save_model`` leaves them.

    Args:
        model: a :class:`~rlinf_embodied.policies.pi0_model.PiFlowModel`.
        path: output directory (created).
        layout: ``lerobot`` or ``openpi``.
        config: the ``config.json`` dict to write.
        stats: ``{"state": {...}, "action": {...}}`` lists of floats.
        modes: normalisation per key (LeRobot's ``norm_map``).
        asset_id: openpi: the ``assets/`` sub-directory of the statistics.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    sd[VLM_HEAD] = sd.pop(EMBED)
    width = model.arch.expert.width
    sd[EXPERT_HEAD] = torch.zeros(model.arch.vocab_size, width, dtype=sd[VLM_HEAD].dtype)
    if layout == "lerobot":
        sd = {"model." + k: v for k, v in sd.items()}
    save_file(sd, str(path / WEIGHTS), metadata={"format": "pt"})
    os.chmod(path / WEIGHTS, 0o644)  # safetensors writes 0600; the other files are 0644
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if layout == "openpi":
        stats_dir = path / "assets" / asset_id
        stats_dir.mkdir(parents=True, exist_ok=True)
        body = {"norm_stats": {"state": stats["state"], "actions": stats["action"]}}
        (stats_dir / "norm_stats.json").write_text(json.dumps(body, indent=2))
        return path
    upper = {"mean_std": "MEAN_STD", "quantiles": "QUANTILES", "identity": "IDENTITY"}
    norm_map = {"VISUAL": "IDENTITY", "STATE": upper[modes["state"]], "ACTION": upper[modes["action"]]}
    flat = {f"{feat}.{n}": torch.tensor(vals, dtype=torch.float32)
            for feat, key in (("observation.state", "state"), ("action", "action"))
            for n, vals in stats[key].items()}
    for name, registry, index in ((PRE, "normalizer_processor", 4), (POST, "unnormalizer_processor", 0)):
        state_file = f"{name.removesuffix('.json')}_step_{index}_{registry}.safetensors"
        save_file(flat if registry == "normalizer_processor" else
                  {k: v for k, v in flat.items() if k.startswith("action.")}, str(path / state_file))
        os.chmod(path / state_file, 0o644)
        steps = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
                 {"registry_name": "to_batch_processor", "config": {}},
                 {"registry_name": "tokenizer_processor", "config": {
                     "max_length": config.get("tokenizer_max_length", 48), "padding_side": "right",
                     "padding": "max_length", "tokenizer_name": "google/paligemma-3b-pt-224"}},
                 {"registry_name": "device_processor", "config": {"device": "cpu"}}] if index else []
        steps.insert(index, {"registry_name": registry, "config": {
            "eps": 1e-8, "features": {}, "norm_map": norm_map}, "state_file": state_file})
        if name == POST:
            steps.append({"registry_name": "device_processor", "config": {"device": "cpu"}})
        body = {"name": name.removesuffix(".json"), "steps": steps}
        (path / name).write_text(json.dumps(body, indent=2))
    return path
