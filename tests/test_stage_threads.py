"""Stage processes set their threads' wait themselves (vlbench.portable.THREAD_WAIT, issue 44): a stage started by
`dvc exp run` in a shell gets the same GOMP_SPINCOUNT as one started by make, before torch (and libgomp) load."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ("import sys, os, json; import stages; before = 'torch' in sys.modules; "
         "seen = os.environ.get('GOMP_SPINCOUNT'); import torch; "
         "print(json.dumps({'torch_before': before, 'spin': seen, 'torch_after': 'torch' in sys.modules}))")


def stage_process(**env) -> dict:
    """What a stage process sees once `stages` is imported (every `python -m stages.<stage>` imports it first)."""
    full = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"} | {"PYTHONPATH": str(ROOT), **env}
    out = subprocess.run([sys.executable, "-c", PROBE], env=full, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_stage_started_without_the_variable_sets_it_before_torch_loads():
    assert stage_process() == {"torch_before": False, "spin": "10000", "torch_after": True}


def test_the_users_value_wins_and_unpinned_arithmetic_still_gets_the_wait():
    assert stage_process(GOMP_SPINCOUNT="500")["spin"] == "500"
    assert stage_process(VLBENCH_PORTABLE="0")["spin"] == "10000"
