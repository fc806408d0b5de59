"""The Spark tests: one SparkSession in ``local[2]`` shared by every test, marked ``spark``.

Spark's start (about 9 s) is paid once per test session; ``make test`` runs these tests,
``make test-pr`` leaves them out. pyspark comes from the lock, Java from Debian's OpenJDK
(``make venv`` installs it when ``java`` is missing).
"""

from __future__ import annotations

import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
# counting_cases and analysis_synth: the stores and counters the DuckDB tests compare
sys.path.insert(0, str(HERE.parent / "unit" / "analysis"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test below tests/spark with `spark` (pyproject.toml's markers)."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker("spark")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local[2] SparkSession: no UI, two shuffle partitions, a modest driver, loopback."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        pytest.skip("pyspark is absent: make venv (requirements/lock.txt pins pyspark)")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime: make venv installs openjdk-17-jre-headless")
    scratch = tmp_path_factory.mktemp("spark")
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("dsparklab-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", str(scratch / "local"))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyspark 4.3 and pandas 3
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
