"""Bad stage options and a full disk: one line naming the option or the file, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from vlbench.features import FeaturesWriteError, embedding_array, features_schema, write_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("option, value, message", [
    ("--batch-size", "0", "error: --batch-size must be a whole number of at least 1, got 0"),
    ("--workers", "-2",
     "error: --workers must be a whole number of at least 0 (0: decode in the main process), got -2"),
])
def test_a_bad_batch_option_of_the_embed_stage_is_one_line(tmp_path, option, value, message):
    proc = subprocess.run([sys.executable, str(ROOT / "stages/embed_images.py"), "--dataset", "shapes",
                           "--params", str(tmp_path / "params.yaml"), option, value],
                          cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert proc.returncode == 2 and proc.stderr.strip() == message


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device that is always full)")
def test_a_full_disk_while_writing_features_names_the_file():
    rows = pa.table({"sample_id": ["a", "b"], "label": pa.array([0, 1], pa.int64())})
    emb = np.ones((2, 4), np.float32)
    table = rows.append_column("embedding", embedding_array(emb))
    with pytest.raises(FeaturesWriteError, match=r"^/dev/full: cannot write the features \(.*No space left on "
                                                 r"device.*\); free space on its disk \(`df -h /dev`\)"):
        write_table(Path("/dev/full"), [table], features_schema(rows.schema, 4, {"model": "m"}))
