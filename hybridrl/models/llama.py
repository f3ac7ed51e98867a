"""A compact decoder for the Llama / Qwen2 / Qwen2.5 / Qwen3 family, for the native rollout engine.

The parameter names are those of the Hugging Face checkpoints (`model.layers.0.self_attn.q_proj.weight`,
`lm_head.weight`, ...), so the trainer's state dict loads into it by name. The model is pure math:
attention over past tokens is a callable the caller passes in (`attend`), so the paged KV cache,
CUDA graphs and any sharding live outside this file.

Differences inside the family, all read from the HF config:
- Qwen2/2.5: bias on q/k/v (not o); Llama and Qwen3: `attention_bias` on q/k/v/o, Llama `mlp_bias`;
- Qwen3: RMSNorm over each head's q and k before the rotary embedding ("QK-norm");
- `head_dim` may differ from hidden / heads (Qwen3); tied or untied input/output embeddings;
- rotary embeddings with the configured theta and the `default`, `linear`, `llama3` or `yarn`
  scaling (inverse frequencies from transformers' own rope functions); others are unsupported.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

try:  # fused kernels for CUDA; the torch code runs everywhere else
    from hybridrl.models.triton_ops import fused_add_rms_norm, silu_mul
except ImportError:  # no triton
    fused_add_rms_norm = silu_mul = None

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")

# attend(layer_index, q (B, T, H, D), k (B, T, Hkv, D), v (B, T, Hkv, D), cos, sin (B, T, 1, D)) -> (B, T, H, D).
# q and k arrive before the rotary embedding: a backend applies `rotary` itself, so that a fused
# kernel can rotate and store K/V in one pass (the engine's decode step).
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def unsupported_reason(config, architectures=ARCHITECTURES, arch: str | None = None) -> str | None:
    """Why the native model cannot run this HF config, or None when it can (`architectures`: the
    ones the caller's decoder class builds; `arch`: the config's, when the caller knows it better)."""
    arch = arch or (getattr(config, "architectures", None) or ["?"])[0]
    if arch not in architectures:
        return f"architecture {arch} is not one of {', '.join(architectures)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act} (only silu)"
    rope = _rope_parameters(config)
    if rope.get("rope_type", "default") not in ROPE_TYPES:
        return f"rope_type={rope.get('rope_type')} (supported: {', '.join(ROPE_TYPES)})"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    return None


def _rope_parameters(config) -> dict:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope = dict(rope)
    rope.setdefault("rope_type", rope.get("type", "default"))
    rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return rope


def rope_tables(config, head_dim: int, max_positions: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin for every position: (max_positions, head_dim) float32 each."""
    rope = _rope_parameters(config)
    if rope["rope_type"] == "default":
        inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        scale = 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu")
        inv_freq = inv_freq.double()
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)  # (P, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (P, D): HF's rotate-half layout
    return (angles.cos() * scale).float().to(device), (angles.sin() * scale).float().to(device)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding (HF's rotate-half layout), in float32: x (B, T, H, D); cos/sin (B, T, 1, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32 and cast back before the weight, as the HF implementations do.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def add_forward(self, residual: torch.Tensor | None, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + delta, norm(residual + delta)); one fused kernel on CUDA (~16 fewer launches
        per layer in the decode step, where launches, not bytes, bound the time)."""
        if delta.is_cuda and fused_add_rms_norm is not None:
            return fused_add_rms_norm(residual, delta, self.weight, self.eps)
        x = delta if residual is None else residual + delta
        return x, self(x)


class Attention(nn.Module):
    def __init__(self, config, family: str):
        super().__init__()
        self.n_heads, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        qkv_bias = True if family == "qwen2" else getattr(config, "attention_bias", False)
        o_bias = False if family == "qwen2" else getattr(config, "attention_bias", False)
        h, d = config.hidden_size, self.head_dim
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=qkv_bias)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=qkv_bias)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=o_bias)
        self.qk_norm = family == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps)
            self.k_norm = RMSNorm(d, config.rms_norm_eps)
        self.qkv = None  # (weight, bias) of the fused projection, see fuse_projections

    def forward(self, x, cos, sin, layer: int, attend: Attend):
        B, T, _ = x.shape
        if self.qkv is not None:
            qkv = F.linear(x, *self.qkv)  # (B, T, (H + 2 Hkv) D)
            q, k, v = qkv.split([self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim], -1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, T, self.n_heads, self.head_dim)  # (B, T, H, D)
        k = k.view(B, T, self.n_kv, self.head_dim)  # (B, T, Hkv, D)
        v = v.view(B, T, self.n_kv, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        out = attend(layer, q, k, v, cos, sin)  # (B, T, H, D)
        return self.o_proj(out.reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config, intermediate_size: int | None = None):
        super().__init__()
        h, bias = config.hidden_size, getattr(config, "mlp_bias", False)
        i = intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.gate_up = None  # (weight, bias) of the fused projection, see fuse_projections

    def fuse(self, on: bool = True) -> None:
        """gate and up as one matmul (`DecoderLM.fuse_projections`)."""
        self.gate_up = _fuse([self.gate_proj, self.up_proj]) if on else None

    def forward(self, x):
        if self.gate_up is not None:
            gate_up = F.linear(x, *self.gate_up)  # (..., 2I)
            if gate_up.is_cuda and silu_mul is not None:
                return self.down_proj(silu_mul(gate_up))
            gate, up = gate_up.chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


def _fuse(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the linears' weights (and biases) into one tensor and make each linear's
    parameters views into it: one matmul instead of several, and `load_weights` copying into a
    linear's weight by its HF name still lands in the fused tensor."""
    sizes = [lin.out_features for lin in linears]
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = torch.cat([lin.bias.detach() for lin in linears]) if linears[0].bias is not None else None
    for lin, w in zip(linears, weight.split(sizes)):
        lin.weight = nn.Parameter(w, requires_grad=False)
    if bias is not None:
        for lin, b in zip(linears, bias.split(sizes)):
            lin.bias = nn.Parameter(b, requires_grad=False)
    return weight, bias


class DecoderLayer(nn.Module):
    def __init__(self, config, family: str, mlp: nn.Module | None = None):
        """`mlp`: the layer's feed-forward module (default the dense `MLP`; a mixture of experts
        in `hybridrl.models.moe_decoder`)."""
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, family)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp if mlp is not None else MLP(config)

    def forward(self, residual, h, cos, sin, layer: int, attend: Attend, next_norm: RMSNorm):
        """(residual stream, its input-normed value) -> the same after this layer, normed by `next_norm`."""
        residual, h = self.post_attention_layernorm.add_forward(residual, self.self_attn(h, cos, sin, layer, attend))
        return next_norm.add_forward(residual, self.mlp(h))


class Backbone(nn.Module):
    def __init__(self, config, family: str, make_mlp: Callable[[int], nn.Module | None] = lambda i: None):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, family, make_mlp(i)) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DecoderLM(nn.Module):
    """Embeddings -> decoder layers -> final norm -> LM head, with HF parameter names."""

    def __init__(self, config, max_positions: int | None = None):
        super().__init__()
        reason = self.unsupported_reason(config)
        if reason:
            raise ValueError(f"the native model does not support this config: {reason}")
        self.config = config
        self.model = Backbone(config, self.family(config), self.make_mlp)
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = self.model.layers[0].self_attn.head_dim
        self.max_positions = max_positions or config.max_position_embeddings
        with torch.device("cpu"):  # real tables even when the module is built on the meta device
            cos, sin = rope_tables(config, self.head_dim, self.max_positions)
        # Buffers, not parameters: they never appear in a state dict the trainer streams in.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    # What a subclass (another family: `hybridrl.models.moe_decoder`) changes.
    unsupported_reason = staticmethod(unsupported_reason)

    @staticmethod
    def family(config) -> str:
        """The attention variant of `config`'s architecture (ARCHITECTURES)."""
        return ARCHITECTURES[config.architectures[0]]

    def make_mlp(self, layer: int) -> nn.Module | None:
        """Layer `layer`'s feed-forward module; None = the dense `MLP`."""
        return None

    def load_expert(self, name: str, tensor: torch.Tensor) -> bool:
        """Copy a weight the model holds under another layout (a mixture of experts' per-expert
        checkpoint names); False: none here."""
        return False

    def prefill_bytes_per_token(self) -> int:
        """Activation bytes a prefilled token needs beside the cache (the engine's workspace estimate)."""
        return 12 * self.config.hidden_size + 6 * self.config.intermediate_size

    def fuse_projections(self, on: bool = True) -> None:
        """q/k/v and gate/up as one matmul each (fewer kernel launches per decode step). Off when
        the parameters are replaced by other tensors (the engine aliasing the trainer's)."""
        for layer in self.model.layers:
            a = layer.self_attn
            a.qkv = _fuse([a.q_proj, a.k_proj, a.v_proj]) if on else None
            layer.mlp.fuse(on)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.tied else self.lm_head.weight

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """input_ids, positions (B, T) -> final-normed hidden states (B, T, hidden)."""
        layers = self.model.layers
        if getattr(attend, "owns_rope", False):  # the attention rotates from the tables itself
            cos = sin = None
        else:
            cos = self.rope_cos[positions].unsqueeze(2)  # (B, T, 1, D)
            sin = self.rope_sin[positions].unsqueeze(2)
        residual, h = layers[0].input_layernorm.add_forward(None, self.model.embed_tokens(input_ids))
        for i, layer in enumerate(layers):
            next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm
            residual, h = layer(residual, h, cos, sin, i, attend, next_norm)
        return h

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., hidden) -> (..., V) in the model's dtype."""
        return F.linear(hidden, self.lm_head_weight)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Plain causal forward over full sequences without padding: (B, T) -> logits (B, T, V)."""
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.logits(self.hidden_states(input_ids, positions, causal_attend))


def causal_attend(layer: int, q, k, v, cos, sin) -> torch.Tensor:
    """Causal attention of T new tokens over themselves only (no cache); GQA by head groups."""
    q, k = rotary(q, cos, sin), rotary(k, cos, sin)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=q.shape[2] != k.shape[2]
    )  # (B, H, T, D)
    return out.transpose(1, 2)


def build_from_hf_config(
    config,
    dtype: torch.dtype,
    device,
    max_positions: int | None = None,
    shard: Callable[[DecoderLM], None] | None = None,
    cls: type[DecoderLM] = DecoderLM,
) -> DecoderLM:
    """An uninitialized-weights `cls` (a DecoderLM) in `dtype` on `device` (weights come from
    load_weights). `shard(model)` may replace modules on the meta device before any memory is
    allocated (the rollout engine's tensor parallelism, `hybridrl.rollout.native.tp.apply_tp`)."""
    with torch.device("meta"):
        model = cls(config, max_positions)
        if shard is not None:
            shard(model)
    model = model.to_empty(device=device).to(dtype)
    cos, sin = rope_tables(config, model.head_dim, model.max_positions, device)
    model.rope_cos, model.rope_sin = cos, sin  # to_empty left the buffers uninitialized
    return model.eval().requires_grad_(False)
