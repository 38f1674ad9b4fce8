"""Fixtures of the collector's tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless chromium for the module's tests (tests/web_browser.py), quit at its end."""
    from tests.web_browser import headless_chromium  # selenium only where a test asks for a browser

    driver = headless_chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()
