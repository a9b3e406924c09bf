"""Fixtures for opening the evaluation report in a real browser: the demo's evaluation and headless Chromium.

The browser is Debian's ``chromium`` driven by Debian's ``chromium-driver`` through selenium (``make setup``
installs both when root); a test tool's own browser download is never used. Without them the tests skip and
say what to install.

``ISOOD_REPORT_DIR=<evaluation dir>`` checks another evaluation (e.g. ``demo-out/evaluation`` after
``make demo``) instead of building one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: Debian's Chromium as root, offline: these flags start it without a sandbox, a GPU or any network chatter.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1400,1000")
def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return (f"headless Chromium is missing ({', '.join(missing)}): run `make setup` as root, or "
                "`sudo apt-get install chromium chromium-driver`")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is missing: pip install -e '.[test]'"
    return None


@pytest.fixture(scope="session")
def demo_evaluation(request) -> Path:
    """The demo's evaluation directory (report.html, plots/, the evaluation manifest) on the planted world:
    tests/conftest.py's ``planted_evaluation``, or ``$ISOOD_REPORT_DIR``."""
    given = os.environ.get("ISOOD_REPORT_DIR")
    if given:
        return Path(given)
    out, *_ = request.getfixturevalue("planted_evaluation")
    return out / "evaluation"


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """A selenium WebDriver on headless Debian Chromium with the browser console log enabled."""
    reason = chromium_missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tmp_path_factory.mktemp("chromium-profile")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
