"""Shipped data: the distilled draft for SmolLM2, its card, and the held-out prompts."""
