"""Eval tests: make tests/eval importable as plain modules (policy factories by module:function)."""

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
