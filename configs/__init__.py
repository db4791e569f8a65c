"""Shipped job configs (``*.yaml``) and placements (``placement/*.yaml``), installed as the
package data of ``rlinf_embodied.configs``: a job or placement name that is not a path resolves
here (``rlinf-embodied config show maniskill_pushcube_ppo_mlp``, ``placement: collocated``)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent
"""Directory of the shipped YAML files (in the clone, or inside the installed package)."""
