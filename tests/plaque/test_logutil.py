"""Dropped-input warnings are rate-limited, and say how many were not logged."""

import logging

from plaque import logutil


def test_a_flood_of_drops_logs_a_burst_then_a_count(caplog, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(logutil.time, "monotonic", lambda: clock[0])
    log = logging.getLogger("test.flood")
    with caplog.at_level(logging.WARNING, logger="test.flood"):
        for i in range(logutil.BURST + 50):
            logutil.dropped(log, "a bad message", "number %d", i)
        assert len(caplog.records) == logutil.BURST
        clock[0] += logutil.WINDOW
        logutil.dropped(log, "a bad message", "after the window")
    texts = [r.getMessage() for r in caplog.records]
    assert texts[0] == "dropped a bad message: number 0"
    assert texts[-2] == f"50 more a bad message dropped in the last {logutil.WINDOW:.0f} s" \
        " (not logged)"
    assert texts[-1] == "dropped a bad message: after the window"


def test_details_that_cannot_be_printed_do_not_break_logging(caplog):
    class Evil:
        def __str__(self):
            raise RuntimeError("no")

    with caplog.at_level(logging.WARNING):
        logutil.dropped(logging.getLogger("test.evil"), "a thing", Evil())
    assert caplog.records[-1].getMessage() == "dropped a thing: <Evil>"
