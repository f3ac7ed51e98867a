"""`hybridrl dashboard RUNS_DIR [--port 8265] [--host 127.0.0.1]`: the report, live, for every run
under a folder, and Prometheus metrics at /metrics."""

from __future__ import annotations

import sys
from pathlib import Path


def cmd_dashboard(args) -> int:
    from hybridrl.cli.report import config_diff
    from hybridrl.tracking.dashboard import Dashboard
    from hybridrl.tracking.runlog import find_runs

    root = Path(args.runs_dir)
    if not root.is_dir():
        print(
            f"hybridrl dashboard: error: {root} is not a directory (give the folder your runs write to, e.g. runs/)",
            file=sys.stderr,
        )
        return 2
    try:
        dash = Dashboard(root, args.host, args.port, interval_ms=int(args.interval * 1000), config_diff=config_diff)
    except OSError as e:
        print(
            f"hybridrl dashboard: error: cannot listen on {args.host}:{args.port} ({e.strerror}); pick another --port",
            file=sys.stderr,
        )
        return 2
    n = len(find_runs(root))
    print(
        f"hybridrl dashboard: {dash.url} ({n} run(s) under {root} now; new ones appear as they start) | "
        f"Prometheus: {dash.url}metrics | Ctrl-C stops",
        flush=True,
    )
    if not dash.check_host:
        print(
            f"hybridrl dashboard: note: listening on {args.host}: anyone who can reach this port can read the runs' "
            "prompts and samples (on 127.0.0.1, the default, only this machine's localhost pages can)",
            flush=True,
        )
    try:
        dash.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        dash.stop()
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("dashboard", help="serve the report live for every run under a folder, and Prometheus /metrics")
    s.add_argument(
        "runs_dir", metavar="RUNS_DIR", help="a folder of runs (e.g. runs/); every directory with metrics.jsonl under it"
    )
    s.add_argument("--port", type=int, default=8265, help="port (default 8265; 0 = any free port)")
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this machine only, and only requests for localhost / 127.0.0.1 / [::1]; "
        "another address serves any host name)",
    )
    s.add_argument("--interval", type=float, default=2.0, help="seconds between the page's refreshes (default 2)")
    s.set_defaults(fn=cmd_dashboard)
