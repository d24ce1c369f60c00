"""Bad stage options and a full disk: one line naming the option or the file, no traceback."""

from __future__ import annotations

import os
import resource
import signal
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
    (tmp_path / "params.yaml").write_bytes((ROOT / "params.yaml").read_bytes())  # a project root, as stages run in
    (tmp_path / "conf").symlink_to(ROOT / "conf")
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


def test_a_full_disk_while_the_report_writes_the_page_is_one_line_and_the_old_page_stays(tmp_path):
    """The report stage on the committed results, in a process whose files may not grow past 300 kB (RLIMIT_FSIZE:
    the kernel's own EFBIG, as a full disk gives ENOSPC): every JSON and chart fits, the page (about 640 kB) does
    not."""
    for path in (ROOT / "reports").glob("*/*.json"):
        if path.parent.name != "plots":
            (tmp_path / "reports" / path.parent.name).mkdir(parents=True, exist_ok=True)
            (tmp_path / "reports" / path.parent.name / path.name).write_bytes(path.read_bytes())
    (tmp_path / "reports/index.html").write_text("the old page\n")
    (tmp_path / "conf").symlink_to(ROOT / "conf")  # a project root, as stages run in: the entries' declared metrics

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    proc = subprocess.run([sys.executable, "-m", "stages.report", "--params", str(ROOT / "params.yaml")], cwd=tmp_path,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          preexec_fn=small_files)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ("error: reports/index.html: cannot write it (File too large); the old file is kept: free "
                           "space on its disk (`df -h reports`) or make the folder writable, then rerun\n")
    assert (tmp_path / "reports/index.html").read_text() == "the old page\n"
    assert [p.name for p in (tmp_path / "reports").iterdir() if p.name.startswith(".")] == []  # no temporary left
    assert (tmp_path / "reports/metrics.json").is_file()  # written before the page, under the limit
