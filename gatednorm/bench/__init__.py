"""Benchmark of gatednorm against its peers: ``python -m gatednorm.bench --help``.

cases.py (what is timed), providers.py (who is timed, and the fp64 oracle), timing.py (how),
measure.py (one case's records), results.py (the per-GPU results file and its updates),
report.py (JSON, table, plot), __main__.py (the command line and the run loop).
"""
