"""The `seaweed` fixture itself: a real, authenticated, loopback-only, telemetry-free S3."""

from __future__ import annotations

import ipaddress
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs
from seaweed_store import TELEMETRY_ON_LOG, SeaweedS3, remove_grpc_sockets

HERE = Path(__file__).parent
# rejected requests come back as 403s: pyarrow names them ACCESS_DENIED (HEAD has no body)
# or quotes SeaweedFS's error code
DENIED = (
    r"ACCESS_DENIED|AccessDenied|SIGNATURE_DOES_NOT_MATCH|SignatureDoesNotMatch|InvalidAccessKeyId"
)


def _table() -> pa.Table:
    return pa.table({"step": [0, 1, 2], "accepted": [3, 0, 2], "name": ["a", "b", "c"]})


def test_parquet_round_trip_with_the_env_credentials(
    seaweed: SeaweedS3, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    # keys and region from the environment; the endpoint must be passed (pyarrow ignores
    # AWS_ENDPOINT_URL, see test_pyarrow_ignores_the_endpoint_variables)
    filesystem = pafs.S3FileSystem(endpoint_override=seaweed.env()["AWS_ENDPOINT_URL"])
    path = f"{s3_bucket}/runs/run-1/steps.parquet"
    pq.write_table(_table(), path, filesystem=filesystem)

    info = filesystem.get_file_info(path)
    assert info.type == pafs.FileType.File and info.size > 0
    assert pq.read_table(path, filesystem=filesystem).equals(_table())
    listed = filesystem.get_file_info(pafs.FileSelector(f"{s3_bucket}/runs", recursive=True))
    assert [i.path for i in listed if i.type == pafs.FileType.File] == [path]
    # and a second client (the fixture's) sees the same object: it is on the server
    assert seaweed.filesystem().get_file_info(path).size == info.size


def test_wrong_secret_key_is_rejected(seaweed: SeaweedS3, s3_bucket: str) -> None:
    good = seaweed.filesystem()
    path = f"{s3_bucket}/secret.parquet"
    pq.write_table(_table(), path, filesystem=good)
    wrong = seaweed.filesystem(secret_key=seaweed.secret_key[::-1])

    with pytest.raises(OSError, match=DENIED):
        pq.read_table(path, filesystem=wrong)
    with pytest.raises(OSError, match=DENIED):
        wrong.get_file_info(pafs.FileSelector(s3_bucket))
    with pytest.raises(OSError, match=DENIED), wrong.open_output_stream(f"{path}.2") as out:
        out.write(b"x")
    # the rejected write left nothing behind
    assert good.get_file_info(f"{path}.2").type == pafs.FileType.NotFound


def test_unknown_key_and_anonymous_requests_are_rejected(
    seaweed: SeaweedS3, s3_bucket: str
) -> None:
    seaweed.filesystem().open_output_stream(f"{s3_bucket}/x").close()
    stranger = seaweed.filesystem(access_key="AKNOTAKEY0000000000", secret_key="nope" * 10)
    anonymous = pafs.S3FileSystem(
        anonymous=True, endpoint_override=seaweed.endpoint, scheme="http", region=seaweed.region
    )
    for client in (stranger, anonymous):
        with pytest.raises(OSError, match=DENIED):
            client.get_file_info(f"{s3_bucket}/x")


def test_every_listener_is_loopback(seaweed: SeaweedS3) -> None:
    processes = seaweed.processes()
    assert len(processes) >= 2, "weed server and weed s3 should both be running"
    listening: dict[int, str] = {}
    for proc in processes:
        for conn in proc.net_connections(kind="inet"):
            # TCP listeners, and any UDP socket (no status) bound to an address
            if conn.status == psutil.CONN_LISTEN or (conn.status == psutil.CONN_NONE):
                listening[conn.laddr.port] = conn.laddr.ip
    assert set(seaweed.ports.values()) <= set(listening), (
        f"expected all of {seaweed.ports} listening, got {listening}"
    )
    not_loopback = {port: ip for port, ip in listening.items() if ip != "127.0.0.1"}
    assert not not_loopback, f"weed listens beyond loopback: {not_loopback}"


def test_s3_port_refuses_the_machine_s_other_addresses(seaweed: SeaweedS3) -> None:
    others = [
        addr.address
        for addrs in psutil.net_if_addrs().values()
        for addr in addrs
        if addr.family == socket.AF_INET and not ipaddress.ip_address(addr.address).is_loopback
    ]
    if not others:
        pytest.skip("this machine has no non-loopback IPv4 address to try")
    for address in others:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((address, seaweed.ports["s3"]), timeout=2).close()


def test_telemetry_is_off(seaweed: SeaweedS3) -> None:
    mini = next(p for p in seaweed.processes() if "mini" in p.cmdline())
    assert "-master.telemetry=false" in mini.cmdline()
    log = seaweed.store_log.read_text(errors="replace")
    # the master did start (and log) ...
    assert "Start Seaweed Master" in log
    # ... without its collector, which logs this line when it runs
    assert TELEMETRY_ON_LOG not in log
    # nor is anything connected beyond this machine
    remote = {
        conn.raddr.ip
        for proc in seaweed.processes()
        for conn in proc.net_connections(kind="inet")
        if conn.raddr
    }
    assert all(ipaddress.ip_address(ip).is_loopback for ip in remote), remote


def test_pyarrow_ignores_the_endpoint_variables(
    seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why env() callers must still pass endpoint_override (pyarrow 26; apache/arrow#49643).

    Should this fail, pyarrow reads AWS_ENDPOINT_URL now: update env()'s docstring.
    """
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    options = pafs.S3FileSystem().__reduce__()[1][0]
    assert options["endpoint_override"] == ""


def test_a_put_into_a_missing_bucket_fails_as_on_aws(seaweed: SeaweedS3) -> None:
    filesystem = seaweed.filesystem(allow_bucket_creation=False)
    missing = "no-such-bucket-here"
    with pytest.raises(OSError, match="NoSuchBucket|NO_SUCH_BUCKET|does not exist"):
        with filesystem.open_output_stream(f"{missing}/x") as out:
            out.write(b"x")
    assert filesystem.get_file_info(missing).type == pafs.FileType.NotFound


def test_fresh_buckets_are_empty_and_separate(seaweed: SeaweedS3, s3_bucket: str) -> None:
    filesystem = seaweed.filesystem()
    assert filesystem.get_file_info(pafs.FileSelector(s3_bucket, recursive=True)) == []
    assert s3_bucket != seaweed.bucket
    assert filesystem.get_file_info(s3_bucket).type == pafs.FileType.Directory


def test_pause_hangs_requests_until_resume(seaweed: SeaweedS3, s3_bucket: str) -> None:
    impatient = seaweed.filesystem(
        request_timeout=1.0,
        connect_timeout=1.0,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    with seaweed.paused():
        started = time.monotonic()
        with pytest.raises(OSError, match="Timeout|timed out|too slow"):
            impatient.get_file_info(f"{s3_bucket}/x")
        assert time.monotonic() - started >= 0.9

    # a patient request made while paused completes once the gateway is resumed
    patient = seaweed.filesystem(request_timeout=30.0)
    result: list[pafs.FileInfo] = []
    seaweed.pause()
    worker = threading.Thread(target=lambda: result.append(patient.get_file_info(s3_bucket)))
    worker.start()
    worker.join(1.0)
    assert worker.is_alive() and not result, "a request finished while the gateway was paused"
    seaweed.resume()
    worker.join(10.0)
    assert result and result[0].type == pafs.FileType.Directory


def test_down_refuses_connections_and_keeps_the_data(seaweed: SeaweedS3, s3_bucket: str) -> None:
    filesystem = seaweed.filesystem(
        connect_timeout=1.0, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1)
    )
    path = f"{s3_bucket}/kept.parquet"
    pq.write_table(_table(), path, filesystem=filesystem)
    seaweed.stop()
    assert not seaweed.is_up
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", seaweed.ports["s3"]), timeout=2).close()
    with pytest.raises(OSError, match="connect|Connection refused|NETWORK_CONNECTION"):
        filesystem.get_file_info(path)
    seaweed.start()  # how long it takes: benchmarks/object_store_startup.py
    assert pq.read_table(path, filesystem=filesystem).equals(_table())


@pytest.mark.parametrize("left", ["paused", "stopped"])
def test_what_a_test_leaves_is_undone_for_the_next(seaweed: SeaweedS3, left: str) -> None:
    """The autouse fixture calls ensure_running after each test that used the store: from a
    paused or a stopped gateway it gives one that answers within 2 s."""
    fast = seaweed.filesystem(
        request_timeout=2.0,
        connect_timeout=2.0,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    seaweed.pause() if left == "paused" else seaweed.stop()
    with pytest.raises(OSError, match="Timeout|timed out|too slow|connect|NETWORK_CONNECTION"):
        fast.get_file_info(seaweed.bucket)
    seaweed.ensure_running()
    assert not seaweed.is_paused and seaweed.is_up
    assert fast.get_file_info(seaweed.bucket).type == pafs.FileType.Directory


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_weed_dies_with_a_killed_test_process(tmp_path: Path) -> None:
    """A pytest killed outright (no fixture teardown) must not leave weed running."""
    script = f"""
import json, os, signal, sys
sys.path.insert(0, {str(HERE)!r})
from pathlib import Path
from seaweed_store import new_store, weed_binary
store = new_store(weed_binary(), Path({str(tmp_path)!r}))
store.launch()
pids = [p.pid for p in store.processes()]
print(json.dumps({{"pids": pids, "ports": list(store.ports.values())}}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    started = json.loads(done.stdout)
    # the killed run's /tmp sockets: nobody else would remove them
    remove_grpc_sockets(started["ports"])
    assert len(started["pids"]) >= 2
    deadline = time.monotonic() + 10
    alive = started["pids"]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _running(pid)]
    assert not alive, f"weed processes {alive} outlived their killed parent"
