#!/usr/bin/env bash
# The integration tests against the newest transformers and kernels releases tested
# (requirements/integrations-latest.txt), in a venv of their own, CPU only.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv-latest
. .venv-latest/bin/activate
pip install -q -r requirements/integrations-latest.txt -e .
TRITON_INTERPRET=1 python -m pytest tests/test_integrations_*.py -m "not slow" -n 2 -q
