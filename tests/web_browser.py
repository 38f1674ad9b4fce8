"""A real headless browser for the job page's tests: Debian's chromium and chromium-driver driven by Selenium
(no browser download), and what those tests check on every page it shows. The `browser` fixture
(tests/collector/conftest.py) is one of these a test module.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlsplit

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:  # fail, never skip: scripts/setup.sh installs it
        raise AssertionError(f"{name} is not installed: run scripts/setup.sh (Debian's chromium, chromium-driver)")
    return path


def headless_chromium(profile: Path) -> webdriver.Chrome:
    """Chromium, headless, 1280x900, its console kept (severe()), its requests' headers settable through the
    DevTools protocol (Network.setExtraHTTPHeaders: the stand-in for an authenticating proxy)."""
    options = webdriver.ChromeOptions()
    options.binary_location = _binary("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                f"--user-data-dir={profile}", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(_binary("chromedriver")))
    driver.set_page_load_timeout(60)  # an action's answer waits for the ranks' answers
    driver.execute_cdp_cmd("Network.enable", {})
    return driver


def severe(driver, allowed: str | None = None) -> list[dict]:
    """The console's errors since the last call (less those naming `allowed`: a refused page's own status,
    where one is expected). A script the page's policy refused, or a resource not found, shows here."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and not (allowed and allowed in e["message"])]


def resource_hosts(driver) -> set[str]:
    """The hosts of the page and of everything it fetched."""
    names = driver.execute_script(
        "return [location.href].concat(performance.getEntriesByType('resource').map(function(e){return e.name}))")
    return {urlsplit(n).hostname or "" for n in names}


def fits(driver) -> None:
    """The page never scrolls sideways (wide tables and the report scroll in their own boxes), and no chart,
    button, report or title reaches past the window's right edge."""
    inner = driver.execute_script("return window.innerWidth")
    assert driver.execute_script("return document.documentElement.scrollWidth") <= inner
    for e in driver.find_elements(By.CSS_SELECTOR, "figure.chart, .actions button, pre, h1"):
        assert e.location["x"] + e.size["width"] <= inner + 1, e.tag_name
