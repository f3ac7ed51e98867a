"""A slow HTTP scoring service for timing runs (`custom_reward_function.remote.url`): the built-in
scorer of each request's data_source, answered after `--delay-s` (a judge, a sandbox, a remote
verifier). Many requests are served at once (one thread each).

    python benchmarks/slow_service.py --port 8011 --delay-s 0.025 --kwargs '{"format_score": 0.1}' &
    hybridrl train ... custom_reward_function.remote.url=http://127.0.0.1:8011/score
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hybridrl.rewards import default_compute_score


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--delay-s", type=float, default=0.025)
    ap.add_argument("--kwargs", default="{}", help="JSON object of the scorer's options")
    args = ap.parse_args()
    kwargs = json.loads(args.kwargs)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(args.delay_s)
            score = default_compute_score(
                body["data_source"], body["solution_str"], body["ground_truth"], body["extra_info"], **kwargs
            )
            payload = json.dumps({"score": float(score)}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"scoring on http://127.0.0.1:{args.port}/score, {args.delay_s * 1000:g} ms per request", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
