"""The dashboard in a real browser: Debian's Chromium, headless, driven by Selenium through
Debian's chromedriver (nothing is downloaded). The page loads without console errors, shows
every device, its numbers move while a workload runs, a killed host turns red; a screenshot is
saved (``$PATHWAYS_ARTIFACTS``, else the test's temporary directory). How fast the page is
is measured by ``bench.dashboard_render``, not asserted here.

CI installs the browser (``.ci/run``) and sets ``PATHWAYS_REQUIRE_BROWSER=1``, so there the test
fails rather than skips when something is missing."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time

import numpy as np
import pytest

import pathways as pw
from pathways import P
from pathways.dashboard import Dashboard

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def browser():
    """A headless Chromium under Selenium, or a skip (a failure where CI requires it)."""
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER))
               if path is None]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium")
    if missing:
        if os.environ.get("PATHWAYS_REQUIRE_BROWSER"):
            pytest.fail(f"PATHWAYS_REQUIRE_BROWSER is set but {missing} are missing")
        pytest.skip(f"no {', '.join(missing)}")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="dashboard-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1200,900",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    return driver, profile


def until(test, timeout=30.0, what="the page"):
    deadline = time.monotonic() + timeout
    while True:
        value = test()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not come within {timeout} s")
        time.sleep(0.1)


def cells(driver, table: str) -> list[list[str]]:
    """The text of a table's cells, read in one go (the page redraws it at every update)."""
    return driver.execute_script(
        f"return [...document.querySelectorAll('#{table} tr')].slice(1)"
        ".map(r => [...r.cells].map(c => c.textContent))")


def click_a_kernel(driver, tries: int = 10) -> str:
    """Click the middle of device 0's newest kernel on the timeline; the detail it shows,
    once the rest of it (asked for by the click) has come. A kernel of a few pixels moves on
    when the page draws the next update between the position's reading and the click, so
    the click misses now and then (nothing, a transfer, a kernel gone from the window by the
    time its details are asked for): it is tried again (``tries`` times)."""
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = driver.find_element("id", "timeline")

    def click_and_read(timeout: float) -> str:
        dx, dy = driver.execute_script("""
            const c = document.getElementById("timeline"), r = c.getBoundingClientRect();
            const d = snap.devices[0], k = snap.kernels[String(d.id)].at(-1);
            const [row, band] = rows(snap.devices.length), width = c.width - LABEL;
            const x = t => LABEL + (t - (snap.now - snap.window)) / snap.window * width;
            return [(x(k[0]) + x(k[1])) / 2 - r.width / 2, 2 + band / 2 - r.height / 2];""")
        ActionChains(driver).move_to_element_with_offset(canvas, int(dx), int(dy)).click() \
            .perform()
        return until(lambda: (lambda text: "..." not in text and "inputs:" in text and text)(
            driver.find_element("id", "detail").text), timeout, "the kernel's details")

    for _ in range(tries - 1):
        try:
            return click_and_read(3.0)
        except AssertionError:
            pass  # missed: the kernel moved on
    return click_and_read(10.0)


def test_the_dashboard_page_in_chromium(tmp_path):
    driver, profile = browser()
    stop = threading.Event()
    worker = None
    try:
        with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=2,
                              heartbeat_timeout=1.0) as cluster, \
                pw.connect(cluster.address) as client, \
                Dashboard(cluster.address, hz=4, window=5) as dash:
            driver.get(dash.url)
            until(lambda: len(cells(driver, "devices")) == 4, what="4 device rows")
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert errors == [], errors
            assert [row[-1] for row in cells(driver, "hosts")] == ["live", "live"]

            mesh = client.mesh((4,), ("d",))
            step = pw.shard_map(lambda x: pw.psum(x, "d") * 0.5, mesh, in_specs=P("d"),
                                out_specs=P("d"), cost=0.01)

            def work():
                x = client.put(np.ones(8), mesh, P("d"))
                while not stop.is_set():
                    for _ in range(10):
                        x = step(x)
                    x.result()
            worker = threading.Thread(target=work)
            worker.start()

            def busy():  # the devices' busy % as the page shows it
                return [float(row[5].rstrip("%")) for row in cells(driver, "devices")]
            until(lambda: min(busy()) > 10.0, what="busy devices")
            kernels = driver.execute_script(
                "return Object.values(snap.kernels).reduce((n, ks) => n + ks.length, 0)")
            assert kernels > 0
            # a click on a kernel says what it is: function, times, inputs, its collective
            detail = click_a_kernel(driver)
            assert "<lambda>" in detail and "inputs: float64[8]" in detail, detail
            assert "collectives: 1" in detail and "start " in detail, detail
            pushed = driver.execute_script("return pushed")  # updates the stream sent so far
            until(lambda: driver.execute_script("return pushed") >= pushed + 3,
                  what="three more pushed updates")
            shot = os.path.join(os.environ.get("PATHWAYS_ARTIFACTS", str(tmp_path)),
                                "dashboard.png")
            os.makedirs(os.path.dirname(shot), exist_ok=True)
            driver.save_screenshot(shot)
            assert open(shot, "rb").read(4) == b"\x89PNG"

            stop.set()
            worker.join(30)
            # a run in flight shows where its graph is; a failed run its remote traceback
            slow = pw.shard_map(lambda x: x + 1, mesh, in_specs=P("d"), out_specs=P("d"),
                                cost=2.0)

            def bad(v):
                if np.any(v != 0):  # zeros (the client's abstract evaluation) pass
                    raise ValueError("no good value </script><b>bold</b>")
                return v
            broken = pw.shard_map(bad, mesh, in_specs=P("d"), out_specs=P("d"))
            x = client.put(np.ones(8), mesh, P("d"))
            y = slow(x)
            until(lambda: any("/4" in row[-1] for row in cells(driver, "runs")),
                  what="a run in flight with shards not done")
            y.result()
            with pytest.raises(ValueError):
                broken(x).result()
            until(lambda: "no good value" in driver.find_element("id", "errors").text,
                  what="the failed run")
            trace = driver.execute_script(
                "return document.querySelector('#errors details pre').textContent")
            assert 'raise ValueError("no good value </script>' in trace
            # served again, the page carries the latest snapshot in its script: the cluster's
            # text in it is text, never markup, and cannot end the script
            driver.refresh()
            until(lambda: "no good value </script><b>bold</b>" in
                  driver.find_element("id", "errors").text, what="the error, once reloaded")
            assert driver.execute_script("return document.querySelectorAll('b').length") == 0
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert errors == [], errors

            pid = dash.snapshot()["hosts"][1]["pid"]
            os.kill(pid, signal.SIGKILL)
            until(lambda: [row[-1] for row in cells(driver, "hosts")] == ["live", "down"],
                  what="host 1 shown down")
            red = driver.execute_script(
                "return getComputedStyle(document.querySelector('#hosts .down')).color")
            assert red == "rgb(204, 0, 0)"
            # 1,000s of calls in flight list the oldest 64 (drawn and read in one script: the
            # next pushed update redraws the table)
            first, count, legend = driver.execute_script("""
                const s = JSON.parse(JSON.stringify(snap));
                s.full = true;
                s.clients = [{id: 9, weight: 1, priority: 0, running: 0, queued: 100, held: 0,
                              runs: Array.from({length: 100}, (_, i) => ({program: 0, run: i,
                                  started: false, age: i / 10, nodes: null}))}];
                show(s, false);
                const rows = document.querySelectorAll("#runs tr");
                return [rows[1].cells[2].textContent, rows.length - 1,
                        document.getElementById("runs-unlisted").textContent];""")
            assert (first, count, legend) == ("99", 64, "(the oldest 64 of 100)")
    finally:
        stop.set()
        if worker is not None:
            worker.join(30)
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
