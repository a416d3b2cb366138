"""specmon: is speculative decoding paying off? Acceptance, break-even and drift for LLM serving teams."""

__version__ = "0.1.0"
