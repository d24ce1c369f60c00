"""Ray's record of the cluster that `ray start` last started on this machine: the address `ray.init(address="auto")`
joins. Ray has no public API that tells it without connecting, and `vlbench.embed_ray` needs it before `ray.init`, to
probe it (Ray retries an unreachable address for minutes).

Private surface used (tests/test_adapters.py): `ray._private.services.find_bootstrap_address(temp_dir)`, which reads
the address file that `ray start` writes (`ray._private.utils.write_ray_address`)."""

from __future__ import annotations

try:
    from ray._private.services import find_bootstrap_address
except ImportError:  # a Ray that moved it (tests/test_adapters.py fails on it): `auto` is left to Ray
    find_bootstrap_address = None


def last_started_cluster() -> str | None:
    """The GCS address ("host:port") of the last `ray start` on this machine (as recorded in Ray's temporary folder,
    $RAY_TMPDIR/ray or /tmp/ray), or None when there is none or Ray cannot tell."""
    if find_bootstrap_address is None:
        return None
    try:
        return find_bootstrap_address(None)
    except Exception:  # noqa: BLE001 - a private helper: when it cannot tell, Ray decides as before
        return None
