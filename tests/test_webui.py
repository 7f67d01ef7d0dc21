"""The web UI in a real browser: Debian's headless Chromium, driven by Selenium through
Debian's chromedriver, against a real ProcessCluster. Loads every page (overview, block
servers, each block server's own page, open files, the file browser's folder and file
details, fsck) with no SEVERE console entry (so none the pages' Content-Security-Policy
blocks), sees logs refused to the anonymous viewer (secure), a file opened for writing
appear and a killed block server turn dead.

``LEASEFS_SCREENSHOTS=DIR`` saves PNGs of the main pages there (docs/OPERATIONS.md's come from
this test on a small demo cluster).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

from harness import ProcessCluster

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason="needs Debian's chromium and chromium-driver (make test "
                              "installs them)"),
]


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="leasefs-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # the driver's own path: Selenium Manager must not try to download one
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def text_of(driver) -> str:
    from selenium.webdriver.common.by import By
    return driver.find_element(By.TAG_NAME, "body").text


def load(driver, url: str) -> str:
    """The page's visible text, after checking it logged no SEVERE console entry."""
    driver.get(url)
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, (url, severe)
    return text_of(driver)


def until(driver, url: str, check, timeout: float = 30.0) -> str:
    """Reload ``url`` until ``check(text)`` holds (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        text = load(driver, url)
        if check(text):
            return text
        assert time.monotonic() < deadline, f"{url} never showed it:\n{text}"
        time.sleep(0.5)


def shot(driver, name: str) -> None:
    folder = os.environ.get("LEASEFS_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        driver.save_screenshot(os.path.join(folder, f"{name}.png"))


def test_every_page_in_a_browser(tmp_path, browser):
    from selenium.webdriver.common.by import By

    with ProcessCluster(tmp_path, n_storage=3, meta_http=True) as cluster:
        base = f"http://127.0.0.1:{cluster.meta_http_port}"
        with cluster.client() as c:
            c.mkdirs("/demo/logs")
            c.write_file("/demo/readme.txt", b"hello from leasefs\n" * 100)
            c.write_file("/demo/data.bin", os.urandom(3 * 1024 * 1024),
                         block_size=1024 * 1024)
            writer = c.create("/demo/logs/app.log")
            writer.write(b"line 1\n")
            writer.flush()

            text = load(browser, base + "/")
            assert "Overview" in text and "Safe mode" in text and "Last journal txid" in text
            assert "3 live" in text
            shot(browser, "overview")

            text = until(browser, base + "/openfiles", lambda t: "/demo/logs/app.log" in t)
            assert c.client_name in text or "Holder" in text
            shot(browser, "open-files")

            text = load(browser, base + "/explorer?path=/demo")
            assert "readme.txt" in text and "data.bin" in text and "logs/" in text
            browser.find_element(By.LINK_TEXT, "data.bin").click()
            text = text_of(browser)
            assert "File details" in text and "Generation stamp" in text
            rows = browser.find_elements(By.CSS_SELECTOR, "#blocks tr.block")
            assert len(rows) == 3 and all("127.0.0.1:" in r.text for r in rows)
            assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            shot(browser, "explorer-file")

            text = load(browser, base + "/fsck?path=/")
            assert "HEALTHY" in text and "files" in text
            # under secure the recent log lines are the superuser's: the anonymous viewer
            # gets the 403 page, whose status is the page's only console entry
            browser.get(base + "/logs")
            severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            assert len(severe) == 1 and "status of 403" in severe[0], severe
            text = text_of(browser)
            assert "Superuser privilege is required" in text and "registered" not in text

            text = load(browser, base + "/datanodes")
            assert text.count("live") >= 3 and "own page" in text
            shot(browser, "block-servers")
            links = [a.get_attribute("href")
                     for a in browser.find_elements(By.CSS_SELECTOR, "a.node-page")]
            assert len(links) == 3
            for link in links:
                text = load(browser, link)
                assert "Replicas by state" in text and "FINALIZED" in text
                assert "Volumes" in text and "Recent errors" in text
            shot(browser, "block-server")

            writer.close()   # before a kill: its pipeline may include the victim
            victim = cluster.storage_dir(2)
            cluster.kill_storage(2)
            text = until(browser, base + "/datanodes",
                         lambda t: " dead" in t.split("Block server", 1)[-1]
                         and "1 dead" in t, timeout=60)
            dead = browser.find_elements(By.CSS_SELECTOR, "#nodes tr.dead")
            assert len(dead) == 1, victim
