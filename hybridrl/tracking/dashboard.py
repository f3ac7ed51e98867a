"""The live dashboard: the report page served over HTTP, re-reading the runs as they train, and
Prometheus metrics for cluster scrapers. Standard library only (http.server, one thread per request).

    GET /            the report page in live mode (it polls /api/data)
    GET /api/data    the report's data for every run under the folder (JSON)
    GET /metrics     Prometheus text format 0.0.4: the last step's numbers of every run
    GET /healthz     "ok"

A run is read again only when its files changed (size and mtime), so polling a large folder
costs a stat per file.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from hybridrl.tracking.report import payload, render_page, summarize
from hybridrl.tracking.runlog import METRICS, SAMPLES, RunData, find_runs, load_run

# A run whose files have not changed for this long after its last step (and that has not written
# run_summary.json) is reported unhealthy: a stuck or dead worker, or a killed controller.
STALE_FACTOR, STALE_MIN_S = 10.0, 120.0


class RunsFolder:
    """Every run under `root`, re-read when its files change."""

    def __init__(self, root: Path, config_diff=None):
        self.root, self.config_diff = Path(root), config_diff
        self._cache: dict[Path, tuple[tuple, RunData]] = {}
        self._lock = threading.Lock()

    def runs(self) -> list[RunData]:
        out, names = [], set()
        with self._lock:
            for path in find_runs(self.root):
                stamp = tuple(
                    (p.stat().st_size, p.stat().st_mtime_ns) if p.exists() else None for p in (path / METRICS, path / SAMPLES)
                )
                cached = self._cache.get(path)
                if cached is None or cached[0] != stamp:
                    rel = path.relative_to(self.root).as_posix() if path != self.root else path.name
                    cached = self._cache[path] = (stamp, load_run(path, name=rel))
                run = cached[1]
                if run.name not in names:
                    names.add(run.name)
                    out.append(run)
        return out

    def data(self) -> dict:
        runs = self.runs()
        diffs = {r.name: self.config_diff(r.config) for r in runs} if self.config_diff else None
        return payload(runs, diffs)


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
        last = max(run.metrics, key=lambda r: r["step"]) if run.metrics else {}
        s = summarize(run)
        L = {"run": run.name}
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


class Dashboard:
    """The HTTP server; `serve_forever()` blocks, `start()` runs it on a thread (tests)."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 8265, *, interval_ms: int = 2000, config_diff=None):
        self.folder = RunsFolder(root, config_diff)
        self.interval_ms = interval_ms
        self.requests = {"data": 0, "metrics": 0}
        self.after_data = None  # tests: called after each /api/data answer
        dash = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                try:
                    if path in ("/", "/index.html"):
                        page = render_page(
                            None,
                            title=f"hybridrl dashboard: {dash.folder.root}",
                            live={"url": "/api/data", "interval_ms": dash.interval_ms},
                        )
                        self._send(200, "text/html; charset=utf-8", page)
                    elif path == "/api/data":
                        body = json.dumps(dash.folder.data(), separators=(",", ":"))
                        self._send(200, "application/json", body)
                        dash.requests["data"] += 1
                        if dash.after_data:
                            dash.after_data(dash.requests["data"])
                    elif path == "/metrics":
                        dash.requests["metrics"] += 1
                        self._send(200, "text/plain; version=0.0.4; charset=utf-8", prometheus_text(dash.folder.runs()))
                    elif path == "/healthz":
                        self._send(200, "text/plain", "ok\n")
                    else:
                        self._send(404, "text/plain", "not found: try /, /api/data or /metrics\n")
                except (BrokenPipeError, ConnectionResetError):
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

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.host, self.port = self.server.server_address[:2]
        self._thread = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def start(self) -> "Dashboard":
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
