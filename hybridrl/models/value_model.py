"""A critic: the causal LM's backbone with a scalar value head."""

from __future__ import annotations

import torch
from torch import nn

from hybridrl.models.logprobs import sequence_inputs
from hybridrl.models.packing import Packed, packed_hidden


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


class ValueModel(nn.Module):
    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(backbone.config.hidden_size, 1)
        # Small initial values keep the first critic losses (and advantages) sane.
        nn.init.normal_(self.value_head.weight, std=1e-3)
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        return self.backbone.config

    def response_values(self, prompts, prompt_mask, responses, response_mask) -> torch.Tensor:
        """V(s_t) for each response token t, the state being everything before it: (B, R)."""
        input_ids, attention_mask, position_ids = sequence_inputs(prompts, prompt_mask, responses, response_mask)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (B, T, H)
        P, R = prompts.shape[1], responses.shape[1]
        return _at_least_fp32(self.value_head(hidden[:, P - 1 : P + R - 1]).squeeze(-1))  # (B, R)

    def packed_response_values(self, packed: Packed, sp_group=None) -> torch.Tensor:
        """`response_values` of a packed micro-batch (models/packing.py): (b, R)."""
        hidden = packed_hidden(self.backbone, packed, sp_group)  # (M, H), the states before each response token
        return packed.unpack(_at_least_fp32(self.value_head(hidden).squeeze(-1)))
