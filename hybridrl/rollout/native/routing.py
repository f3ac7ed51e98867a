"""The experts a mixture of experts routed each token to, recorded inside the native engine
(router replay R3: the trainer's passes replay them, workers/moe_passes.py).

Every token the engine runs through the model has its routing recorded at its position in its
sequence (prompt tokens first, then the response's), in a per-call host history (`RouteHistory`,
(rows, positions, L sparse layers, k) int16):
- prefill and extend passes (prompts, chunks of long prompts, prefix-cache remainders, multi-turn
  tool/user tokens): the model writes into a device buffer of the pass's tokens, copied to the
  host with the pass's sampled tokens (those passes already wait for them);
- decode steps: the model writes into `RouteBuffers.steps` (steps, rows, L, k) inside the CUDA
  graph; the launch copies it to a pinned host buffer with its tokens, and the step's routing is
  stored when its tokens are read, at the position of each row's input token.
A response's last token runs through the model only when it is an EOS read by the decode step
already launched after it (a turn's EOS always runs, before the tool's tokens), and prompt tokens
taken from the prefix cache are not recomputed: the entries of tokens that did not run stay -1
(`K.NO_EXPERT`), and the trainer routes them itself. `assemble` lays the history out as ROUTED_EXPERTS
(B, P + R, L, k), aligned with the output's prompts | responses.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridrl.data import keys as K


class RouteBuffers:
    """The runner's: what one decode launch routed, on the device and twice in pinned host memory."""

    def __init__(self, n_sparse: int, top_k: int, max_num_seqs: int, steps: int, device: torch.device):
        self.shape = (n_sparse, top_k)
        self.steps = torch.full((steps, max_num_seqs, n_sparse, top_k), K.NO_EXPERT, dtype=torch.int16, device=device)
        pin = device.type == "cuda"
        self.host = [torch.empty(self.steps.numel(), dtype=torch.int16, pin_memory=pin) for _ in range(2)]

    def pass_buffer(self, tokens: int, device: torch.device) -> torch.Tensor:
        """A prefill/extend pass's (tokens, L, k) buffer."""
        return torch.empty(tokens, *self.shape, dtype=torch.int16, device=device)

    def copy_out(self, N: int, B: int, which: int) -> torch.Tensor:
        """Queue the copy of the launch's (N steps, B rows) routing into host buffer `which`; its view."""
        host = self.host[which][: N * B * self.steps[0, 0].numel()].view(N, B, *self.shape)
        host.copy_(self.steps[:N, :B], non_blocking=True)
        return host


class RouteHistory:
    """One generate call's routing per output row and position (prompt + response tokens)."""

    def __init__(self, rows: int, width: int, shape: tuple[int, int]):
        self.ids = np.full((rows, width, *shape), K.NO_EXPERT, dtype=np.int16)  # (rows, positions, L, k)

    def store_pass(self, routes: torch.Tensor, lens: list[int], starts: list[int], rows_of: list[list[int]]) -> None:
        """A prefill/extend pass: routes (G, T, L, k) of G right-padded rows; row i's `lens[i]`
        tokens sit at positions starts[i]... of each output row in `rows_of[i]`."""
        r = routes.cpu().numpy()
        width = self.ids.shape[1]
        for i, (n, start, rows) in enumerate(zip(lens, starts, rows_of)):
            stop = min(start + n, width)
            if stop > start:
                self.ids[np.asarray(rows)[:, None], np.arange(start, stop)[None, :]] = r[i, : stop - start]

    def store_decode(self, routes: torch.Tensor, out_rows: np.ndarray, rows: np.ndarray, positions: np.ndarray) -> None:
        """A decode launch: routes (N, B, L, k); launched row rows[j] is output row out_rows[j],
        whose input token of step s sat at positions[j] + s."""
        r = routes.numpy()[:, rows]  # (N, rows, L, k)
        N = r.shape[0]
        pos = positions[:, None] + np.arange(N)[None, :]  # (rows, N)
        inside = pos < self.ids.shape[1]  # steps a multi-step launch ran past the end: dropped
        dest = np.broadcast_to(out_rows[:, None], pos.shape)
        self.ids[dest[inside], pos[inside]] = r.transpose(1, 0, 2, 3)[inside]

    def assemble(self, prompt_mask: torch.Tensor, response_real: torch.Tensor) -> torch.Tensor:
        """ROUTED_EXPERTS (B, P + R, L, k) for an output batch with left-padded prompts (mask (B, P))
        and right-padded responses (`response_real` (B, R): every response token, the tools' too)."""
        B, P = prompt_mask.shape
        plen = prompt_mask.sum(1).numpy()
        real = torch.cat([prompt_mask.bool(), response_real.bool()], 1).numpy()  # (B, P + R)
        pos = np.arange(real.shape[1])[None, :] - (P - plen)[:, None]  # position of each column in its sequence
        real &= pos < self.ids.shape[1]
        out = np.full((B, real.shape[1], *self.ids.shape[2:]), K.NO_EXPERT, dtype=np.int16)
        rows = np.broadcast_to(np.arange(B)[:, None], real.shape)
        out[real] = self.ids[rows[real], pos[real]]
        return torch.from_numpy(out)
