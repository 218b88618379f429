"""Playwright on Debian's headless Chromium for the browser tests: the browser (once per module)
and a page on the live server that fails its test on any JavaScript console error or uncaught
exception; screenshots land in test-artifacts/ (gitignored) for a person to look at.

    pytest_plugins = ["tests.browser"]  # the fixtures browser and page
"""

import os

import pytest

from tests.fakes import ROOT

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
# the README's screenshots (the first screen of a page, to keep the files small), written there
# only with MOEOPS_DOC_SCREENSHOTS=1 so that a test run leaves the tree as it was
SCREENSHOTS = ROOT / "docs" / "screenshots"
PASSWORD = "pw-browser-123"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # between page actions are plain synchronous code all the same.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield chromium
        chromium.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    context.set_default_timeout(10_000)
    # a page load waits on the test server beside two other passes of make test: at load 12 a
    # deployment page took over 10 s (a slower test, not a wrong page)
    context.set_default_navigation_timeout(30_000)
    tab = context.new_page()
    errors = []
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.base = live_server.url
    # a test that expects one (a form refused with its 4xx) takes it out, saying so
    tab.js_errors = errors
    yield tab
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"


def shot(page, name):
    """A full-page screenshot into test-artifacts/."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def doc_shot(page, name):
    """The first screen of the page, for the README (MOEOPS_DOC_SCREENSHOTS=1), else beside the
    other screenshots."""
    folder = SCREENSHOTS if os.getenv("MOEOPS_DOC_SCREENSHOTS") == "1" else ARTIFACTS
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"))


def log_in(page, user):
    page.goto(page.base + "/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(page.base + "/")


def sweep_form_opened(page, user, deployment):
    """`user` logged in and on the deployment's page, its sweep form opened."""
    log_in(page, user)
    page.goto(page.base + deployment.get_absolute_url())
    page.click("summary:has-text('Run sweep')")


def chart_traces(page, element_id):
    """The traces plotly drew in one chart: name and point count."""
    page.wait_for_function(
        "id => { const el = document.getElementById(id); return el && el.data; }",
        arg=element_id,
    )
    return page.evaluate(
        "id => document.getElementById(id).data.map(t => ({name: t.name, n: (t.x || []).length}))",
        element_id,
    )
