"""Shared test setup: headless rendering, deterministic seeds, small thread pools."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
