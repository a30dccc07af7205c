"""Warnings about dropped input, rate-limited: a flood of garbage must not flood the logs.

``dropped(log, what, detail)`` logs at most ``BURST`` messages per ``WINDOW`` seconds per
logger and kind; then one line says how many more were dropped silently.

>>> dropped(log, "malformed request", exc)
"""

from __future__ import annotations

import threading
import time

WINDOW = 10.0
BURST = 20

_lock = threading.Lock()
_state: dict[tuple[str, str], list] = {}  # (logger, what) -> [window start, logged, suppressed]


def dropped(log, what: str, detail, *args) -> None:
    """Warn that ``what`` was dropped (``detail % args`` says why), within the rate limit."""
    now = time.monotonic()
    key = (log.name, what)
    with _lock:
        st = _state.get(key)
        if st is None or now - st[0] >= WINDOW:
            suppressed = st[2] if st is not None else 0
            st = _state[key] = [now, 0, 0]
        else:
            suppressed = 0
        st[1] += 1
        if st[1] > BURST:
            st[2] += 1
            return
    if suppressed:
        log.warning("%d more %s dropped in the last %.0f s (not logged)", suppressed, what,
                    WINDOW)
    try:
        text = (str(detail) % args) if args else str(detail)
    except Exception:
        text = f"<{type(detail).__name__}>"
    log.warning("dropped %s: %s", what, text[:300])
