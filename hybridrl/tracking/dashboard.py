"""The live dashboard: the report page served over HTTP, re-reading the runs as they train, and
Prometheus metrics for cluster scrapers. Standard library only.

    GET /                    the report page in live mode (it polls /api/data for changes)
    GET /api/data            every run under the folder: summary, curves, config diff (JSON)
    GET /api/data?since=C    only what changed after cursor C (the `cursor` of the last answer):
                             new metric lines of the runs that grew, whole runs that are new or
                             were rewritten (a resume drops lines), the run names when they changed
        &series=a&series=b   curves only for runs a and b; the others' summaries (the run list)
        &load=c              run c whole, changed or not (just chosen for comparison)
    GET /api/samples?run=R   the prompt groups of run R (the rollout inspector asks for one run)
    GET /metrics             Prometheus text format 0.0.4: the last step's numbers of every run
    GET /healthz             "ok"

A run is read again only when its files changed (size and mtime), and read alone: a run whose
files cannot be read is listed with its reason, and the others are served as usual.

The server answers on a fixed pool of threads. A connection takes a thread only once its request
has arrived (a selector watches the idle ones), so idle or half-open connections cost a socket,
are closed after `idle_s`, and cannot starve the pool. Bound to a loopback address, it answers
only requests whose Host header names this machine (localhost, 127.0.0.1, [::1]): a web page whose
domain was re-pointed at 127.0.0.1 (DNS rebinding) gets 403 instead of the runs' data.
"""

from __future__ import annotations

import json
import math
import os
import re
import selectors
import socket
import threading
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from hybridrl.tracking.report import MAX_GROUPS, MAX_POINTS, downsample, render_page, run_payload, summarize, thin_samples
from hybridrl.tracking.runlog import CONFIG, METRICS, SAMPLES, RunData, find_runs, load_run_or_error

# A run whose files have not changed for this long after its last step (and that has not written
# run_summary.json) is reported unhealthy: a stuck or dead worker, or a killed controller.
STALE_FACTOR, STALE_MIN_S = 10.0, 120.0
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
HISTORY = 64  # changes remembered per run: a client further behind gets the whole run again


def _stamp(path: Path) -> tuple:
    out = []
    for name in (METRICS, SAMPLES, CONFIG, "run_summary.json"):
        try:
            st = os.stat(path / name)
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def _extends(old: RunData, new: RunData) -> bool:
    """The new read holds the old read's metric lines first (the file only grew)."""
    n = len(old.metrics)
    return old.error is None and new.error is None and len(new.metrics) >= n and (n == 0 or new.metrics[n - 1] == old.metrics[-1])


@dataclass
class _Entry:
    stamp: tuple
    run: RunData
    epoch: int  # the scan at which its metric lines last stopped being an extension of the previous read
    history: list  # (scan, epoch, metric lines) after each change a scan noticed, oldest first
    full: dict | None = None  # its whole payload, built on first use


class RunsFolder:
    """Every run under `root`, re-read when its files change, with the changes numbered so a client
    can ask for what is new since its last answer."""

    def __init__(self, root: Path, config_diff=None, max_points: int = MAX_POINTS):
        self.root, self.config_diff, self.max_points = Path(root), config_diff, max_points
        self.boot = os.urandom(4).hex()  # a cursor of an earlier server process is not ours
        self.seq = 0  # scans that noticed a change
        self.names_seq = 0  # the scan at which the set of runs last changed
        self._entries: dict[str, _Entry] = {}
        self._order: list[str] = []
        self._lock = threading.Lock()
        self.scan_s = 0.0  # the last scan's wall time (docs/observability.md quotes it at 100 runs)

    def _name(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() if path != self.root else path.name

    def _scan(self) -> list[_Entry]:
        t0 = time.perf_counter()
        changed, seen = [], []
        for path in find_runs(self.root):
            name = self._name(path)
            stamp = _stamp(path)
            entry = self._entries.get(name)
            if entry is None or entry.stamp != stamp:
                run = load_run_or_error(path, name)
                if run is None:  # vanished while we looked
                    continue
                changed.append((name, stamp, run))
            seen.append(name)
        if changed or seen != self._order:
            self.seq += 1
        for name, stamp, run in changed:
            old = self._entries.get(name)
            epoch = old.epoch if old is not None and _extends(old.run, run) else self.seq
            history = (old.history if old is not None else []) + [(self.seq, epoch, len(run.metrics))]
            self._entries[name] = _Entry(stamp, run, epoch, history[-HISTORY:])
        if seen != self._order:
            for gone in set(self._order) - set(seen):
                self._entries.pop(gone, None)
            self._order, self.names_seq = seen, self.seq
        self.scan_s = time.perf_counter() - t0
        return [self._entries[n] for n in self._order]

    def runs(self) -> list[RunData]:
        with self._lock:
            return [e.run for e in self._scan()]

    def run(self, name: str) -> RunData | None:
        with self._lock:
            self._scan()
            entry = self._entries.get(name)
        return entry.run if entry else None

    def data(self, since: str | None = None, series=None, load=()) -> dict:
        """The page's data: every run (`since` None or a cursor of another server process), else
        only the runs that changed after the cursor `since`.

        Curves (and the config diff) come only for the runs named in `series` (None: every run);
        the others come as their summary, which is what the run list shows. A run in `series` that
        grew comes as its new metric lines (`append`), unless the client's copy cannot be extended
        (a resume rewrote the file): then whole. Runs in `load` come whole, changed or not (the
        page asks so for a run the user just chose to compare)."""
        with self._lock:
            entries = self._scan()
            seq, names_seq = self.seq, self.names_seq
        after = _parse_cursor(since, self.boot)
        load = set(load)
        out = []
        for e in entries:
            name = e.run.name
            if name in load:
                out.append(self._full(e))
                continue
            if after is not None and e.history[-1][0] <= after:
                continue  # unchanged since the client's answer
            if series is not None and name not in series:
                out.append(self._brief(e))
                continue
            held = _state_at(e.history, after)
            if held is None or held[1] != e.epoch or e.run.error:
                out.append(self._full(e))
            else:
                out.append(self._delta(e, held[2]))
        d = {"generated": time.strftime("%Y-%m-%d %H:%M:%S"), "cursor": f"{self.boot}-{seq}", "runs": out}
        if after is None or names_seq > after:
            d["names"] = [e.run.name for e in entries]
        return d

    def _full(self, e: _Entry) -> dict:
        if e.full is None:
            try:
                diff = self.config_diff(e.run.config) if self.config_diff and e.run.config else []
            except Exception:  # noqa: BLE001 (a config the schema cannot read: show the run without its diff)
                diff = []
            e.full = _isolated(lambda: run_payload(e.run, diff, self.max_points, samples=False), e.run)
            e.full["epoch"] = e.epoch
        return {**e.full, "full": True}

    def _brief(self, e: _Entry) -> dict:
        full = self._full(e)
        return {k: full[k] for k in ("name", "epoch", "summary", "points", "notes", "error") if k in full}

    def _delta(self, e: _Entry, held: int) -> dict:
        return {**self._brief(e), "append": downsample(e.run.metrics[held:], max_points=2**62)}


def _isolated(build, run: RunData) -> dict:
    """`build()`, or a payload that shows the run as unreadable with the reason: one run's odd
    numbers must not take the page down for every run."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001
        bad = RunData(run.name, run.path, error=f"cannot summarize this run: {type(e).__name__}: {e}")
        return run_payload(bad, [], samples=False)


def _parse_cursor(since: str | None, boot: str) -> int | None:
    if not since:
        return None
    b, _, n = since.partition("-")
    return int(n) if b == boot and n.isdigit() else None


def _state_at(history: list, after: int | None):
    """The (scan, epoch, lines) a client holds whose last answer was at scan `after`."""
    if after is None:
        return None
    held = [h for h in history if h[0] <= after]
    return held[-1] if held else None


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _metric_name(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def prometheus_text(runs: list[RunData], now: float | None = None) -> str:
    """The last step of every run as Prometheus gauges (text exposition format 0.0.4)."""
    now = time.time() if now is None else now
    fams: dict[str, tuple[str, list[str]]] = {}

    def gauge(name: str, help_: str, labels: dict, value) -> None:
        if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        lab = ",".join(f'{k}="{_label(str(v))}"' for k, v in labels.items())
        fams.setdefault(name, (help_, []))[1].append(f"{name}{{{lab}}} {float(value)!r}")

    for run in runs:
        L = {"run": run.name}
        gauge(
            "hybridrl_run_readable",
            "0 when the run's files cannot be read (the dashboard's page says why).",
            L,
            float(not run.error),
        )
        if run.error:
            continue
        try:
            s = summarize(run)
        except Exception:  # noqa: BLE001 (one run's odd numbers must not hide the others)
            continue
        last = max(run.metrics, key=lambda r: r["step"]) if run.metrics else {}
        gauge("hybridrl_step", "Last step written to metrics.jsonl.", L, run.last_step)
        gauge("hybridrl_total_steps", "trainer.total_training_steps of the run.", L, s["total_steps"])
        for key, name, help_ in (
            ("critic/score/mean", "hybridrl_reward", "Mean training reward (critic/score/mean) of the last step."),
            ("actor/kl_loss", "hybridrl_kl", "KL to the reference of the last step (actor/kl_loss)."),
            ("actor/reward_kl_penalty", "hybridrl_reward_kl_penalty", "KL in the reward (actor/reward_kl_penalty)."),
            ("actor/entropy", "hybridrl_entropy", "Policy entropy of the last step."),
            ("response_length/mean", "hybridrl_response_length_mean", "Mean response length (tokens) of the last step."),
            (
                "perf/throughput",
                "hybridrl_throughput_tokens_per_second",
                "Tokens (prompt + response) per second of the last step.",
            ),
            ("perf/mfu/actor", "hybridrl_mfu_actor", "Model FLOPs utilization of the actor update."),
            ("perf/max_memory_allocated_gb", "hybridrl_gpu_memory_allocated_gigabytes", "Peak device memory allocated (GB)."),
            ("timing_s/step", "hybridrl_step_seconds", "Wall time of the last step."),
            ("loss", "hybridrl_loss", "DPO / KTO / SFT loss of the last step."),
        ):
            gauge(name, help_, L, last.get(key))
        for key, v in last.items():
            if key.startswith("timing_s/") and key != "timing_s/step":
                gauge(
                    "hybridrl_stage_seconds",
                    "Seconds of each stage of the last step (timing_s/<stage>).",
                    {**L, "stage": key[9:]},
                    v,
                )
        for key, v in s["validation"].items():
            gauge("hybridrl_validation_score", "Last validation value per metric key.", {**L, "key": key}, v["last"])
        age = now - run.mtime if run.mtime else None
        gauge("hybridrl_last_update_age_seconds", "Seconds since the run last wrote metrics or samples.", L, age)
        step_s = last.get("timing_s/step") or 0.0
        healthy = s["finished"] or (age is not None and age < max(STALE_MIN_S, STALE_FACTOR * step_s))
        gauge("hybridrl_run_finished", "1 when the run wrote its end-of-run summary.", L, float(s["finished"]))
        gauge(
            "hybridrl_run_healthy",
            "1 when the run is finished or wrote a step recently (its workers are alive).",
            L,
            float(bool(healthy)),
        )
        for key, v in last.items():
            if key != "step":
                gauge("hybridrl_metric", "Every numeric metric of the last step, by its metrics.jsonl key.", {**L, "key": key}, v)
    lines = []
    for name, (help_, samples) in fams.items():
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", *samples]
    return "\n".join(lines) + "\n"


def host_allowed(host: str | None, names=LOOPBACK_HOSTS) -> bool:
    """Whether a request's Host header names one of `names`, with any port (an SSH tunnel
    forwards another local port). No header at all is an HTTP/1.0 tool, never a browser."""
    if host is None:
        return True
    h = host.strip().lower()
    if h.startswith("["):  # [::1] or [::1]:8265
        name = h[: h.find("]") + 1]
        port = h[len(name) :]
    else:
        name, colon, port = h.partition(":")
        port = colon + port
    return name in names and (port == "" or (port[:1] == ":" and port[1:].isdigit()))


class Dashboard:
    """The HTTP server; `serve_forever()` blocks, `start()` runs it on a thread (tests).

    `workers` threads answer requests; at most `max_idle` connections wait for their request, each
    for at most `idle_s` seconds; a request's headers must arrive within `read_s`. `check_host`
    (default: when bound to a loopback address) refuses requests whose Host is not this machine.
    """

    def __init__(
        self,
        root: Path,
        host: str = "127.0.0.1",
        port: int = 8265,
        *,
        interval_ms: int = 2000,
        config_diff=None,
        workers: int = 8,
        idle_s: float = 30.0,
        read_s: float = 10.0,
        max_idle: int = 256,
        check_host: bool | None = None,
    ):
        self.folder = RunsFolder(root, config_diff)
        self.interval_ms = interval_ms
        self.requests = {"data": 0, "metrics": 0, "samples": 0, "refused": 0}
        self.sent = deque(maxlen=1000)  # bytes of the last /api/data answers (the browser test reads them)
        self.after_data = None  # tests: called after each /api/data answer
        self.check_host = host in ("127.0.0.1", "localhost", "::1") if check_host is None else check_host
        self.idle_s, self.max_idle = idle_s, max_idle
        dash = self

        class Handler(BaseHTTPRequestHandler):
            timeout = read_s  # socket timeout while reading the request and writing the answer

            def do_GET(self):  # noqa: N802 (http.server's name)
                url = urlsplit(self.path)
                lists = parse_qs(url.query, keep_blank_values=True)  # series=a&series=b; a blank series= is "none"
                query = {k: v[-1] for k, v in lists.items()}
                try:
                    if dash.check_host and not host_allowed(self.headers.get("Host")):
                        dash.requests["refused"] += 1
                        why = "forbidden: this dashboard answers requests for localhost only (--host serves other names)\n"
                        self._send(403, "text/plain", why)
                    elif url.path in ("/", "/index.html"):
                        page = render_page(
                            None,
                            title=f"hybridrl dashboard: {dash.folder.root}",
                            live={"url": "/api/data", "samples_url": "/api/samples", "interval_ms": dash.interval_ms},
                        )
                        self._send(200, "text/html; charset=utf-8", page)
                    elif url.path == "/api/data":
                        series = [n for n in lists["series"] if n] if "series" in lists else None
                        load = [n for n in lists.get("load", []) if n]
                        data = dash.folder.data(query.get("since"), series, load)
                        body = json.dumps(data, separators=(",", ":"))
                        self._send(200, "application/json", body)
                        dash.requests["data"] += 1
                        dash.sent.append(len(body.encode()))
                        if dash.after_data:
                            dash.after_data(dash.requests["data"])
                    elif url.path == "/api/samples":
                        run = dash.folder.run(query.get("run", ""))
                        if run is None:
                            self._send(404, "application/json", json.dumps({"error": f"no run {query.get('run')!r}"}))
                        else:
                            groups = thin_samples(run.samples, MAX_GROUPS)
                            body = {"name": run.name, "samples": groups, "samples_dropped": len(run.samples) - len(groups)}
                            self._send(200, "application/json", json.dumps(body, separators=(",", ":")))
                            dash.requests["samples"] += 1
                    elif url.path == "/metrics":
                        dash.requests["metrics"] += 1
                        self._send(200, "text/plain; version=0.0.4; charset=utf-8", prometheus_text(dash.folder.runs()))
                    elif url.path == "/healthz":
                        self._send(200, "text/plain", "ok\n")
                    else:
                        self._send(404, "text/plain", "not found: try /, /api/data or /metrics\n")
                except (BrokenPipeError, ConnectionResetError, TimeoutError):
                    pass
                except Exception as e:  # noqa: BLE001 (a bug: say so to the client and on the console, serve on)
                    traceback.print_exc()
                    try:
                        self._send(500, "text/plain", f"internal error in hybridrl dashboard: {type(e).__name__}: {e}\n")
                    except OSError:
                        pass

            def _send(self, code: int, ctype: str, body: str) -> None:
                raw = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(raw)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format, *args):  # one line per request would bury the console
                pass

        self.server = HTTPServer((host, port), Handler)
        self.host, self.port = self.server.server_address[:2]
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="hybridrl-dashboard")
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._thread = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def serve_forever(self) -> None:
        """Accept connections and hand each to the pool once its request has arrived."""
        self._stopped.clear()
        listener = self.server.socket
        listener.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        idle: dict[socket.socket, float] = {}  # connection -> when it was accepted (insertion order)
        try:
            while not self._stopping.is_set():
                for key, _ in sel.select(timeout=min(1.0, self.idle_s)):
                    if key.data == "listen":
                        try:
                            conn, addr = listener.accept()
                        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                            continue
                        if len(idle) >= self.max_idle:  # too many waiting: the oldest goes
                            oldest = next(iter(idle))
                            sel.unregister(oldest)
                            del idle[oldest]
                            _close(oldest)
                        idle[conn] = time.monotonic()
                        sel.register(conn, selectors.EVENT_READ, addr)
                    elif key.data == "wake":
                        self._wake_r.recv(64)
                    else:  # its request (or its close) arrived: a worker reads it
                        conn = key.fileobj
                        sel.unregister(conn)
                        del idle[conn]
                        self._pool.submit(self._answer, conn, key.data)
                deadline = time.monotonic() - self.idle_s
                for conn in [c for c, t in idle.items() if t < deadline]:
                    sel.unregister(conn)
                    del idle[conn]
                    _close(conn)
        finally:
            for conn in idle:
                _close(conn)
            sel.close()
            self._stopped.set()

    def _answer(self, conn: socket.socket, addr) -> None:
        try:
            conn.setblocking(True)
            self.server.finish_request(conn, addr)
        except Exception:  # noqa: BLE001 (a client that went away mid-request; the server goes on)
            pass
        finally:
            self.server.shutdown_request(conn)

    def start(self) -> "Dashboard":
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="hybridrl-dashboard-accept")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.server.server_close()
        self._wake_r.close()
        self._wake_w.close()


def _close(conn: socket.socket) -> None:
    try:
        conn.close()
    except OSError:
        pass
