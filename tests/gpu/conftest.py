"""Fixtures of the GPU suite: per-test seeds, cleanup between tests, the JSON-lines report."""

from __future__ import annotations

import gc
import zlib

import pytest
import torch

from .helpers import REPORT_NAME, Report, results_dir, summarize_report


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "xdist_group(name): run the group's tests on one pytest-xdist worker")
    # The controller (or a run without xdist) starts a fresh report; workers only append.
    if not hasattr(config, "workerinput"):
        (results_dir() / REPORT_NAME).unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = results_dir() / REPORT_NAME
    if path.exists():
        terminalreporter.write_sep("-", f"bit-exact fractions ({path})")
        terminalreporter.write_line(summarize_report(path))


@pytest.fixture(autouse=True)
def _seed_and_release(request):
    """Each test draws its own reproducible inputs, whatever worker or order runs it; after
    it, pending kernels finish (a fault shows up in the test that caused it) and the cached
    memory goes back, so the next test can take tens of gigabytes."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture(scope="session")
def report() -> Report:
    return Report(results_dir() / REPORT_NAME)
