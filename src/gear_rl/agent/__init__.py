"""Agent rollouts: multi-turn generation with tool calls and observation masks."""
