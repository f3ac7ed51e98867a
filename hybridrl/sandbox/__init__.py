"""Running untrusted Python (a model's code) for the `python` tool and for code rewards.

`LocalSandbox` runs each snippet in a fresh, kernel-isolated process (local.py; the child programs
are setup_child.py and launcher.py); `SandboxFusionClient` sends it to a SandboxFusion service
instead (fusion.py). Both take a `SandboxConfig` and return a `SandboxResult`. The bottom layer:
imports nothing of hybridrl, and both `rewards/` and `rollout/agent/` import it. docs/sandbox.md
describes what is isolated and how.
"""

from .config import SandboxConfig, SandboxResult, SandboxUnavailable
from .fusion import SandboxFusionClient
from .local import SANDBOX_UID, LocalSandbox, namespaces_available
from .setup_child import EXIT_SETUP_FAILED

__all__ = [
    "EXIT_SETUP_FAILED",
    "SANDBOX_UID",
    "LocalSandbox",
    "SandboxConfig",
    "SandboxFusionClient",
    "SandboxResult",
    "SandboxUnavailable",
    "namespaces_available",
]
