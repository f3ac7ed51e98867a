"""A model's chat template is code that comes with its files (Jinja, in tokenizer_config.json or
chat_template.jinja). transformers renders it in Jinja's sandbox, which stops it reading files or
calling Python, and caps a single `range()` at 100,000, but not its running time or memory: two
nested loops of 100,000 hang the run, and `"x" * 10**10` asks for 10 GB.

`check_chat_template` renders a template once, on a short conversation, in a forked child process
with a wall-time limit (`RENDER_S`), an address-space limit (`HEADROOM` beyond what the trainer
holds) and a size limit on the text (`MAX_CHARS`). A template past any of them stops the run at
start with one DataError line. The verdict is kept per template text, so each renders once per
process. What the probe cannot see: a template whose cost grows with the messages' content is
bounded by the conversations it is given, as any code is.
"""

from __future__ import annotations

import os
import signal
import time

from hybridrl.data.errors import DataError

RENDER_S = 10.0
MAX_CHARS = 1 << 20  # a four-message conversation renders to a few hundred characters
HEADROOM = 1 << 30
PROBE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 1+2?"},
    {"role": "assistant", "content": "3"},
    {"role": "user", "content": "And 2+2?"},
]
_verdicts: dict[str, str | None] = {}


def check_chat_template(tokenizer) -> None:
    """DataError when the tokenizer's chat template does not render PROBE within the limits."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not hasattr(os, "fork"):
        return
    if template not in _verdicts:
        _verdicts[template] = _probe(tokenizer)
    if _verdicts[template]:
        where = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        raise DataError(
            f"{where}: its chat template {_verdicts[template]}; a template must render a conversation quickly "
            "(fix chat_template in tokenizer_config.json or chat_template.jinja)"
        )


def _probe(tokenizer) -> str | None:
    """Render PROBE in a forked child; what went wrong, or None (errors raised by the template are
    left to the real render, which reports them)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: render, report, leave without running any of the parent's exit code
        try:
            os.close(read)
            _quiet()
            _limit_memory()
            try:
                text = tokenizer.apply_chat_template(PROBE, add_generation_prompt=True, tokenize=False)
                verdict = f"ok {len(text)}"
            except MemoryError:
                verdict = "memory"
            except BaseException:  # noqa: BLE001
                verdict = "error"
            os.write(write, verdict.encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        deadline, pause = time.monotonic() + RENDER_S, 0.001
        while os.waitpid(pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return f"takes more than {RENDER_S:g} s to render a {len(PROBE)}-message conversation"
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        verdict = os.read(read, 64).decode()
    finally:
        os.close(read)
    if verdict == "memory":
        return f"needs more than {HEADROOM >> 30} GiB to render a {len(PROBE)}-message conversation"
    if verdict.startswith("ok ") and int(verdict[3:]) > MAX_CHARS:
        return f"renders a {len(PROBE)}-message conversation to {int(verdict[3:]):,} characters"
    return None


def _quiet() -> None:
    """In the child: nothing it renders prints through the parent's streams or log handlers, whose
    locks another thread of the parent may have held at the fork (the child would wait for ever)."""
    import logging
    import sys
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the child leaves with os._exit)


def _limit_memory() -> None:
    try:
        import resource

        with open("/proc/self/statm") as f:
            held = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (held + HEADROOM, held + HEADROOM))
    except (OSError, ValueError, ImportError):  # no /proc (macOS): time and size limits only
        pass
