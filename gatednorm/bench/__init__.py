"""Benchmark of gatednorm against its peers: ``python -m gatednorm.bench --help``.

cases.py (what is timed), providers.py (who is timed, and the fp64 oracle), timing.py (how),
report.py (JSON, table, plot), __main__.py (the command line and the run loop).
"""
