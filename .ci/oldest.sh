#!/usr/bin/env bash
# The transformers-dependent tests against the oldest transformers the integrations extra
# accepts (requirements/oldest.txt), in a venv of their own, CPU only.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv-oldest
. .venv-oldest/bin/activate
pip install -q -r requirements/oldest.txt -e .
TRITON_INTERPRET=1 python -m pytest tests/test_integrations_*.py tests/test_reference_conventions.py -n 2 -q
