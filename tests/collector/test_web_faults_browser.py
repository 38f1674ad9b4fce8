"""The job page shows the faulty rank at a glance, in a real browser: a real collector, real agents with
simulated GPUs, and real ranks of which one leaks GPU memory (one job) and one stalls (another job)
(tests/web_stack.py, start_fault_stack).

Judged on the drawn SVG: the chart of the alert's figure draws the alert's rank as its one red line against
the other ranks, the alert is shaded from its start, at its time on the axis, and a stalled rank's steps per
second fall to 0. Screenshots of both pages go to $WEB_SCREENSHOTS (else the test's folder), for a person
to look at.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from tests.support.helpers import wait_for
from tests.web_browser import LOOPBACK, fits, resource_hosts, severe
from tests.web_stack import LEAK_JOB, LEAKING_RANK, RANKS, STALL_JOB, STALLED_RANK, start_fault_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_fault_stack(tmp_path_factory.mktemp("web-faults"))
    try:
        s.stall()
        wait_for(lambda: s.firing(LEAK_JOB, "gpu_memory_leak") and s.firing(STALL_JOB, "training_stall"),
                 timeout=180, interval=1.0, what="the leak and the stall firing")
    except AssertionError as exc:
        s.stop()
        raise AssertionError(f"{exc}\n{s.logs()}") from None
    yield s
    s.stop()


def _shot(browser, tmp_path: Path, name: str) -> None:
    folder = Path(os.environ.get("WEB_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    browser.set_window_size(1280, 900)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(height + 120, 4000))
    browser.save_screenshot(str(folder / name))
    browser.set_window_size(1280, 900)


def _chart(browser, title: str):
    (figure,) = [f for f in browser.find_elements(By.CSS_SELECTOR, "figure.chart")
                 if f.find_element(By.TAG_NAME, "figcaption").text == title]
    return figure


def _lines(figure) -> dict[str, dict]:
    out = {}
    for line in figure.find_elements(By.CSS_SELECTOR, "polyline.series"):
        out[line.get_attribute("data-label")] = {
            "role": line.get_attribute("data-role"), "stroke": line.get_attribute("stroke"),
            "values": [float(v) for v in line.get_attribute("data-values").split()], "element": line}
    return out


def _marked_at_its_time(figure, rule: str, rank: int, alert: dict) -> None:
    """The alert's shading is on the chart, from the alert's start, at that time on the chart's axis."""
    (mark,) = figure.find_elements(By.CSS_SELECTOR, f'g.alert-mark[data-rule="{rule}"][data-rank="{rank}"]')
    start = float(mark.get_attribute("data-start"))
    assert start == pytest.approx(alert["since"] or alert["fired_at"], abs=1e-3)
    x0, x1 = float(figure.get_attribute("data-start")), float(figure.get_attribute("data-end"))
    axis = figure.find_element(By.CSS_SELECTOR, "svg line.axis:last-of-type")  # the y axis, at the plot's left
    left = float(axis.get_attribute("x1"))
    right = float(figure.find_elements(By.CSS_SELECTOR, "svg line.grid")[0].get_attribute("x2"))
    rect = mark.find_element(By.CSS_SELECTOR, "rect.mark-band")
    expected = left + (right - left) * (max(start, x0) - x0) / (x1 - x0)
    assert float(rect.get_attribute("x")) == pytest.approx(expected, abs=1.0)
    assert rect.size["width"] > 0 and rect.size["height"] > 0


def _one_span(browser) -> None:
    spans = {(f.get_attribute("data-start"), f.get_attribute("data-end"))
             for f in browser.find_elements(By.CSS_SELECTOR, "figure.chart[data-start]")}
    assert len(spans) == 1, spans


def test_the_leaking_rank_is_the_red_line_on_the_memory_chart(stack, browser, tmp_path):
    browser.get(stack.url(f"/jobs/{LEAK_JOB}"))
    alert = stack.firing(LEAK_JOB, "gpu_memory_leak")
    assert alert["rank"] == LEAKING_RANK
    figure = _chart(browser, "GPU memory per rank")
    lines = _lines(figure)
    assert len(lines) == RANKS
    focus = [label for label, line in lines.items() if line["role"] == "focus"]
    assert focus == [f"rank {LEAKING_RANK}"]
    assert {line["role"] for label, line in lines.items() if label not in focus} == {"other"}
    leaking = lines[f"rank {LEAKING_RANK}"]["values"]
    assert leaking[-1] > leaking[0] + 0.5 * 2**30  # the figures the chart draws grow
    _marked_at_its_time(figure, "gpu_memory_leak", LEAKING_RANK, alert)
    # its own chart, its own axis: the growth fills it
    own = _chart(browser, f"GPU memory of rank {LEAKING_RANK}: gpu_memory_leak")
    (line,) = _lines(own).values()
    svg = own.find_element(By.TAG_NAME, "svg")
    assert line["role"] == "focus" and line["element"].size["height"] > svg.size["height"] / 2
    _one_span(browser)
    assert resource_hosts(browser) <= LOOPBACK and not severe(browser)
    fits(browser)
    _shot(browser, tmp_path, "leak-job.png")


def test_the_stalled_rank_falls_to_zero_steps_per_second(stack, browser, tmp_path):
    browser.get(stack.url(f"/jobs/{STALL_JOB}"))
    alert = stack.firing(STALL_JOB, "training_stall")
    assert alert["rank"] == STALLED_RANK
    figure = _chart(browser, "Steps per second per rank")
    lines = _lines(figure)
    stalled = lines[f"rank {STALLED_RANK}"]
    assert stalled["role"] == "focus" and stalled["stroke"] == "#d62728"
    assert max(stalled["values"]) > 1 and stalled["values"][-1] == 0  # it stepped, then fell to 0
    for label, line in lines.items():
        if label != f"rank {STALLED_RANK}":
            assert line["role"] == "other" and line["values"][-1] > 1, label  # the others still step
    _marked_at_its_time(figure, "training_stall", STALLED_RANK, alert)
    assert _chart(browser, "Loss per rank") and _chart(browser, "Learning rate per rank")
    _one_span(browser)
    assert not severe(browser)
    _shot(browser, tmp_path, "stall-job.png")


def test_a_shorter_range_is_one_click_and_applies_to_every_chart(stack, browser):
    browser.get(stack.url(f"/jobs/{LEAK_JOB}"))
    browser.find_element(By.CSS_SELECTOR, '#ranges a[data-range="5m"]').click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, '#ranges span.chosen[data-range="5m"]'), timeout=20,
             what="the 5 min page")
    _one_span(browser)
    figure = browser.find_element(By.CSS_SELECTOR, "figure.chart[data-start]")
    assert float(figure.get_attribute("data-end")) - float(figure.get_attribute("data-start")) <= 300 + 1e-3
