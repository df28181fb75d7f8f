"""gear-rl: fine-grained credit assignment for RL on LLM agents."""
__version__ = "0.1.0"
