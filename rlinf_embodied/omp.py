"""placeholder: OpenMP wait settings move here from runtime/device.py (issue 34)."""
