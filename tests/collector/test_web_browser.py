"""The job page in a real headless browser: Debian's chromium and chromium-driver, driven by Selenium.

The collector is real and fed by a real agent with a simulated GPU and a leaking rank (tests/web_stack.py).
The browser is the judge of what the server-side tests cannot see: that the charts are drawn, that the
hostile names run no script, that the page fetches nothing but from the collector, and that it fits.
"""
from __future__ import annotations

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By

from tests.web_browser import LOOPBACK, fits, resource_hosts, severe
from tests.web_stack import HOSTILE_TAG, JOB_ID, start_web_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_web_stack(tmp_path_factory.mktemp("web-browser"))
    yield s
    s.stop()


def _no_dialog(driver) -> bool:
    try:
        _ = driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def test_the_job_page_draws_its_charts_and_fetches_nothing_from_elsewhere(stack, browser):
    firing_before = [a for a in stack.status_json()["alerts"] if a["state"] == "firing"]
    browser.get(stack.url(f"/jobs/{JOB_ID}"))
    if not firing_before:  # the leak takes its rule's 35 s window to fire
        assert browser.find_element(By.ID, "badge").text == "normal"
    lines = browser.find_elements(By.CSS_SELECTOR, "figure.chart svg polyline.series")
    assert lines, browser.page_source[:2000]
    memory = [e for e in lines if e.get_attribute("data-label") == "rank 0"][0]
    points = memory.get_attribute("points").split()
    assert len(points) >= 2 and memory.size["width"] > 0  # drawn, with a width on the screen
    assert resource_hosts(browser) <= LOOPBACK
    assert not severe(browser)


def test_hostile_text_is_shown_literally_and_runs_nothing(stack, browser):
    browser.get(stack.url(f"/jobs/{JOB_ID}"))
    assert _no_dialog(browser)
    body = browser.find_element(By.TAG_NAME, "main").text
    assert f"exp={HOSTILE_TAG}" in body  # the text itself, not an element
    assert "<b>x</b" in body  # the process name, cut to the report's column
    assert not browser.find_elements(By.CSS_SELECTOR, "main script, main img, main b")


@pytest.mark.parametrize("width", [1280, 390])
def test_the_page_fits_the_window(stack, browser, width, tmp_path):
    browser.set_window_size(width, 900)
    browser.get(stack.url(f"/jobs/{JOB_ID}"))
    browser.save_screenshot(str(tmp_path / f"job-{width}.png"))
    fits(browser)


def test_the_badge_turns_from_normal_to_the_leak_alerts_severity_when_it_fires(stack, browser):
    browser.set_window_size(1280, 900)
    stack.wait_for_leak_alert()
    browser.get(stack.url(f"/jobs/{JOB_ID}"))
    alerts = [a.text for a in browser.find_elements(By.CSS_SELECTOR, ".alert")]
    # the leak rule's severity: critical at this rate (the GPU is full within the hour), else warning
    (leak,) = [a for a in stack.status_json()["alerts"] if a["rule"] == "gpu_memory_leak"]
    assert leak["severity"] in ("warning", "critical")
    assert browser.find_element(By.ID, "badge").text == leak["severity"], alerts
    alert = browser.find_element(By.CSS_SELECTOR, '.alert[data-rule="gpu_memory_leak"]')
    assert "FIRING" in alert.text and "rank 0" in alert.text
    browser.get(stack.url("/"))
    row = browser.find_element(By.XPATH, f'//a[@href="/jobs/{JOB_ID}"]/ancestor::tr')
    assert row.find_elements(By.TAG_NAME, "td")[4].text == "1"
