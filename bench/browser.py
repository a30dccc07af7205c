"""Headless Chromium for the dashboard's benches: Debian's browser and chromedriver under
Selenium (nothing is downloaded), with a throw-away profile."""

from __future__ import annotations

import contextlib
import shutil
import tempfile


@contextlib.contextmanager
def chromium(width: int = 1200, height: int = 900):
    """A Selenium driver of a headless Chromium; quit and its profile removed on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    profile = tempfile.mkdtemp(prefix="bench-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--window-size={width},{height}",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")),
                                  options=options)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
