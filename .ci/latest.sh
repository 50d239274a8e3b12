#!/usr/bin/env bash
# The CPU suite (every test not marked slow) against the newest releases of Triton, numpy,
# transformers and kernels (requirements/latest.txt), in a venv of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv-latest
. .venv-latest/bin/activate
pip install -q -r requirements/latest.txt -e .
TRITON_INTERPRET=1 python -m pytest tests -n 2 -q
