"""Protocols on the decoding loop: the per-step two-pass ablation and the dynamic-RAG loop."""
