"""Issue #43: the dashboard, in a real browser. A detached deployment (repair=True) runs on the
test session's Ray; the dashboard is launched beside it (``replistream.dashboard.launch``); headless
Chromium (Debian's, driven by selenium through Debian's chromedriver) loads the page; a replica is
killed; the page's DOM shows it failed, then the replica that replaced it live and the repair in the
timeline; ``/api/deployments/<name>`` and ``replistream status --json`` say the same; a control
action without the cluster's token is refused, and the page's kill button, given the token, kills.

Set ``REPLISTREAM_DASHBOARD_SCREENSHOT=path.png`` to save a screenshot of the page after the repair
(docs/dashboard.png was taken so)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import ray

import replistream as rs
from replistream import seconds

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
NAME = "dashboard-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build():
    q = rs.Query("dashboard")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(2), by="k", aggs={"n": "count", "sv": ("v", "sum")}, name="per_k").sink("out")
    return q.build()


def inputs(span_s: int = 240, per_s: int = 20):
    n = span_s * per_s
    return {"s": [{"ts": i * seconds(1) // per_s, "k": i % 7, "v": float(i % 13)} for i in range(n)]}


def get(url: str, token: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1400,1900"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def dom_states(driver) -> dict[str, str]:
    """``{label: state}`` as the page's replica table shows it."""
    return driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#replicas tbody tr')]"
        ".map(r => [r.dataset.label, r.dataset.state]))")


def wait_dom(driver, what, cond, timeout: float = 90.0):
    """Poll the DOM until ``cond(driver)`` is truthy; fail naming ``what`` and what the page shows."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = cond(driver)
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"the page never showed {what} within {timeout} s; replicas: {dom_states(driver)}; "
                         f"error: {driver.find_element('id', 'error').text!r}")


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                    reason="Debian's chromium and chromium-driver are not installed (.ci/run installs them: "
                           "apt-get install chromium chromium-driver)")
def test_the_page_shows_a_killed_replica_failed_then_repaired(tmp_path):
    from replistream.dashboard import launch, launched, stop

    address = "127.0.0.1:" + ray.get_runtime_context().gcs_address.rpartition(":")[2]
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-test-token\n")
    log = str(tmp_path / "dash" / "dashboard.log")
    dep = rs.deploy(build(), servers=3, k=2, name=NAME, detached=True, repair=True, progress=False)
    driver = None
    try:
        dep.feed(inputs(), pace=4.0)  # 240 s of event time: about a minute of wall time
        url = launch(address, port=free_port(), token_file=str(token_file), log=log)
        assert url.startswith("http://127.0.0.1:") and launched(log)["url"] == url
        driver = browser(tmp_path)
        driver.get(url + "#" + NAME)
        wait_dom(driver, "per_k#0 live", lambda d: dom_states(d).get("per_k#0") == "live")
        wait_dom(driver, "tuples delivered", lambda d: d.execute_script(
            "const e = document.querySelector('.app[data-app=out] .delivered');"
            "return e && !e.textContent.startsWith('0 ')"))
        before = set(dom_states(driver))

        killed = time.time()
        dep.kill_replica("per_k", 0)
        wait_dom(driver, "per_k#0 failed", lambda d: dom_states(d).get("per_k#0") == "failed")
        shown_failed_s = time.time() - killed
        new = wait_dom(driver, "a new per_k replica live", lambda d: next(
            (lab for lab, st in dom_states(d).items() if lab.startswith("per_k#") and lab not in before
             and st == "live"), None))
        wait_dom(driver, "the repair in the timeline",
                 lambda d: d.find_elements("css selector", "#timeline li[data-event=repaired]"))
        shown_repaired_s = time.time() - killed
        print(f"page: per_k#0 failed {shown_failed_s:.2f} s after the kill, {new} live {shown_repaired_s:.2f} s after")
        assert "per_k#0" in driver.find_element("css selector", "#timeline li[data-event=dead]").text
        graph = driver.find_element("css selector", "#graph [data-label='per_k#0']")
        assert graph.get_attribute("data-state") == "failed"
        if os.environ.get("REPLISTREAM_DASHBOARD_SCREENSHOT"):
            time.sleep(3)  # a few more points on the charts
            driver.save_screenshot(os.environ["REPLISTREAM_DASHBOARD_SCREENSHOT"])

        # the API, the page and `replistream status --json` agree
        code, listing = get(url + "api/deployments")
        assert code == 200 and NAME in [d["name"] for d in listing["deployments"]]
        code, api = get(url + f"api/deployments/{NAME}")
        assert code == 200
        api_states = {r["label"]: r["state"] for r in api["replicas"]}
        assert api_states["per_k#0"] == "failed" and api_states[new] == "live"
        wait_dom(driver, f"the API's states {api_states}", lambda d: dom_states(d) == api_states)
        cli = subprocess.run([sys.executable, "-m", "replistream.cli", "status", NAME, "--json"], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "RAY_ADDRESS": address})
        assert cli.returncode == 0, cli.stderr
        (row,) = json.loads(cli.stdout)
        assert set(row) == set(api), set(row) ^ set(api)
        assert {r["label"]: r["state"] for r in row["replicas"]} == api_states
        assert row["operators"] == api["operators"] and row["edges"] == api["edges"]
        assert [e["seq"] for e in row["timeline"]][:len(api["timeline"])] == [e["seq"] for e in api["timeline"]]
        code, later = get(url + f"api/deployments/{NAME}?since={api['seq']}")
        assert code == 200 and all(e["seq"] > api["seq"] for e in later["timeline"])
        code, missing = get(url + "api/deployments/nope")
        assert code == 404 and NAME in missing["error"]

        # control actions need the cluster's token
        victim = "per_k#1"
        assert get(url + f"api/deployments/{NAME}/kill", body={"replica": victim})[0] == 403
        assert get(url + f"api/deployments/{NAME}/kill", token="wrong", body={"replica": victim})[0] == 403
        assert api_states[victim] == "live"
        # with it, from the page: its kill button sends the token typed in
        driver.find_element("id", "token").send_keys("s3cret-test-token")
        driver.execute_script(f"document.querySelector(\"#replicas tr[data-label='{victim}'] button.kill\").click()")
        wait_dom(driver, f"{victim} failed", lambda d: dom_states(d).get(victim) == "failed")
        assert driver.find_element("id", "control-result").text == f"killed {victim}"
    finally:
        if driver is not None:
            driver.quit()
        stop(log)
        dep.stop()
    assert launched(log) is None


def test_the_dashboard_names_its_mistakes_in_one_line(tmp_path, monkeypatch, capsys):
    """No cluster, a bad port, a port taken: one line each, before anything starts (no Ray needed)."""
    from replistream.cli import main
    from replistream.dashboard import launch
    from replistream.engines.ray import cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no cluster recorded (the records live in ~/.replistream/clusters)
    assert cluster.records() == []

    def one_line(argv, expected):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1, err

    one_line(["dashboard"], "no Ray cluster runs on this machine")
    one_line(["dashboard", "--port", "0"], "--port must be between 1 and 65535")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # never joined: the port is checked first
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line(["dashboard", "--port", str(port)], f"port {port} is in use")
        with pytest.raises(RuntimeError, match=f"port {port} is in use"):
            launch("127.0.0.1:1", port=port, log=str(tmp_path / "d.log"))
