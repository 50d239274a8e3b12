"""GPU verification suite (skipped without CUDA); see docs/gpu-verification.md."""
