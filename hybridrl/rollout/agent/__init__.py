"""Multi-turn agent rollouts: tool calls, tool results as tokens, interactive environments."""
