"""The job page's actions in a real headless browser (Debian's chromium and chromium-driver, Selenium), behind
a stand-in for the site's authenticating proxy: the browser sends the proxy's user header and its secret
itself (through the DevTools protocol) from 127.0.0.1, the one trusted proxy address.

The collector, agents and trainers are real (tests/web_stack.py): Diagnose shows the function a stuck rank
is blocked in, a checkpoint reaches the trainer's clusterwatch.train handler, another user and a
cross-site or tokenless POST are refused, and the power chart's figures are the collector's.
"""
from __future__ import annotations

import html
import http.server
import re
import threading
import urllib.request

import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By

from tests.support.helpers import wait_for
from tests.web_browser import LOOPBACK, fits, resource_hosts, severe
from tests.web_stack import (
    PROXY_SECRET,
    PROXY_SECRET_HEADER,
    RUNNING_JOB,
    STUCK_JOB,
    proxy_secret_args,
    start_actions_stack,
)

pytestmark = pytest.mark.e2e

HEADER = "X-Remote-User"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("web-actions-browser")
    s = start_actions_stack(tmp, "--web-actions", "--web-user-header", HEADER, "--web-trusted-proxy", "127.0.0.1",
                            *proxy_secret_args(tmp), "--show-all-jobs",
                            # every report a history point: the allocator chart's latest is status's latest
                            "--history-step", "0")
    s.owner = s.status_json(RUNNING_JOB)["job"]["user"]
    yield s
    s.stop()


def _as(browser, user: str) -> None:
    """Every request the browser sends from now on names `user` in the proxy's header, with its secret."""
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {HEADER: user,
                                                                        PROXY_SECRET_HEADER: PROXY_SECRET}})


def _main(browser) -> str:
    """The page's text; "" while the browser is between pages (an action's answer takes seconds to come)."""
    try:
        return browser.find_element(By.TAG_NAME, "main").text
    except (StaleElementReferenceException, NoSuchElementException):
        return ""


@pytest.mark.parametrize("width", [1280, 390])
def test_diagnose_shows_the_function_a_stuck_rank_is_blocked_in(stack, browser, width, tmp_path):
    _as(browser, stack.owner)
    browser.set_window_size(width, 900)
    severe(browser)
    browser.get(stack.url(f"/jobs/{STUCK_JOB}"))
    fits(browser)
    browser.save_screenshot(str(tmp_path / f"job-{width}.png"))
    if width == 390:  # the smaller run asks for the stacks alone
        browser.find_element(By.CSS_SELECTOR, 'input[name="snapshot"]').click()
    browser.find_element(By.ID, "action-diagnose").click()
    # the confirmation, not the answer yet (the click's navigation may still be under way)
    wait_for(lambda: "Diagnose: job" in _main(browser), timeout=30, what="the confirmation page")
    fits(browser)
    browser.find_element(By.ID, "confirm").click()
    wait_for(lambda: "Stacks (main thread" in _main(browser), timeout=60, what="the diagnosis")
    text = _main(browser)
    stacks = text.split("Memory snapshots")[0]
    assert "blocked_in_collective" in stacks, text
    assert ("Memory snapshots" in text) == (width == 1280), text
    fits(browser)
    browser.save_screenshot(str(tmp_path / f"diagnosis-{width}.png"))
    assert resource_hosts(browser) <= LOOPBACK
    assert not severe(browser)


def test_a_checkpoint_from_the_page_reaches_the_trainers_handler(stack, browser):
    _as(browser, stack.owner)
    browser.set_window_size(1280, 900)
    severe(browser)
    before = stack.marker.read_text().splitlines() if stack.marker.exists() else []
    browser.get(stack.url(f"/jobs/{RUNNING_JOB}"))
    browser.find_element(By.ID, "action-checkpoint").click()
    wait_for(lambda: browser.find_elements(By.ID, "confirm"), timeout=30, what="the confirmation page")[0].click()
    wait_for(lambda: "saved checkpoint at step" in _main(browser), timeout=60, what="the handler's answer")
    assert len(stack.marker.read_text().splitlines()) == len(before) + 1
    answers = stack.status_json(RUNNING_JOB)["train_answers"]
    assert [(a["kind"], a["status"], a["asked_by"]) for a in answers][-1:] == [
        ("checkpoint", "done", f"web user {stack.owner}")]
    assert f"web user {stack.owner}" in _main(browser)
    assert not severe(browser)


def test_another_user_sees_why_they_may_not_act(stack, browser):
    _as(browser, "mallory")
    browser.get(stack.url(f"/jobs/{RUNNING_JOB}"))  # shown to all (--show-all-jobs), actions to its owner only
    assert "only the job's owner or an admin may act" in browser.find_element(By.ID, "actions-refused").text
    assert not browser.find_elements(By.CSS_SELECTOR, ".actions button")
    browser.get(stack.url(f"/jobs/{RUNNING_JOB}/confirm?action=stop"))
    assert "you are mallory" in browser.find_element(By.ID, "refused").text
    assert not browser.find_elements(By.ID, "confirm")
    assert not severe(browser, "status of 403")


def _token_as(stack, user: str) -> str:
    req = urllib.request.Request(stack.url(f"/jobs/{RUNNING_JOB}/confirm?action=checkpoint"),
                                 headers={HEADER: user, PROXY_SECRET_HEADER: PROXY_SECRET})
    with urllib.request.urlopen(req, timeout=30) as r:
        return re.search(r'name="token" value="([0-9a-f]+)"', r.read().decode()).group(1)


def test_a_cross_site_post_and_a_post_without_the_token_are_refused(stack, browser):
    _as(browser, stack.owner)
    checkpoints = len(stack.marker.read_text().splitlines()) if stack.marker.exists() else 0
    # another site (another origin on this host) with a form that names the owner's valid token
    attack = (f'<!DOCTYPE html><form method="post" action="{html.escape(stack.url(f"/jobs/{RUNNING_JOB}/act"))}">'
              '<input type="hidden" name="action" value="checkpoint">'
              f'<input type="hidden" name="token" value="{_token_as(stack, stack.owner)}">'
              '<button id="go">win a prize</button></form>').encode()

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(attack)

        def log_message(self, *args):
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{site.server_port}/")
        browser.find_element(By.ID, "go").click()
        wait_for(lambda: browser.find_elements(By.ID, "refused"), timeout=30, what="the refusal")
        assert "another site" in browser.find_element(By.ID, "refused").text
    finally:
        site.shutdown()
        site.server_close()
    # from the page itself, its token taken out
    browser.get(stack.url(f"/jobs/{RUNNING_JOB}/confirm?action=checkpoint"))
    browser.execute_script("document.querySelector('input[name=token]').remove()")
    browser.find_element(By.ID, "confirm").click()
    wait_for(lambda: browser.find_elements(By.ID, "refused"), timeout=30, what="the refusal")
    assert "token is missing" in browser.find_element(By.ID, "refused").text
    assert (len(stack.marker.read_text().splitlines()) if stack.marker.exists() else 0) == checkpoints
    assert not severe(browser, "status of 403")


def _power_line(browser) -> list[float]:
    fig = browser.find_element(By.XPATH, '//figure[figcaption="GPU power per GPU"]')
    (line,) = fig.find_elements(By.CSS_SELECTOR, "polyline.series")
    assert line.size["width"] > 0 and len(line.get_attribute("points").split()) >= 2
    return [float(v) for v in line.get_attribute("data-values").split()]


def test_the_power_chart_is_drawn_with_the_collectors_figures(stack, browser):
    _as(browser, stack.owner)
    browser.set_window_size(390, 900)

    def agreed():
        browser.get(stack.url(f"/jobs/{RUNNING_JOB}"))
        before = _power_line(browser)
        gpu = stack.status_json(RUNNING_JOB)["gpus"][0]
        browser.get(stack.url(f"/jobs/{RUNNING_JOB}"))
        after = _power_line(browser)
        # read between two pages whose latest point is the same: status's latest reading is that point
        return before[-1] == after[-1] and (before, gpu)

    values, gpu = wait_for(agreed, timeout=60, interval=1.0, what="two reads of one latest power point")
    assert values[-1] == pytest.approx(gpu["power_watts"], rel=1e-6)
    assert len(values) >= 2 and all(70.0 <= v <= 700.0 for v in values)  # the simulated GPU's range
    fits(browser)
    assert not severe(browser)
    browser.set_window_size(1280, 900)


def _chart_line(browser, title: str, label: str) -> list[float]:
    fig = browser.find_element(By.XPATH, f'//figure[figcaption="{title}"]')
    line = fig.find_element(By.CSS_SELECTOR, f'polyline.series[data-label="{label}"]')
    assert line.size["width"] > 0
    return [float(v) for v in line.get_attribute("data-values").split()]


def test_the_allocator_chart_is_drawn_with_the_figures_the_process_reported(stack, browser):
    _as(browser, stack.owner)
    title = "GPU memory as the allocator sees it per rank"

    def agreed():
        browser.get(stack.url(f"/jobs/{RUNNING_JOB}"))
        before = _chart_line(browser, title, "rank 0 allocated")
        proc = stack.status_json(RUNNING_JOB)["processes"][0]
        browser.get(stack.url(f"/jobs/{RUNNING_JOB}"))
        after = _chart_line(browser, title, "rank 0 allocated")
        return before[-1] == after[-1] and (before, proc)

    allocated, proc = wait_for(agreed, timeout=60, interval=0.5, what="two reads of one latest allocator point")
    assert allocated[-1] == int(proc["gpu_allocated_bytes"])
    assert all(2 << 30 <= v < (2 << 30) + 50 * 2**20 for v in allocated)
    assert set(_chart_line(browser, title, "rank 0 reserved")) == {float(6 << 30)}
    assert not severe(browser)


def test_an_unticked_snapshot_box_is_not_undone_by_the_pages_refresh(stack, browser):
    _as(browser, stack.owner)
    browser.get(stack.url(f"/jobs/{STUCK_JOB}"))
    browser.execute_script("document.querySelector('main').dataset.first = '1'")
    box = browser.find_element(By.CSS_SELECTOR, 'input[name="snapshot"]')
    box.click()
    # the page refreshes its <main> every 15 s: once the user changed a field it no longer does
    import time

    time.sleep(20)
    assert browser.execute_script("return document.querySelector('main').dataset.first") == "1"
    assert not browser.find_element(By.CSS_SELECTOR, 'input[name="snapshot"]').is_selected()
    assert not severe(browser)
