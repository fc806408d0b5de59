"""dsparklab as a wheel: built offline, installed into a scratch directory, run from elsewhere.

The wheel is built from a copy of the files it is made of (symbolic links kept, so the
notebooks and published tables come through ``dsparklab/lab``'s links as they do from a
checkout) and installed with ``--no-deps --target`` into the site directory of a scratch
virtual environment, which reaches the lab's other packages through a ``.pth`` line naming
this environment's site-packages. Such a directory is only put on ``sys.path``: its own
``.pth`` files, the editable install's finder among them, are not run, so nothing of
dsparklab can resolve through the checkout. The commands run from a directory outside the
checkout and read the shipped traces by an explicit path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "data" / "traces" / "smol"
# What the wheel is built from (pyproject's package data points into the last three).
SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "dsparklab",
    "notebooks",
    "data/published",
    "data/profiles",
)
COMMANDS = ("validate", "collect", "import", "watch", "report", "lab", "demo", "zoo")


def _run(command: list[str], *, cwd: Path, env: dict[str, str], timeout: int) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the scratch environment's python, its site directory holding the wheel's files)."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    for name in SOURCES:
        origin, copy = REPO / name, source / name
        if origin.is_dir():
            shutil.copytree(
                origin, copy, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, copy)
    wheels, venv = base / "wheels", base / "venv"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = [sys.executable, "-m", "pip"]
    _run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), "."],
        cwd=source,
        env=env,
        timeout=300,
    )
    (wheel,) = wheels.glob("dsparklab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in (
        "dsparklab/lab/notebooks/02_window_scaling.ipynb",
        "dsparklab/lab/published/published_kimi_dspark.csv",
        "dsparklab/lab/published/published_position_curves.csv",
        "dsparklab/lab/published/published_verify_costs.csv",
        "dsparklab/lab/profiles/assumed-gpu-like.json",
        "dsparklab/report/templates/dsparklab_offline/index.html.j2",
        "dsparklab/widgets/figure_widget.js",
    ):
        assert shipped in names, f"{shipped} is not in {wheel.name}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "LICENSE not shipped"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=base, env=env, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=base,
            env=env,
            timeout=60,
        ).strip()
    )
    (site / "dsparklab-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        cwd=base,
        env=env,
        timeout=300,
    )
    return python, site


@pytest.fixture
def env(installed: tuple[Path, Path]) -> dict[str, str]:
    """The caller's environment less dsparklab's variables, the scratch venv first on PATH."""
    python, _ = installed
    clean = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("DSPARKLAB_") and key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    clean["PATH"] = f"{python.parent}{os.pathsep}{clean['PATH']}"
    # Jupyter's data files (nbconvert's templates) are the dependencies' too: this env's.
    clean["JUPYTER_PATH"] = str(Path(sysconfig.get_paths()["data"]) / "share" / "jupyter")
    return clean


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory outside the checkout, with no runs, traces or zoo in it."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


def dsparklab(installed: tuple[Path, Path], *args: str) -> list[str]:
    """The console script the wheel installed, run by the scratch environment's python."""
    python, site = installed
    return [str(python), str(site / "bin" / "dsparklab"), *args]


def test_imports_come_from_the_wheel(
    installed: tuple[Path, Path], env: dict[str, str], elsewhere: Path
):
    python, site = installed
    script = (
        "import dsparklab, dsparklab.lab.resources as r; "
        "print(dsparklab.__file__); print(r.notebooks_dir()); print(dsparklab.__version__)"
    )
    lines = _run([str(python), "-c", script], cwd=elsewhere, env=env, timeout=60).split()
    assert all(Path(line).is_relative_to(site) for line in lines[:2]), lines
    from importlib.metadata import version

    assert lines[2] == version("dsparklab"), "one version: dsparklab.__version__"


def test_help_lists_every_command(
    installed: tuple[Path, Path], env: dict[str, str], elsewhere: Path
):
    python, _ = installed
    for command in (
        dsparklab(installed, "--help"),
        [str(python), "-m", "dsparklab", "--help"],
        [str(python), "-m", "dsparklab.cli.app", "--help"],
    ):
        out = _run(command, cwd=elsewhere, env=env, timeout=60)
        listed = {line.split()[1] for line in out.splitlines() if line.startswith("│ ")}
        assert set(COMMANDS) <= listed, (command, out)


def test_validate_the_shipped_traces(
    installed: tuple[Path, Path], env: dict[str, str], elsewhere: Path
):
    out = _run(dsparklab(installed, "validate", str(SHIPPED)), cwd=elsewhere, env=env, timeout=300)
    assert out.strip().splitlines()[-1].endswith(" 0 invalid"), out


def test_missing_paths_are_one_line_errors(
    installed: tuple[Path, Path], env: dict[str, str], elsewhere: Path
):
    """Defaults are the working directory's: none there, so one line and exit 2."""
    for args in (
        ["report"],  # runs/demo
        ["report", "--runs", str(SHIPPED), "--shipped", "no-such-dir"],
        ["report", "--runs", str(SHIPPED), "--zoo", "no-such-dir"],
    ):
        done = subprocess.run(
            dsparklab(installed, *args), cwd=elsewhere, env=env, capture_output=True, text=True
        )
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1, (
            args,
            done.stderr,
        )


def test_report_on_the_shipped_traces(
    installed: tuple[Path, Path], env: dict[str, str], elsewhere: Path
):
    _, site = installed
    command = dsparklab(installed, "report", "--runs", str(SHIPPED), "--out", "report")
    command += ["--notebook", "02_window_scaling", "--param", "N_BOOT=20", "--no-png"]
    out = _run(command, cwd=elsewhere, env=env, timeout=900)
    report = elsewhere / "report"
    assert f"report: {report / 'index.html'}" in out, out
    made = json.loads((report / "report.json").read_text())
    assert [(nb["name"], nb["ok"]) for nb in made["notebooks"]] == [("02_window_scaling", True)]
    executed = json.loads((report / "notebooks" / "02_window_scaling.ipynb").read_text())
    assert executed["metadata"]["papermill"]["input_path"].startswith(str(site)), (
        "the notebook the wheel ships"
    )
    assert (report / "02_window_scaling.html").is_file()
    assert "AL(" in (report / "index.html").read_text(), "findings from the shipped traces"
