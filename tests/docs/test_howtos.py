"""Every command block of every ``docs/howto-*.md`` runs as written.

A page's fenced ```` ```bash ```` and ```` ```python ```` blocks run in order, one test each
(``howto-report.md#2``), in one directory per page, so a block reads what the blocks
before it wrote: by default a fresh temporary copy of the checkout (the files git tracks or
would track), or the checkout root itself where the page says ``<!-- howto: cwd checkout
-->``. The virtualenv's ``bin`` is first on PATH; bash blocks run with ``bash -e -o
pipefail``, python blocks with ``python``. HTML comments on the line before a block (not
shown when the page is rendered) say what it needs:

- ``<!-- howto: gpu -->``: it needs a GPU; the test is listed as skipped with that reason;
- ``<!-- howto: server URL -->``: it starts a server; it runs in the background until URL
  answers (an HTTP 200), and the page's servers are stopped (SIGINT to the block's process
  group, then SIGKILL) once its last block ran.

A block after a failed one of the same page is skipped, naming the failed block.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("howto-*.md"))
BIN = Path(sys.executable).parent
BLOCK_TIMEOUT_S = 900
SERVER_START_S = 600.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>\w*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*howto:\s*(?P<what>.*?)\s*-->\s*$")
_CWD_CHECKOUT = re.compile(r"<!--\s*howto:\s*cwd\s+checkout\s*-->")
COMMAND_LANGS = ("bash", "python")


@dataclass(frozen=True)
class Block:
    page: Path
    index: int  # 1-based among the page's command blocks
    lang: str
    code: str
    line: int  # the opening fence's line
    gpu: bool = False
    server: str | None = None  # the URL that answers once the server is up

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """The ```bash / ```python blocks of ``page``, with their markers."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent, lang, start = fence.group("indent"), fence.group("lang"), i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        if lang not in COMMAND_LANGS:
            continue
        before = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        marker = _MARKER.match(before)
        what = marker.group("what").split() if marker else []
        blocks.append(
            Block(
                page=page,
                index=len(blocks) + 1,
                lang=lang,
                code="\n".join(body) + "\n",
                line=start + 1,
                gpu=what[:1] == ["gpu"],
                server=what[1] if what[:1] == ["server"] and len(what) > 1 else None,
            )
        )
    return blocks


BLOCKS = [b for page in PAGES for b in page_blocks(page)]


@dataclass
class Workspace:
    """Where one page's blocks run, and the servers they started."""

    cwd: Path
    logs: Path
    servers: list[tuple[Block, subprocess.Popen[bytes]]] = field(default_factory=list)
    failed: str | None = None

    def stop_servers(self) -> None:
        for _, proc in reversed(self.servers):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.servers.clear()


def copy_checkout(dest: Path) -> Path:
    """A copy of the checkout's files (tracked, or untracked and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.exists() and not source.is_symlink():  # deleted, not yet committed
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(source.readlink())
        else:
            shutil.copy2(source, target)
    return dest


def environment() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:  # noqa: S310
            return int(response.status) == 200
    except (OSError, urllib.error.URLError):
        return False


def _port_taken(url: str) -> bool:
    parsed = urlparse(url)
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((parsed.hostname or "127.0.0.1", parsed.port or 80)) == 0


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.is_file() else ""


def start_server(block: Block, ws: Workspace) -> None:
    assert block.server is not None
    if _port_taken(block.server):
        pytest.fail(f"{block.where}: something already listens where the server would")
    log = ws.logs / f"{block.page.stem}-{block.index}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", block.code],
            cwd=ws.cwd,
            env=environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ws.servers.append((block, proc))
    deadline = time.monotonic() + SERVER_START_S
    while not _answers(block.server):
        if proc.poll() is not None:
            pytest.fail(f"{block.where}: the server exited ({proc.returncode}):\n{_tail(log)}")
        if time.monotonic() > deadline:
            pytest.fail(f"{block.where}: {block.server} not answering after {SERVER_START_S} s")
        time.sleep(1.0)


def run_block(block: Block, ws: Workspace) -> None:
    if block.lang == "python":
        script = ws.logs / f"{block.page.stem}-{block.index}.py"
        script.write_text(block.code, encoding="utf-8")
        cmd = ["python", str(script)]
    else:
        cmd = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    done = subprocess.run(
        cmd,
        cwd=ws.cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"{block.where}: exit {done.returncode}\n{block.code}\n--- stdout\n"
        f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-4000:]}"
    )


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Path, Workspace]]:
    made: dict[Path, Workspace] = {}
    try:
        yield made
    finally:
        for ws in made.values():
            ws.stop_servers()


def _workspace(
    page: Path, made: dict[Path, Workspace], factory: pytest.TempPathFactory
) -> Workspace:
    if page not in made:
        logs = factory.mktemp(f"{page.stem}-logs")
        if _CWD_CHECKOUT.search(page.read_text(encoding="utf-8")):
            cwd = ROOT
        else:
            cwd = copy_checkout(factory.mktemp(f"{page.stem}-checkout"))
        made[page] = Workspace(cwd=cwd, logs=logs)
    return made[page]


def test_every_howto_has_command_blocks() -> None:
    assert PAGES, "no docs/howto-*.md"
    for page in PAGES:
        assert page_blocks(page), f"{page.name}: no ```bash or ```python block"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b.page.name}#{b.index}")
def test_howto_block_runs_as_written(
    block: Block,
    workspaces: dict[Path, Workspace],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    if block.gpu:
        pytest.skip(f"{block.where}: needs a GPU (<!-- howto: gpu -->)")
    ws = _workspace(block.page, workspaces, tmp_path_factory)
    if ws.failed:
        pytest.skip(f"{block.where}: an earlier block of the page failed ({ws.failed})")
    runnable = [b for b in BLOCKS if b.page == block.page and not b.gpu]
    try:
        if block.server:
            start_server(block, ws)
        else:
            run_block(block, ws)
    except BaseException:
        ws.failed = block.where
        ws.stop_servers()
        raise
    if block == runnable[-1]:
        for server_block, proc in ws.servers:
            assert proc.poll() is None, f"{server_block.where}: the server died meanwhile"
        ws.stop_servers()
