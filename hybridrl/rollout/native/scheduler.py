"""Continuous batching: which prompts start now, which sequences run, which blocks they hold.

Host-side bookkeeping only (Python lists and ints); the engine mirrors the running rows into
device tensors incrementally. A prompt and its `n` samples form a group that is admitted as a
whole, because the samples share the prompt's prefill and its full KV blocks.

The scheduler owns its queues; the engine drives them through methods only:
`add` (a group waits), `schedule` (the groups to prefill now), `start_group` (their blocks and
sequences), `run` (the sequences that go on decoding take the next rows), `grow` (a row's next
block), `postprocess` (finished sequences give their blocks back) and `keep_rows` (the rows
that go on running once finished ones leave, in order: row i of `running` is row i of the
device buffers).

Prefix caching (`prefix_caching=True`): every full prompt block is registered under a hash of
all the tokens up to its end, and a group admitted later whose prompt starts with the same full
blocks shares them (a shared system prompt, say) instead of recomputing them; its prefill then
computes only the rest, over the cached blocks. A registered block is forgotten when its last
sequence releases it, so sharing lasts while some sequence holds the block (within one generate
call: the weights may change between calls).

Admission reserves each group's worst case (prompt + max_new_tokens blocks per sample) against
the free blocks, and blocks are then allocated lazily as sequences grow. A running sequence can
therefore always get its next block: no preemption or recomputation is ever needed, at the
price of admitting fewer sequences than an optimistic scheduler when responses end early.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hybridrl.rollout.native.cache import BlockAllocator, CacheFullError, blocks_for


@dataclass
class Group:
    """One prompt and the output rows and seeds of its n samples."""

    prompt: list[int]
    out_rows: list[int]
    seeds: list[int]
    cached: int = 0  # prompt tokens found in the prefix cache at admission (a multiple of the block size)
    hashes: list[int] = field(default_factory=list)  # per full prompt block: hash of the tokens up to its end


@dataclass
class Sequence:
    out_row: int  # row of the output batch
    prompt_len: int
    seed: int
    blocks: list[int]
    reserved: int  # blocks it may still allocate (worst case)
    generated: int = 0  # tokens sampled, set when it finishes (`postprocess`)


class Scheduler:
    def __init__(
        self,
        allocator: BlockAllocator,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        prefix_caching: bool = False,
    ):
        self.allocator, self.block_size = allocator, block_size
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Group] = deque()
        self.running: list[Sequence] = []  # index = row of the device buffers
        self.committed = 0  # blocks promised to running sequences, not yet allocated
        self.prefix_caching = prefix_caching
        self.prefix: dict[int, int] = {}  # hash of a full prompt block's tokens (and all before) -> block
        self.block_hash: dict[int, int] = {}  # the reverse, for blocks in `prefix`
        self.prompt_tokens = self.cached_tokens = 0  # per prompt (not per sample): the hit rate's terms
        self.prefilling_rows = 0  # rows of admitted groups whose prompts are still being prefilled in chunks

    def add(self, group: Group) -> None:
        if self.prefix_caching:
            bs, h, group.hashes = self.block_size, 0, []
            for i in range(len(group.prompt) // bs):
                h = hash((h, tuple(group.prompt[i * bs : (i + 1) * bs])))
                group.hashes.append(h)
        self.waiting.append(group)

    def _hits(self, group: Group) -> list[int]:
        """The cached blocks the group's prompt starts with; at least its last token is left to compute."""
        hits = []
        for h in group.hashes:
            b = self.prefix.get(h)
            if b is None:
                break
            hits.append(b)
        if len(hits) * self.block_size >= len(group.prompt):
            hits.pop()
        return hits

    @property
    def hit_rate(self) -> float:
        """Share of the prompt tokens admitted so far that came from the prefix cache."""
        return self.cached_tokens / max(self.prompt_tokens, 1)

    @property
    def idle(self) -> bool:
        """Nothing waits and nothing runs."""
        return not self.waiting and not self.running and not self.prefilling_rows

    def group_need(self, group: Group, max_new_tokens: int) -> int:
        """Worst-case blocks of a group: shared full prompt blocks + each sample's own blocks."""
        L, bs = len(group.prompt), self.block_size
        per_seq = blocks_for(L + max_new_tokens - 1, bs)  # the last sampled token is never cached
        shared = L // bs - (len(self._hits(group)) if self.prefix_caching else 0)
        return shared + len(group.out_rows) * (per_seq - L // bs)

    def schedule(self, max_new_tokens: int) -> list[Group]:
        """Groups to prefill now: they fit in free rows, free blocks and the prefill token budget."""
        out: list[Group] = []
        rows = len(self.running) + self.prefilling_rows
        budget = self.allocator.num_free - self.committed
        longest = 0
        while self.waiting:
            g = self.waiting[0]
            need = self.group_need(g, max_new_tokens)
            if need > self.allocator.usable:
                raise CacheFullError(
                    f"one prompt of {len(g.prompt)} tokens with n={len(g.out_rows)} samples of up to "
                    f"{max_new_tokens} tokens needs {need} KV blocks, but the cache has {self.allocator.usable}; "
                    f"raise actor_rollout_ref.rollout.gpu_memory_utilization or lower rollout.n / max_response_length"
                )
            padded = (len(out) + 1) * max(longest, len(g.prompt))  # prefill runs right-padded
            if rows + len(g.out_rows) > self.max_num_seqs or need > budget:
                break
            if out and padded > self.max_num_batched_tokens:
                break
            self.waiting.popleft()
            out.append(g)
            rows += len(g.out_rows)
            budget -= need
            longest = max(longest, len(g.prompt))
        return out

    def start_group(self, group: Group, max_new_tokens: int) -> tuple[list[Sequence], list[tuple[int, int]]]:
        """Allocate the prompt's blocks, fork the samples (shared full blocks, own last block).

        Returns the n sequences and the (source, destination) block copies the caller must make
        after the prefill has written the prompt's partial last block.
        """
        L, bs, a = len(group.prompt), self.block_size, self.allocator
        per_seq = blocks_for(L + max_new_tokens - 1, bs)
        hits = self._hits(group) if self.prefix_caching else []
        for b in hits:
            a.share(b)
        first = hits + [a.allocate() for _ in range(blocks_for(L, bs) - len(hits))]
        full = first[: L // bs]
        group.cached = len(hits) * bs
        self.prompt_tokens += L
        self.cached_tokens += group.cached
        seqs = [Sequence(group.out_rows[0], L, group.seeds[0], first, per_seq - len(first))]
        copies: list[tuple[int, int]] = []
        for row, seed in zip(group.out_rows[1:], group.seeds[1:]):
            for b in full:
                a.share(b)
            blocks = list(full)
            if L % bs:
                blocks.append(a.allocate())
                copies.append((first[-1], blocks[-1]))
            seqs.append(Sequence(row, L, seed, blocks, per_seq - len(blocks)))
        self.committed += sum(s.reserved for s in seqs)
        return seqs, copies

    def register(self, group: Group, blocks: list[int]) -> None:
        """Offer the group's full prompt blocks (`blocks`: its first sequence's) to later prompts.
        The caller registers them once no later reader can run before their K/V are written."""
        for h, b in zip(group.hashes, blocks[: len(group.prompt) // self.block_size]):
            if h not in self.prefix:
                self.prefix[h] = b
                self.block_hash[b] = h

    def run(self, seqs: list[Sequence]) -> int:
        """`seqs` start decoding in the next free rows; returns the first of them."""
        start = len(self.running)
        self.running += seqs
        return start

    def keep_rows(self, keep) -> None:
        """Only the running rows `keep` (indices, in order) go on; they move to the front."""
        self.running = [self.running[r] for r in keep]

    def grow(self, seq: Sequence) -> int:
        """Allocate one more block for `seq` (its next cached token starts a new block); its id.

        A sequence holds ceil(cached / block_size) blocks, so it needs a new one exactly when the
        position it is about to cache is a multiple of block_size."""
        b = self.allocator.allocate()
        seq.blocks.append(b)
        seq.reserved -= 1
        self.committed -= 1
        return b

    def postprocess(self, finished: list[Sequence], generated: list[int]) -> None:
        """Sequences that ended (EOS or max_new_tokens) after `generated` tokens: their blocks and
        reservations are released (their rows leave at the next `keep_rows`)."""
        for seq, n in zip(finished, generated):
            seq.generated = n
            self.finish(seq)

    def finish(self, seq: Sequence) -> None:
        for b in seq.blocks:
            self.allocator.release(b)
            if self.allocator.refcount[b] == 0 and b in self.block_hash:  # free again: forget its tokens
                del self.prefix[self.block_hash.pop(b)]
        self.committed -= seq.reserved
        seq.reserved = 0
        seq.blocks = []
