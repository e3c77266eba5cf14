"""Headless Chromium from the distribution's packages, driven by selenium: the explorer page's
screenshot (scripts/explore_screenshot.py) and its tests. Nothing here downloads a browser build:
the browser and its driver are the system's (Debian: apt-get install chromium chromium-driver),
and selenium (the dev extra) is imported only when a browser is asked for.
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver",)


def _which(names: tuple[str, ...]) -> str | None:
    return next((found for name in names if (found := shutil.which(name))), None)


def missing() -> str | None:
    """Why no headless browser can run here (for a test's skip), or None when one can."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[dev]')"
    if _which(BROWSERS) is None or _which(DRIVERS) is None:
        return (
            "chromium or chromedriver is not installed (apt-get install chromium chromium-driver)"
        )
    return None


def headless_chromium(*, width: int = 1280, height: int = 1000, log_network: bool = False) -> Any:
    """A selenium WebDriver of the system's headless Chromium; `log_network` keeps the DevTools
    performance log, whose Network events name every request the page makes."""
    reason = missing()
    if reason:
        raise ValueError(f"cannot start a headless browser: {reason}.")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _which(BROWSERS)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument(f"--window-size={width},{height}")
    if log_network:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(service=Service(_which(DRIVERS)), options=options)


def open_page(driver: Any, path: str | Path, *, timeout: float = 20.0) -> None:
    """Open a local HTML file and wait until its script says it is ready (body data-ready="1");
    a script error it reports (body data-error) is raised."""
    driver.get(Path(path).resolve().as_uri())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = driver.execute_script(
            "return [document.body && document.body.dataset.ready, "
            "document.body && document.body.dataset.error];"
        )
        if state[1]:
            raise RuntimeError(f"the page {path} failed: {state[1]}")
        if state[0] == "1":
            return
        time.sleep(0.05)
    raise TimeoutError(f"the page {path} was not ready after {timeout} s")


def requested_urls(driver: Any) -> list[str]:
    """Every URL the page asked for since the last call (the performance log's Network events)."""
    import json

    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def screenshot(
    html: str | Path,
    png: str | Path,
    *,
    click: list[str] | None = None,
    width: int = 1280,
    height: int = 1000,
) -> Path:
    """Open `html` in headless Chromium, click the CSS selectors in `click` in order, and save a
    PNG of the whole page to `png`."""
    from selenium.webdriver.common.by import By

    driver = headless_chromium(width=width, height=height)
    try:
        open_page(driver, html)
        for selector in click or []:
            driver.find_element(By.CSS_SELECTOR, selector).click()
        full = driver.execute_script("return document.documentElement.scrollHeight;")
        metrics = {"width": width, "height": max(height, int(full)), "deviceScaleFactor": 1}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "mobile": False})
        png = Path(png)
        png.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(png))
    finally:
        driver.quit()
    return png
