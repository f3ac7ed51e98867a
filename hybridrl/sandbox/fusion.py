"""Running code on a SandboxFusion-compatible service instead of the local sandbox."""

from __future__ import annotations

import asyncio
import time

from .config import SandboxConfig, SandboxResult


class SandboxFusionClient:
    """Runs code on a SandboxFusion-compatible service (verl's `sandbox_fusion.url`): POST
    {"code", "language": "python", "run_timeout", "memory_limit_MB"} to `url` (its /run_code
    endpoint) and read `run_result.{stdout, stderr, return_code, status}`. The service does the
    isolation; this client bounds time (per request, with retries on connection errors), the
    response size, and the output it keeps. Standard library only (urllib in a thread)."""

    def __init__(self, url: str, config: SandboxConfig | None = None, retries: int = 2, max_response_bytes: int = 1 << 20):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"sandbox_fusion_url must be an http:// or https:// URL (its /run_code endpoint), got {url!r}")
        self.url, self.config, self.retries, self.max_response_bytes = url, config or SandboxConfig(), retries, max_response_bytes
        self._semaphore: asyncio.Semaphore | None = None

    async def run(self, code: str, stdin: str = "") -> SandboxResult:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.config.max_concurrency)
        async with self._semaphore:
            start = time.perf_counter()
            body = await asyncio.to_thread(self._post, code, stdin)
            return self._result(body, time.perf_counter() - start)

    def _post(self, code: str, stdin: str) -> dict:
        import json
        import urllib.error
        import urllib.request

        c = self.config
        payload = {"code": code, "language": "python", "run_timeout": c.wall_timeout_s, "memory_limit_MB": c.memory_mb}
        if stdin:
            payload["stdin"] = stdin
        request = urllib.request.Request(
            self.url, json.dumps(payload).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=c.wall_timeout_s + 10) as response:
                    raw = response.read(self.max_response_bytes + 1)
                if len(raw) > self.max_response_bytes:
                    return {"_error": f"the sandbox service's response is over {self.max_response_bytes} bytes"}
                return json.loads(raw)
            except urllib.error.HTTPError as e:
                return {"_error": f"the sandbox service at {self.url} answered HTTP {e.code}"}
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                last = e
                time.sleep(0.2 * (attempt + 1))
            except json.JSONDecodeError:
                return {"_error": f"the sandbox service at {self.url} did not answer JSON"}
        return {"_error": f"the sandbox service at {self.url} is unreachable ({type(last).__name__}: {last})"}

    def _result(self, body: dict, seconds: float) -> SandboxResult:
        limit = self.config.max_output_bytes
        if "_error" in body:
            return SandboxResult("", body["_error"], None, duration_s=seconds)
        run = body.get("run_result") or {}
        compile_ = body.get("compile_result") or {}
        out, err = str(run.get("stdout") or ""), str(run.get("stderr") or compile_.get("stderr") or "")
        truncated = len(out.encode()) > limit or len(err.encode()) > limit
        timed_out = run.get("status") == "TimeLimitExceeded"
        code = run.get("return_code")
        if code is None and body.get("status") not in ("Success", None):
            err = err or f"sandbox service status {body.get('status')}: {body.get('message', '')}"
            code = 1
        return SandboxResult(
            out.encode()[:limit].decode("utf-8", "ignore"),
            err.encode()[:limit].decode("utf-8", "ignore"),
            None if timed_out else code,
            timed_out,
            truncated,
            seconds,
        )
