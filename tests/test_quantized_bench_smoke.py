"""`python -m gatednorm.bench.quantized --smoke` runs every format and the decode loop on CPU
and writes its JSON. A subprocess with TRITON_INTERPRET=0 (the reference path: seconds, not a
minute); the kernels are covered by test_quantized_kernels.py."""

import json
import os
import subprocess
import sys

from gatednorm.bench.quantized import FORMATS, SMOKE_SHAPES


def test_smoke_run_writes_every_case_and_decode_record(tmp_path):
    out = tmp_path / "quantized.json"
    env = dict(os.environ, TRITON_INTERPRET="0", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "gatednorm.bench.quantized", "--smoke",
                           "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert {"gpu", "torch", "triton", "date", "command", "git_commit", "copy_gbps", "records",
            "decode"} <= set(results)
    assert results["command"].endswith("-m gatednorm.bench.quantized --smoke --out " + str(out))
    cases = {(r["case"], r["format"]) for r in results["records"]}
    assert cases == {(s.name, f) for s in SMOKE_SHAPES for f in FORMATS}
    for record in results["records"]:
        assert record["status"] == "ok"
        assert record["fused_ms"] > 0 and record["unfused_compile_ms"] > 0
        assert record["fused_bytes_per_element"] < record["unfused_bytes_per_element"]
    assert [r["tokens"] for r in results["decode"]] == [1, 4]
    assert "speedup" in proc.stdout
