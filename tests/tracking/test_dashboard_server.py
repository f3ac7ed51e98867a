"""The dashboard under what a shared machine does to it: directories vanishing mid-scan, damaged
run files, requests for another host name, idle connections, and 100 runs polled for changes."""

import http.client
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from hybridrl.cli.main import main
from hybridrl.tracking.dashboard import Dashboard, RunsFolder, host_allowed
from hybridrl.tracking.runlog import find_runs


def _write_run(path, steps=3, config="trainer:\n  total_training_steps: 3\n"):
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"step": s, "critic/score/mean": 0.1 * s, "timing_s/step": 1.0} for s in range(1, steps + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config is not None:
        (path / "config.yaml").write_text(config)
    return path


def _get(url, host=None):
    u = urllib.request.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request("GET", u.path + (f"?{u.query}" if u.query else ""), headers={"Host": host} if host else {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body


def test_scan_survives_directories_that_vanish_while_it_walks(tmp_path):
    """Checkpoints are written to temporary directories and renamed: the walk meets directories
    that are gone by the time it lists them (FileNotFoundError in 221 of ~15,200 scans)."""
    runs = tmp_path / "runs"
    want = [_write_run(runs / f"exp{i}") for i in range(3)]
    stop, made = threading.Event(), [0]

    def churn():  # a checkpoint writer, bounded in time and count
        deadline = time.monotonic() + 3.0
        while not stop.is_set() and time.monotonic() < deadline and made[0] < 20000:
            d = runs / "exp1" / "ckpt" / f"tmp{made[0] % 7}"
            (d / "a" / "b").mkdir(parents=True, exist_ok=True)
            shutil.rmtree(runs / "exp1" / "ckpt", ignore_errors=True)
            made[0] += 1

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    folder = RunsFolder(runs)
    scans = 0
    try:
        while t.is_alive() and scans < 3000:
            assert find_runs(runs) == want
            assert [r.name for r in folder.runs()] == ["exp0", "exp1", "exp2"]
            scans += 1
    finally:
        stop.set()
        t.join()
    assert scans > 20 and made[0] > 100, (scans, made[0])


BAD = {
    "truncated": "trainer:\n  total_training_steps: 3\n  experiment_na",  # cut mid-key by a crash
    "a_list": "- 1\n- 2\n",
    "odd_sections": "trainer: [1, 2]\nalgorithm: 3\nactor_rollout_ref: {model: 5}\n",
}


@pytest.fixture()
def mixed_runs(tmp_path):
    runs = tmp_path / "runs"
    _write_run(runs / "good", steps=4)
    for name, cfg in BAD.items():
        _write_run(runs / name, config=cfg)
    huge = _write_run(runs / "huge_int")
    with (huge / "metrics.jsonl").open("a") as f:  # an int past any float, and a line nested too deep
        f.write('{"step": 4, "critic/score/mean": 1' + "0" * 400 + "}\n" + "[" * 100000 + "\n")
    return runs


def test_one_damaged_run_does_not_break_the_others(mixed_runs):
    dash = Dashboard(mixed_runs, port=0).start()
    try:
        status, body = _get(dash.url + "api/data")
        assert status == 200
        runs = {r["name"]: r for r in json.loads(body)["runs"]}
        assert sorted(runs) == ["a_list", "good", "huge_int", "odd_sections", "truncated"]
        assert runs["good"]["error"] is None and runs["good"]["series"]["step"] == [1, 2, 3, 4]
        assert "config.yaml: not valid YAML at line 3" in runs["truncated"]["error"]
        assert "config.yaml: holds a list, not the mapping" in runs["a_list"]["error"]
        assert runs["a_list"]["series"] == {"step": []}
        # sections of the wrong type are read around, not fatal
        assert runs["odd_sections"]["error"] is None and runs["odd_sections"]["summary"]["total_steps"] is None
        # the huge int is dropped like inf, the deep line skipped with a note
        assert runs["huge_int"]["error"] is None and runs["huge_int"]["series"]["step"] == [1, 2, 3, 4]
        assert runs["huge_int"]["series"]["critic/score/mean"][-1] is None
        assert any("nested too deep" in n for n in runs["huge_int"]["notes"])

        status, body = _get(dash.url + "metrics")
        assert status == 200
        lines = body.decode().splitlines()
        assert 'hybridrl_step{run="good"} 4.0' in lines and 'hybridrl_run_readable{run="good"} 1.0' in lines
        assert 'hybridrl_run_readable{run="truncated"} 0.0' in lines and 'hybridrl_run_readable{run="a_list"} 0.0' in lines
        assert 'hybridrl_step{run="huge_int"} 4.0' in lines
    finally:
        dash.stop()


def test_report_of_a_damaged_run_is_one_line(mixed_runs, tmp_path, capsys):
    for name, why in (("truncated", "not valid YAML at line 3"), ("a_list", "holds a list")):
        rc = main(["report", str(mixed_runs / name), "--out", str(tmp_path / "r.html")])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and err.startswith("hybridrl: error: ") and why in err, err
    assert main(["report", str(mixed_runs / "odd_sections"), "--out", str(tmp_path / "r.html")]) == 0


@pytest.fixture()
def hostile_runs(tmp_path):
    """Run folders holding what a shared machine's users can put under the names a run writes."""
    import os

    runs = tmp_path / "runs"
    _write_run(runs / "good", steps=4)
    os.mkfifo(_write_run(runs / "fifo", config=None) / "metrics.jsonl.tmp")
    os.replace(runs / "fifo" / "metrics.jsonl.tmp", runs / "fifo" / "metrics.jsonl")  # a FIFO: no writer, ever
    (runs / "zero").mkdir()
    (runs / "zero" / "metrics.jsonl").symlink_to("/dev/zero")  # endless bytes
    os.mkfifo(_write_run(runs / "fifo_config", config=None) / "config.yaml")
    os.mkfifo(_write_run(runs / "fifo_samples") / "samples.jsonl")
    (_write_run(runs / "dir_samples") / "samples.jsonl").mkdir()
    return runs


def _hybridrl(*args, **kw) -> subprocess.Popen:
    """`python -m hybridrl ARGS` in a process of its own with 2 GiB of address space: were a read
    to block or run away, the test fails on its timeout or a MemoryError, never hangs or swaps."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.Popen([sys.executable, "-m", "hybridrl", *map(str, args)], preexec_fn=limit, text=True, **kw)


def test_fifos_and_devices_in_run_folders_never_block_the_dashboard(hostile_runs):
    """A FIFO named metrics.jsonl (or config.yaml, samples.jsonl) and a metrics.jsonl linked to
    /dev/zero: each such run is listed with the reason, the others are served, /healthz and
    /metrics answer at once."""
    proc = _hybridrl("dashboard", hostile_runs, "--port", "0", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = proc.stdout.readline().split()[2]  # "hybridrl dashboard: http://127.0.0.1:PORT/ (6 run(s) ..."
        for _ in range(2):  # the second scan re-reads nothing that did not change
            status, body = _get(url + "api/data")
            assert status == 200
            runs = {r["name"]: r for r in json.loads(body)["runs"]}
            assert sorted(runs) == ["dir_samples", "fifo", "fifo_config", "fifo_samples", "good", "zero"]
            assert runs["good"]["error"] is None and runs["good"]["series"]["step"] == [1, 2, 3, 4]
            assert "metrics.jsonl: is a FIFO, not a regular file" in runs["fifo"]["error"]
            assert "metrics.jsonl: is a device or socket, not a regular file" in runs["zero"]["error"]
            assert "config.yaml: is a FIFO" in runs["fifo_config"]["error"]
            assert "samples.jsonl: is a FIFO" in runs["fifo_samples"]["error"]
            assert "samples.jsonl: is a directory" in runs["dir_samples"]["error"]
        t0 = time.monotonic()
        assert _get(url + "healthz") == (200, b"ok\n") and time.monotonic() - t0 < 2.0
        status, body = _get(url + "metrics")
        assert status == 200 and 'hybridrl_run_readable{run="fifo"} 0.0' in body.decode().splitlines()
    finally:
        proc.kill()
        proc.communicate()


def test_report_of_a_fifo_or_device_is_one_line(hostile_runs, tmp_path):
    for name, why in (("fifo", "is a FIFO"), ("zero", "is a device or socket"), ("fifo_config", "config.yaml: is a FIFO")):
        proc = _hybridrl("report", hostile_runs / name, "--out", tmp_path / "r.html", stderr=subprocess.PIPE)
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 2 and err.count("\n") == 1 and err.startswith("hybridrl: error: ") and why in err, err


def test_a_jsonl_file_over_the_cap_is_read_from_its_end(tmp_path, monkeypatch):
    from hybridrl.tracking import runlog

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": 0.25}) + "\n" for s in range(100, 300)))  # 25 bytes a line
    monkeypatch.setattr(runlog, "MAX_JSONL_BYTES", 1000)
    rows, notes = runlog.read_jsonl(path)
    assert [r["step"] for r in rows] == list(range(260, 300))  # the last 40 lines, whole
    monkeypatch.setattr(runlog, "MAX_JSONL_BYTES", 1010)
    assert [r["step"] for r in runlog.read_jsonl(path)[0]] == list(range(260, 300))  # a cut line is dropped
    assert len(notes) == 1 and "over the 0 MiB read: only its last lines are shown" in notes[0]
    monkeypatch.setattr(runlog, "MAX_CONFIG_BYTES", 10)
    (tmp_path / "config.yaml").write_text("trainer:\n  total_training_steps: 3\n")
    with pytest.raises(runlog.RunError, match="not a run's config"):
        runlog.read_config(tmp_path / "config.yaml")


def test_host_header_is_checked_on_loopback():
    for ok in ("localhost", "localhost:8265", "127.0.0.1:9000", "[::1]:8265", "[::1]", None):
        assert host_allowed(ok), ok
    for bad in ("evil.example", "evil.example:8265", "localhost.evil.example", "127.0.0.1.nip.io:8265", "[::2]:1", "localhost:x"):
        assert not host_allowed(bad), bad


def test_dashboard_refuses_other_host_names_unless_told(tmp_path):
    _write_run(tmp_path / "runs" / "a")
    dash = Dashboard(tmp_path / "runs", port=0).start()
    try:
        assert _get(dash.url + "api/data", host=f"rebound.example:{dash.port}")[0] == 403
        assert _get(dash.url + "metrics", host="rebound.example")[0] == 403
        assert _get(dash.url + "api/data", host=f"localhost:{dash.port}")[0] == 200
        assert _get(dash.url + "api/data", host=f"127.0.0.1:{dash.port}")[0] == 200
    finally:
        dash.stop()
    served = Dashboard(tmp_path / "runs", port=0, check_host=False).start()  # what --host 0.0.0.0 gives
    try:
        assert _get(served.url + "api/data", host="gpu-box.lab:8265")[0] == 200
    finally:
        served.stop()


def test_idle_connections_take_no_thread_and_are_closed(tmp_path):
    _write_run(tmp_path / "runs" / "a")
    before = threading.active_count()
    dash = Dashboard(tmp_path / "runs", port=0, workers=4, idle_s=1.0).start()
    idle = []
    try:
        for _ in range(50):
            s = socket.create_connection((dash.host, dash.port), timeout=10)
            idle.append(s)
        time.sleep(0.3)
        t0 = time.monotonic()
        assert _get(dash.url + "healthz") == (200, b"ok\n")
        assert time.monotonic() - t0 < 2.0
        assert threading.active_count() - before <= 4 + 1  # the pool and the accept loop
        for s in idle:  # the server closes each idle connection after idle_s
            s.settimeout(5.0)
            assert s.recv(1) == b""
        assert _get(dash.url + "api/data")[0] == 200
    finally:
        for s in idle:
            s.close()
        dash.stop()


def _grow(path, *steps):
    with (path / "metrics.jsonl").open("a") as f:
        for s in steps:
            f.write(json.dumps({"step": s, "critic/score/mean": 0.5, "timing_s/step": 1.0}) + "\n")


def test_polling_since_a_cursor_sends_only_what_changed(tmp_path):
    runs = tmp_path / "runs"
    for i in range(100):
        _write_run(runs / f"exp{i:03d}", steps=200)
    folder = RunsFolder(runs)
    first = folder.data()
    assert len(first["runs"]) == 100 and len(first["names"]) == 100 and all(r["full"] for r in first["runs"])
    size = len(json.dumps(first))

    _grow(runs / "exp007", 201, 202)
    second = folder.data(first["cursor"])
    assert [r["name"] for r in second["runs"]] == ["exp007"] and "names" not in second
    run = second["runs"][0]
    assert "full" not in run and run["append"] == {
        "step": [201, 202],
        "critic/score/mean": [0.5, 0.5],
        "timing_s/step": [1.0, 1.0],
    }
    assert run["summary"]["last_step"] == 202 and run["points"] == 202
    assert len(json.dumps(second)) * 50 < size

    third = folder.data(second["cursor"])
    assert third["runs"] == [] and "names" not in third and third["cursor"] == second["cursor"]

    # a client two answers behind gets both steps of exp003 and the one of exp007
    _grow(runs / "exp003", 201)
    later = folder.data(second["cursor"])
    _grow(runs / "exp007", 203)
    behind = {r["name"]: r for r in folder.data(second["cursor"])["runs"]}
    assert behind["exp003"]["append"]["step"] == [201] and behind["exp007"]["append"]["step"] == [203]
    assert [r["name"] for r in folder.data(later["cursor"])["runs"]] == ["exp007"]

    # a resume drops lines: the run comes whole; a new run and a removed one change the names
    _write_run(runs / "exp050", steps=120)
    _write_run(runs / "new", steps=2)
    shutil.rmtree(runs / "exp099")
    cursor = folder.data()["cursor"]
    _write_run(runs / "exp051", steps=50)
    d = folder.data(later["cursor"])
    got = {r["name"]: r for r in d["runs"]}
    assert got["exp050"]["full"] and got["exp050"]["series"]["step"][-1] == 120 and got["new"]["full"]
    assert "exp099" not in d["names"] and "new" in d["names"] and len(d["names"]) == 100
    assert [r["name"] for r in folder.data(cursor)["runs"]] == ["exp051"]
    # a cursor of another server process (restarted): everything again
    assert len(folder.data("0000-3")["runs"]) == 100


def test_curves_come_only_for_the_compared_runs(tmp_path):
    runs = tmp_path / "runs"
    for i in range(20):
        _write_run(runs / f"exp{i:02d}", steps=300)
    folder = RunsFolder(runs)
    brief = folder.data(series=[])  # the run list: summaries only
    assert len(brief["runs"]) == 20 and not any("series" in r for r in brief["runs"])
    assert brief["runs"][3]["summary"]["last_step"] == 300
    full = folder.data()
    assert len(json.dumps(brief)) * 4 < len(json.dumps(full))

    loaded = folder.data(brief["cursor"], series=[], load=["exp03"])  # exp03 just chosen: whole, unchanged or not
    assert [r["name"] for r in loaded["runs"]] == ["exp03"] and loaded["runs"][0]["series"]["step"][-1] == 300
    _grow(runs / "exp03", 301)
    _grow(runs / "exp04", 301)
    d = {r["name"]: r for r in folder.data(loaded["cursor"], series=["exp03"])["runs"]}
    assert d["exp03"]["append"]["step"] == [301]  # compared: its new line
    assert "append" not in d["exp04"] and "series" not in d["exp04"] and d["exp04"]["summary"]["last_step"] == 301


def test_api_data_reads_series_and_load_from_the_query(tmp_path):
    for n in ("a,b", "c"):
        _write_run(tmp_path / "runs" / n)
    dash = Dashboard(tmp_path / "runs", port=0).start()
    try:
        first = json.loads(_get(dash.url + "api/data?series=")[1])
        assert [("series" in r) for r in first["runs"]] == [False, False]
        got = json.loads(_get(dash.url + f"api/data?since={first['cursor']}&series=&load=a%2Cb")[1])
        assert [r["name"] for r in got["runs"]] == ["a,b"] and got["runs"][0]["series"]["step"] == [1, 2, 3]
        assert all("series" in r for r in json.loads(_get(dash.url + "api/data")[1])["runs"])  # no series=: every run whole
        samples = json.loads(_get(dash.url + "api/samples?run=c")[1])
        assert samples == {"name": "c", "samples": [], "samples_dropped": 0}
        assert _get(dash.url + "api/samples?run=nope")[0] == 404
    finally:
        dash.stop()


def test_a_bug_in_a_handler_is_a_500_and_the_server_serves_on(tmp_path, capsys):
    _write_run(tmp_path / "runs" / "a")
    dash = Dashboard(tmp_path / "runs", port=0).start()
    try:
        dash.folder.data = lambda *a: 1 / 0
        status, body = _get(dash.url + "api/data")
        assert status == 500 and b"ZeroDivisionError" in body
        assert "ZeroDivisionError" in capsys.readouterr().err  # the traceback, on the console
        assert _get(dash.url + "healthz") == (200, b"ok\n")
    finally:
        dash.stop()
