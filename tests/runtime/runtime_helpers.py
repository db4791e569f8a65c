"""Helpers shared by the runtime tests."""


def wait_until(predicate, timeout=60.0, interval=0.02, what="condition"):
    """Poll ``predicate`` until true; generous timeout for loaded CI machines."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
