"""PlacementPlan: which global devices each worker group runs on (paper sections 3.3, 4).

Placement is data: collocated (temporal: every group on the same devices, taking turns through
the device lock), disaggregated (spatial: disjoint devices, pipelined through channels) and
hybrid (anything in between) are three YAML files over one runner::

    placement:
      context_switch: true
      offload: true          # move state off the devices at each switch (false: stay resident)
      groups:
        env:     {devices: "0"}
        rollout: {devices: "1-"}
        actor:   {devices: all, procs_per_device: 1}
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any, Mapping, Sequence

COLLOCATED, DISAGGREGATED, HYBRID = "collocated", "disaggregated", "hybrid"


class PlacementError(ValueError):
    """A placement that cannot run on this cluster; the message names the field and the fix."""


@dataclasses.dataclass
class GroupPlacement:
    """Where one worker group runs."""

    devices: str = "all"
    """Global device ids: ``"all"``, a range ``"0-3"``, an open range ``"2-"`` (2 to the last
    device), a list ``"0,2"`` or a mix ``"0-1,4"``."""
    procs_per_device: int = 1
    """Worker processes per device (ranks = devices x procs_per_device); raise it to run
    several CPU-bound workers (e.g. simulator processes) per device."""


@dataclasses.dataclass
class PlacementPlan:
    """Worker group -> devices, for every group of a job."""

    groups: dict[str, GroupPlacement] = dataclasses.field(default_factory=dict)
    """Group name -> placement; the runner's groups (e.g. env, rollout, actor)."""
    context_switch: bool = True
    """Let groups share devices by taking turns (device lock with onload/offload). Turn it off
    only when every group has devices of its own; sharing then fails validation."""
    offload: bool = True
    """With ``context_switch``: move a group's state off the devices at every switch (RLinf's
    context switching, for jobs that do not fit at once). False keeps every group resident and
    only takes turns (the scheduler picks it when the plan fits in device memory)."""

    # ---- parsing ---------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PlacementPlan":
        """Parse ``{placement: {...}}`` or the inner mapping, strictly.

        Raises:
            PlacementError: On an unknown key (the message lists the valid ones) or a bad type.
        """
        if set(data) == {"placement"}:
            data = data["placement"]
        _check_keys(data, PlacementPlan, "placement")
        groups = {}
        for name, spec in (data.get("groups") or {}).items():
            spec = dict(spec or {})
            _check_keys(spec, GroupPlacement, f"placement.groups.{name}")
            if "devices" in spec:
                spec["devices"] = _devices_to_str(spec["devices"])
            groups[str(name)] = GroupPlacement(**spec)
        return cls(groups=groups, context_switch=bool(data.get("context_switch", True)),
                   offload=bool(data.get("offload", True)))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "PlacementPlan":
        """Load a placement YAML file (see the module docstring for its shape).

        Raises:
            PlacementError: the file is not valid YAML, not a mapping, or not a placement.
        """
        from omegaconf import DictConfig, OmegaConf

        try:
            raw = OmegaConf.load(path)
        except Exception as e:  # noqa: BLE001 - yaml.YAMLError and friends
            mark = getattr(e, "problem_mark", None)
            why = getattr(e, "problem", None) or type(e).__name__
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise PlacementError(f"not valid YAML ({why}{at}); fix the file or name a shipped "
                                 "placement") from None
        if not isinstance(raw, DictConfig):
            raise PlacementError("not a placement (a mapping with a groups: section); see "
                                 "configs/placement/*.yaml")
        return cls.from_dict(OmegaConf.to_container(raw, resolve=True))

    # ---- queries ---------------------------------------------------------------------------

    def group(self, name: str) -> GroupPlacement:
        """Placement of group ``name``.

        Raises:
            PlacementError: If the plan has no such group.
        """
        if name not in self.groups:
            raise PlacementError(
                f"placement.groups has no group {name!r} (groups: {sorted(self.groups)}); add it "
                f"to the placement YAML."
            )
        return self.groups[name]

    def device_ids(self, name: str, num_devices: int) -> list[int]:
        """Global device ids of group ``name`` on a cluster of ``num_devices`` devices."""
        spec = self.group(name)
        return parse_device_ids(spec.devices, num_devices, where=f"placement.groups.{name}.devices")

    def validate(self, num_devices: int) -> None:
        """Check the plan against a cluster of ``num_devices`` devices.

        Raises:
            PlacementError: No groups; a group with no devices or ids outside the cluster;
                procs_per_device < 1; groups sharing devices while context_switch is off.
        """
        if not self.groups:
            raise PlacementError(
                "placement.groups is empty; add at least one group, e.g. "
                "groups: {actor: {devices: all}}."
            )
        for name, spec in self.groups.items():
            if spec.procs_per_device < 1:
                raise PlacementError(
                    f"placement.groups.{name}.procs_per_device must be >= 1 "
                    f"(got {spec.procs_per_device})."
                )
            self.device_ids(name, num_devices)
        if not self.context_switch:
            for a, b in itertools.combinations(self.groups, 2):
                shared = sorted(set(self.device_ids(a, num_devices)) & set(self.device_ids(b, num_devices)))
                if shared:
                    raise PlacementError(
                        f"placement.groups {a} and {b} share devices {shared} while "
                        f"placement.context_switch is false; set context_switch: true or give "
                        f"the groups disjoint devices."
                    )

    def shares_devices(self, name: str, num_devices: int) -> bool:
        """Whether group ``name`` shares a device with another group (so it must switch)."""
        mine = set(self.device_ids(name, num_devices))
        return any(mine & set(self.device_ids(o, num_devices)) for o in self.groups if o != name)

    def mode(self, num_devices: int) -> str:
        """``"collocated"`` (all groups on the same devices), ``"disaggregated"`` (pairwise
        disjoint devices) or ``"hybrid"`` (anything else)."""
        sets = [frozenset(self.device_ids(n, num_devices)) for n in self.groups]
        if len(set(sets)) == 1:
            return COLLOCATED
        if all(not (a & b) for a, b in itertools.combinations(sets, 2)):
            return DISAGGREGATED
        return HYBRID

    def describe(self, num_devices: int) -> str:
        """Multi-line summary printed at start: the mode, then each group's devices and ranks.

        Raises:
            PlacementError: If the plan is invalid (see :meth:`validate`).
        """
        self.validate(num_devices)
        switching = ("on" + ("" if self.offload else ", state stays resident")) if self.context_switch else "off"
        lines = [
            f"placement: {self.mode(num_devices)} over {num_devices} devices, "
            f"context switching {switching}"
        ]
        width = max(len(n) for n in self.groups)
        for name, spec in self.groups.items():
            ids = self.device_ids(name, num_devices)
            others = [
                o for o in self.groups
                if o != name and set(ids) & set(self.device_ids(o, num_devices))
            ]
            note = f"  (takes turns with {', '.join(others)})" if others else ""
            lines.append(
                f"  {name:<{width}}  devices {_ranges(ids):<10} x{spec.procs_per_device} proc "
                f"-> {len(ids) * spec.procs_per_device} rank(s){note}"
            )
        return "\n".join(lines)


def parse_device_ids(spec: str | int | Sequence[int], num_devices: int, where: str = "devices") -> list[int]:
    """Parse a device-id set: ``"all"``, ``"0-3"``, ``"0,2"``, ``"0-1,4"``, ``"2-"`` (2 to the
    last device), an int or a list.

    Args:
        spec: The set as written in YAML or code.
        num_devices: Devices in the cluster (ids 0..num_devices-1).
        where: Name of the field, for error messages.

    Returns:
        Sorted, distinct global device ids.

    Raises:
        PlacementError: If the set is empty, malformed, or names ids outside the cluster.
    """
    text = _devices_to_str(spec).strip()
    if text == "all":
        return list(range(num_devices))
    ids: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, dash, hi = part.partition("-")
            first = int(lo)
            last = int(hi) if hi else (max(first, num_devices - 1) if dash else first)
            if last < first:
                raise ValueError
            ids.update(range(first, last + 1))
    except ValueError:
        raise PlacementError(
            f"{where} {text!r} is not a device set; write 'all', a range like '0-3' or a list "
            f"like '0,2'."
        ) from None
    if not ids:
        raise PlacementError(f"{where} is empty; use 'all', a range like '0-3' or a list like '0,2'.")
    outside = sorted(i for i in ids if not 0 <= i < num_devices)
    if outside:
        raise PlacementError(
            f"{where} {text!r} names device(s) {outside} outside this cluster's devices "
            f"0-{num_devices - 1}; use ids in 0-{num_devices - 1} or 'all' (on a "
            f"machine without GPUs, cluster.num_cpu_devices sets the number of devices)."
        )
    return sorted(ids)


def _devices_to_str(spec: Any) -> str:
    if isinstance(spec, (list, tuple)):
        return ",".join(str(i) for i in spec)
    return str(spec)


def _ranges(ids: list[int]) -> str:
    """Compact form of sorted ids: [0, 1, 2, 5] -> '0-2,5'."""
    parts = []
    for _, run in itertools.groupby(enumerate(ids), key=lambda p: p[1] - p[0]):
        run = [i for _, i in run]
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


def _check_keys(data: Mapping[str, Any], schema: type, where: str) -> None:
    valid = [f.name for f in dataclasses.fields(schema)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise PlacementError(f"{where} has unknown key(s) {unknown}; valid keys: {valid}.")
