"""The dashboard in a real browser (headless Chromium, Debian's chromium and chromium-driver)
over a store filled by a real run on Redis, PostgreSQL and Celery workers; its metrics scraped;
a trace followed from submit through the agents."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.integration.graph_app import calls
from tests.integration.stack import SAS, Ready, free_port
from tests.integration.test_graph import APP, start
from tests.support import wait_for

pytestmark = pytest.mark.integration

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


@pytest.fixture
def filled(stack, shop):
    """Four orders processed, one recovered by the Supervisor, one declined and undone."""
    stack.up()
    handles = {f"ok-{i}": shop.submit("order", {"amount": 5 + i}, business_key=f"ok-{i}") for i in range(4)}
    handles["hung"] = shop.submit("order", {"amount": 7, "faults": {"charge": "hang:30@1"}}, business_key="hung")
    handles["declined"] = shop.submit("order", {"amount": 8, "faults": {"charge": "permanent"}},
                                      business_key="declined")
    states = {key: h.wait(30).process_state for key, h in handles.items()}
    assert states == {**{f"ok-{i}": "processed" for i in range(4)}, "hung": "processed",
                      "declined": "compensated"}
    return {key: h.id for key, h in handles.items()}


@pytest.fixture
def dashboard(stack, filled):
    port = free_port()
    stack.start("dashboard", [SAS, "dashboard", "--port", str(port), "--flower-url", "http://127.0.0.1:5555"],
                ready=Ready(url=f"http://127.0.0.1:{port}/healthz"))
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def browser(tmp_path):
    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), "apt-get install chromium chromium-driver (scripts/test does)"
    os.environ.setdefault("SE_AVOID_STATS", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,900", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def test_an_operator_sees_the_chart_filters_runs_and_finds_the_supervisors_recovery(dashboard, browser, filled,
                                                                                     tmp_path):
    browser.get(dashboard + "/")
    bars = browser.find_elements(By.CSS_SELECTOR, "svg#chart rect.bar")
    drawn = {bar.get_attribute("data-state"): bar.size["height"] for bar in bars}
    assert drawn.get("processed", 0) > drawn.get("compensated", 0) > 0, drawn
    tile = browser.find_element(By.CSS_SELECTOR, '#counts a[data-state="processed"] b')
    assert tile.text == "5"
    browser.save_screenshot(str(tmp_path / "overview.png"))

    # filter the runs by state: only the undone order is left
    browser.find_element(By.LINK_TEXT, "runs").click()
    Select(browser.find_element(By.ID, "state")).select_by_value("compensated")
    browser.find_element(By.ID, "filter").click()
    wait_for(lambda: "state=compensated" in browser.current_url, 10, "the filtered page")
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.run")
    assert [r.get_attribute("data-state") for r in rows] == ["compensated"]
    assert "declined" in rows[0].text

    # by business key, then into the run the Supervisor recovered
    Select(browser.find_element(By.ID, "state")).select_by_value("")
    browser.find_element(By.ID, "key").send_keys("hung")
    browser.find_element(By.ID, "filter").click()
    wait_for(lambda: "key=hung" in browser.current_url, 10, "the filtered page")
    [row] = browser.find_elements(By.CSS_SELECTOR, "tr.run")
    row.find_element(By.CSS_SELECTOR, "a").click()
    wait_for(lambda: filled["hung"] in browser.current_url, 10, "the run page")
    recovery = browser.find_element(By.CSS_SELECTOR, 'tr.lane[data-step="charge_payment"] li.recovery')
    assert "attempt 1 passed its complete-by: Supervisor recovery" in recovery.text
    # the retry's task (charge_payment, position 2, attempt 2), linked into Flower
    assert f"/task/{filled['hung']}-2-2" in browser.page_source
    segments = browser.find_elements(By.CSS_SELECTOR, 'tr.lane[data-step="charge_payment"] rect.segment')
    assert [s.get_attribute("class") for s in segments] == ["segment recovered", "segment completed"]
    assert all(s.size["width"] > 0 for s in segments)
    # the shipment is a branch, listed under its step; the run's version is shown
    lanes = [lane.get_attribute("data-step") for lane in browser.find_elements(By.CSS_SELECTOR, "tr.lane")]
    assert lanes.index("schedule_shipping[0]") == lanes.index("schedule_shipping") + 1
    assert "branch" in browser.find_element(By.CSS_SELECTOR, 'tr.lane[data-step="schedule_shipping[0]"]') \
        .get_attribute("class")
    assert len(browser.find_element(By.ID, "run-version").text) == 12
    browser.save_screenshot(str(tmp_path / "run.png"))

    browser.get(dashboard + "/alerts")
    assert browser.find_elements(By.CSS_SELECTOR, "#current tr.alert") == []  # the declined order is undone
    [alert] = browser.find_elements(By.CSS_SELECTOR, "#earlier tr.alert")
    assert alert.get_attribute("data-kind") == "failed" and "declined" in alert.text


def test_the_metrics_endpoint_has_every_series_after_a_run(dashboard, filled):
    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(dashboard + "/metrics", timeout=10).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    # events count once they are MARGIN (5 s) old: wait until every run's end has been counted
    def finished() -> float:
        return sum(v for (name, _), v in scrape().items() if name == "sas_runs_finished_total")

    wait_for(lambda: finished() == 6, 20, "every run's end to be counted")
    samples = scrape()
    assert samples[("sas_recoveries_total", (("agent", "payment"), ("cause", "expired")))] == 1
    assert not [labels for name, labels in samples if name == "sas_runs"]  # every run has finished
    assert samples[("sas_runs_finished_total", (("state", "processed"), ("workflow", "order")))] == 5
    assert samples[("sas_compensations_total", (("workflow", "order"),))] == 1
    assert samples[("sas_alerts_total", (("kind", "failed"),))] == 1
    assert samples.get(("sas_alerts_current", (("kind", "failed"),)), 0) == 0  # its order is undone: history
    assert samples[("sas_step_failures_total", (("agent", "payment"),))] == 1
    assert samples[("sas_step_duration_seconds_count", (("agent", "warehouse"),))] >= 11
    assert samples[("sas_step_duration_seconds_bucket", (("agent", "orders"), ("le", "+Inf")))] == 5
    sweeps = [v for (name, _), v in samples.items() if name == "sas_supervisor_sweeps_total"]
    assert sweeps and sum(sweeps) > 0
    ages = [v for (name, _), v in samples.items() if name == "sas_supervisor_last_sweep_age_seconds"]
    assert ages and min(ages) < 5
    assert samples[("sas_breaker_state", (("agent", "payment"),))] == 0  # closed
    assert httpx.get(dashboard + "/metrics", timeout=10).headers["content-type"].startswith("text/plain")


def test_the_dashboard_asks_for_flowers_credentials(stack, shop):
    port = free_port()
    stack.start("dashboard", [SAS, "dashboard", "--port", str(port)],
                ready=Ready(url=f"http://127.0.0.1:{port}/healthz"), env={"FLOWER_BASIC_AUTH": "ops:s3cret"})
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(base + "/").status_code == 401
    assert httpx.get(base + "/metrics", auth=("ops", "wrong")).status_code == 401
    assert httpx.get(base + "/", auth=("ops", "s3cret")).status_code == 200
    assert "s3cret" not in stack.log("dashboard")


def test_one_trace_follows_a_run_from_submit_through_every_agent(stack, stack_env):
    from opentelemetry import trace

    from sas_app import tracing
    from tests.integration.conftest import shop_app

    stack.env["SAS_TRACING"] = "console"
    shop = shop_app({**stack_env, "SAS_TRACING": "console"})
    shop.migrate()  # before the workers: one on a store without its schema stops at once
    stack.up()
    try:
        with trace.get_tracer("test").start_as_current_span("checkout") as checkout:
            handle = shop.submit("order", {"amount": 3}, business_key="traced")
        trace_id = f"0x{checkout.get_span_context().trace_id:032x}"
        assert handle.wait(30).process_state == "processed"

        def spans_in_trace() -> set[str]:
            lines = stack.log("agents").splitlines()
            names = set()
            for i, line in enumerate(lines):
                if trace_id in line:
                    for previous in reversed(lines[max(0, i - 6):i]):
                        if '"name":' in previous:
                            names.add(previous.split('"name":', 1)[1].strip().strip('",'))
                            break
            return names

        expected = {f"run/sas.agent.{a}" for a in ("warehouse.reserve", "payment.charge", "warehouse.ship",
                                                   "orders.confirm")}
        wait_for(lambda: expected <= spans_in_trace(), 20, "every agent's span in the submit's trace")
    finally:
        tracing.shutdown()
        shop.store.dispose()


def log_in(browser, credentials=b"ops:s3cret"):
    """Send basic auth with every request of the current tab."""
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders",
                            {"headers": {"Authorization": "Basic " + base64.b64encode(credentials).decode()}})


def test_an_operator_resubmits_failed_orders_in_bulk_and_cancels_a_held_one_from_the_browser(stack, shop, browser):
    """Behind basic auth (sent by the browser on every request) and the forms' CSRF tokens."""
    stack.up()
    broken = [shop.submit("order", {"amount": 5 + i, "faults": {"charge": "permanent", "release": "permanent@1"}},
                          business_key=f"broken-{i}") for i in range(2)]
    assert [h.wait(30).process_state for h in broken] == ["error", "error"]
    held = shop.submit("held_order", {"amount": 900}, business_key="held-1")
    wait_for(lambda: any(s.name == "manager_review" and s.state == "pending" for s in held.status().steps), 30,
             "the held order to wait for its review")
    port = free_port()
    stack.start("dashboard", [SAS, "dashboard", "--port", str(port), "--basic-auth", "ops:s3cret"],
                ready=Ready(url=f"http://127.0.0.1:{port}/healthz"))
    base = f"http://127.0.0.1:{port}"
    log_in(browser)

    # every order in error whose failure says the compensation failed: a confirmation, then one click
    browser.get(base + "/runs")
    Select(browser.find_element(By.ID, "state")).select_by_value("error")
    browser.find_element(By.ID, "failure").send_keys("compensation failed")
    browser.find_element(By.ID, "filter").click()
    wait_for(lambda: "failure=compensation" in browser.current_url, 10, "the filtered page")
    browser.find_element(By.ID, "bulk-resubmit").click()
    wait_for(lambda: "/runs/bulk" in browser.current_url, 10, "the confirmation page")
    assert browser.find_element(By.ID, "count").text == "2"
    assert all(h.status().process_state == "error" for h in broken)
    browser.find_element(By.CSS_SELECTOR, '#confirm input[name="reason"]').send_keys("warehouse fixed")
    browser.find_element(By.ID, "confirm-button").click()
    wait_for(lambda: "Resubmit: 2 done, 0 refused" in browser.page_source, 10, "the bulk action's result")
    assert [h.wait(30).process_state for h in broken] == ["compensated", "compensated"]
    for handle in broken:
        [event] = [e for e in handle.status().events if e.kind == "operator"]
        assert (event.actor, event.detail["action"], event.detail["reason"]) == ("ops", "resubmit", "warehouse fixed")

    # the held order, cancelled from its page: its reservation is released, the history says who;
    # a second operator had the same page open in another tab
    browser.get(f"{base}/runs/{held.id}")
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")
    log_in(browser)  # a tab of its own: the header is set per tab
    browser.get(f"{base}/runs/{held.id}")
    second = browser.current_window_handle
    browser.switch_to.window(first)
    cancel = browser.find_element(By.CSS_SELECTOR, 'form.act[data-action="cancel"]')
    cancel.find_element(By.NAME, "reason").send_keys("customer called")
    cancel.find_element(By.TAG_NAME, "button").click()
    wait_for(lambda: browser.find_elements(By.ID, "done"), 10, "the action's notice")
    assert browser.find_element(By.ID, "done").text == f"run {held.id} compensating"
    assert held.wait(30).process_state == "cancelled"
    browser.refresh()
    operator = browser.find_element(By.CSS_SELECTOR, 'tr.event[data-kind="operator"]')
    assert "ops" in operator.text and "customer called" in operator.text
    # the second operator's cancel, from the page as it was: refused with the CLI's words
    browser.switch_to.window(second)
    browser.find_element(By.CSS_SELECTOR, 'form.act[data-action="cancel"] button').click()
    wait_for(lambda: browser.find_elements(By.ID, "refused"), 10, "the refusal")
    assert browser.find_element(By.ID, "refused").text == f"cannot cancel run {held.id}: it is cancelled"


def test_an_operator_reruns_the_failed_runs_of_a_filter_once_the_fix_is_deployed(stack, app, stack_env, browser):
    """The bulk rerun: a filter, a confirmation page that counts the runs and asks for the step,
    one click; each failed run gets one new run, linked both ways, whose steps before the charge
    keep their results."""
    start(stack, ("agents", 1))
    failed = [app.submit("fixable", {"n": i}, business_key=f"fix-{i}") for i in range(3)]
    assert [h.wait(30).process_state for h in failed] == ["error"] * 3
    port = free_port()
    stack.start("dashboard", [SAS, "dashboard", "--port", str(port), "--basic-auth", "ops:s3cret"], env=APP,
                ready=Ready(url=f"http://127.0.0.1:{port}/healthz"))
    base = f"http://127.0.0.1:{port}"
    log_in(browser)
    (Path(stack_env["SAS_HOME"]) / "fixed").touch()  # the fix, deployed

    browser.get(base + "/runs")
    Select(browser.find_element(By.ID, "state")).select_by_value("error")
    Select(browser.find_element(By.ID, "workflow")).select_by_value("fixable")
    browser.find_element(By.ID, "filter").click()
    wait_for(lambda: "workflow=fixable" in browser.current_url, 10, "the filtered page")
    browser.find_element(By.ID, "bulk-rerun").click()
    wait_for(lambda: "/runs/bulk" in browser.current_url, 10, "the confirmation page")
    assert browser.find_element(By.ID, "count").text == "3"
    browser.save_screenshot(str(stack.home / "rerun-confirm.png"))
    browser.find_element(By.ID, "rerun-step").send_keys("charge")
    browser.find_element(By.CSS_SELECTOR, '#confirm input[name="reason"]').send_keys("bug 123 fixed")
    browser.find_element(By.ID, "confirm-button").click()
    wait_for(lambda: "Rerun: 3 done, 0 refused" in browser.page_source, 10, "the bulk action's result")

    for old in failed:
        view = old.status()
        assert view.process_state == "error" and view.run.rerun_as  # its history kept, its rerun named
        new = app.handle(view.run.rerun_as).wait(30)
        assert new.process_state == "processed" and new.run.rerun_of == old.id
        assert new.step("note").result == view.step("note").result  # carried over, not called again
    notes = [c for c in calls(Path(stack_env["SAS_HOME"])) if c["what"] == "do" and c["key"].endswith(":note")]
    assert len(notes) == 3

    # the same bulk rerun sent again (a second click, another operator): nothing is started twice
    browser.back()
    browser.refresh()
    assert browser.find_element(By.ID, "count").text == "3"  # still in error: the filter selects them
    browser.find_element(By.ID, "rerun-step").send_keys("charge")
    browser.find_element(By.ID, "confirm-button").click()
    wait_for(lambda: "Rerun: 0 done, 3 refused" in browser.page_source, 10, "the refusals")
    assert "was rerun already, as run" in browser.find_element(By.ID, "refused").text
    assert len(app.store.list_runs(workflow="fixable")) == 6


def test_a_viewer_finds_no_action_and_an_approver_approves_but_cannot_cancel(stack, shop, browser):
    """Three people on one dashboard (--roles): what each finds on a held order's page."""
    stack.up()
    held = shop.submit("held_order", {"amount": 900}, business_key="held-roles")
    wait_for(lambda: any(s.name == "manager_review" and s.state == "pending" for s in held.status().steps), 30,
             "the held order to wait for its review")
    port = free_port()
    stack.start("dashboard", [SAS, "dashboard", "--port", str(port), "--basic-auth", "vic:v-pw,amy:a-pw,oli:o-pw",
                              "--roles", "amy=approver,oli=operator"],
                ready=Ready(url=f"http://127.0.0.1:{port}/healthz"))
    base = f"http://127.0.0.1:{port}"

    log_in(browser, b"vic:v-pw")
    browser.get(f"{base}/runs/{held.id}")
    assert browser.find_elements(By.TAG_NAME, "form") == [] and browser.find_elements(By.TAG_NAME, "button") == []
    assert "vic is viewer" in browser.find_element(By.ID, "act-hint").text
    assert browser.find_elements(By.LINK_TEXT, "audit") == []
    browser.get(f"{base}/runs")
    assert browser.find_elements(By.ID, "bulk") == [], "no bulk action for a viewer"

    log_in(browser, b"amy:a-pw")
    browser.get(f"{base}/runs/{held.id}")
    assert browser.find_elements(By.CSS_SELECTOR, "form.act") == [], "no cancel, pause or compensate"
    assert browser.find_element(By.ID, "who").text == "amy (approver)"
    browser.find_element(By.CSS_SELECTOR, 'form.signal button[value="approve"]').click()
    wait_for(lambda: browser.find_elements(By.ID, "done"), 10, "the approval's notice")
    assert held.wait(60).process_state == "processed"
    [signal] = shop.store.signals_of(held.id)
    assert (signal.sent_by, signal.payload) == ("amy", {"approved": True, "by": "amy"})

    log_in(browser, b"oli:o-pw")
    browser.get(f"{base}/runs")
    browser.find_element(By.LINK_TEXT, "audit").click()
    wait_for(lambda: browser.find_elements(By.ID, "audit"), 10, "the audit page")
    rows = browser.find_elements(By.CSS_SELECTOR, "#audit tr[data-outcome]")
    assert len(rows) == 1 and "amy (approver)" in rows[0].text and "signal" in rows[0].text
