"""Instruction-style prompts the project assembles itself: math word problems, prose
requests and code requests, for chat targets (the smol tier).

Everything is generated deterministically from seeds and fixed word lists, so the sets
are the same on every machine and need no download. Held-out prompts never share a
template (math) or a topic (prose) with training prompts:

- math: :data:`MATH_TEMPLATES`; the last :data:`MATH_HELDOUT_TEMPLATES` are held out.
- prose: :data:`PROSE_TOPICS` x :data:`PROSE_FORMS`; every fifth topic is held out.
- code (training only; HumanEval is the code evaluation): one request per public,
  documented top-level function of the interpreter's standard library, written from its
  signature and the first sentence of its docstring.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path
from typing import Literal

Split = Literal["train", "heldout"]

NAMES = (
    "Ava",
    "Ben",
    "Chloe",
    "Diego",
    "Emma",
    "Farid",
    "Grace",
    "Hiro",
    "Isla",
    "Jonas",
    "Kemi",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
)
ITEMS = (
    "apples",
    "pencils",
    "stickers",
    "marbles",
    "cookies",
    "books",
    "cards",
    "stamps",
    "shells",
    "tickets",
)

# Each template: (text with {name}, {item}, {a}, {b}, {c} fields, ranges for a, b, c).
MATH_TEMPLATES: tuple[tuple[str, tuple[int, int], tuple[int, int], tuple[int, int]], ...] = (
    (
        "{name} has {a} {item}. A friend gives {name} {b} more, and then {name} gives away {c}. "
        "How many {item} does {name} have now?",
        (10, 60),
        (5, 40),
        (1, 9),
    ),
    (
        "A box holds {a} {item}. {name} fills {b} boxes and has {c} {item} left over. How many "
        "{item} did {name} start with?",
        (6, 24),
        (3, 12),
        (1, 5),
    ),
    (
        "{name} reads {a} pages every day for {b} days, then {c} pages on the last day. How many "
        "pages did {name} read in total?",
        (8, 40),
        (3, 14),
        (5, 30),
    ),
    (
        "A shop sells {item} at {a} dollars each. {name} buys {b} of them and pays with a "
        "{c}-dollar bill. How much change does {name} get?",
        (2, 9),
        (2, 6),
        (60, 100),
    ),
    (
        "{name} shares {a} {item} equally among {b} friends and keeps the remainder. How many "
        "{item} does each friend get, and how many does {name} keep?",
        (20, 90),
        (3, 8),
        (0, 0),
    ),
    (
        "A train travels {a} kilometres per hour for {b} hours and then {c} kilometres more. How "
        "far does it travel?",
        (40, 120),
        (2, 6),
        (10, 80),
    ),
    (
        "{name} saves {a} dollars a week. After {b} weeks {name} spends {c} dollars. How much "
        "money is left?",
        (5, 30),
        (4, 12),
        (10, 50),
    ),
    (
        "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        (3, 30),
        (2, 20),
        (0, 0),
    ),
    (
        "{name} plants {a} rows of trees with {b} trees in each row. {c} trees do not survive. "
        "How many trees are left?",
        (3, 15),
        (4, 20),
        (1, 12),
    ),
    (
        "A recipe needs {a} grams of flour for {b} people. How much flour is needed for {c} "
        "people?",
        (100, 500),
        (2, 6),
        (3, 12),
    ),
    (
        "{name} is {a} years old. {name}'s sister is {b} years younger and their father is {c} "
        "times as old as {name}. How old are the sister and the father?",
        (8, 16),
        (1, 6),
        (2, 4),
    ),
    (
        "A tank holds {a} litres. It leaks {b} litres an hour and is refilled with {c} litres "
        "after three hours. How much water is in the tank then?",
        (50, 200),
        (2, 10),
        (5, 30),
    ),
)
MATH_HELDOUT_TEMPLATES = 4
MATH_INSTRUCTION = "Solve this problem step by step and give the final answer.\n\n"

PROSE_TOPICS = (
    "photosynthesis",
    "the water cycle",
    "volcanoes",
    "the moon's phases",
    "how vaccines work",
    "the history of the printing press",
    "compound interest",
    "climate and weather",
    "honeybees",
    "the Roman Empire",
    "black holes",
    "recycling",
    "sleep",
    "electric cars",
    "the internet",
    "coral reefs",
    "earthquakes",
    "the human heart",
    "solar panels",
    "the Silk Road",
    "bread baking",
    "chess",
    "jazz",
    "the Olympic Games",
    "rainbows",
    "migrating birds",
    "glaciers",
    "the immune system",
    "public libraries",
    "coffee",
    "tides",
    "rain forests",
    "wind turbines",
    "the Renaissance",
    "dinosaurs",
    "bicycles",
    "time zones",
    "the stock market",
    "meditation",
    "origami",
    "the Great Wall of China",
    "lightning",
    "penguins",
    "nutrition labels",
    "satellites",
    "deserts",
    "tea",
    "gardening",
    "the periodic table",
    "museums",
    "hurricanes",
    "sign languages",
    "the metric system",
    "telescopes",
    "composting",
    "marathons",
    "lighthouses",
    "the human brain",
    "bridges",
    "maps",
    "friendship",
    "volunteering",
    "public speaking",
    "budgeting",
    "first aid",
    "camping",
    "photography",
    "cloud computing",
    "password security",
    "learning a language",
)
PROSE_FORMS = (
    "Explain {topic} to a curious twelve-year-old.",
    "Write a short paragraph about {topic}.",
    "Give three interesting facts about {topic}.",
    "What are the main advantages and disadvantages of {topic}?",
    "Describe {topic} in simple terms.",
    "Write a short story that involves {topic}.",
)
PROSE_HELDOUT_EVERY = 5


def math_problems(split: Split, count: int, *, seed: int = 0) -> list[str]:
    """``count`` word problems from the split's templates (numbers and names seeded)."""
    cut = len(MATH_TEMPLATES) - MATH_HELDOUT_TEMPLATES
    templates = MATH_TEMPLATES[cut:] if split == "heldout" else MATH_TEMPLATES[:cut]
    rng = random.Random(f"math/{split}/{seed}")
    problems = []
    for k in range(count):
        text, ra, rb, rc = templates[k % len(templates)]
        problem = text.format(
            name=rng.choice(NAMES),
            item=rng.choice(ITEMS),
            a=rng.randint(*ra),
            b=rng.randint(*rb),
            c=rng.randint(*rc),
        )
        problems.append(MATH_INSTRUCTION + problem)
    return problems


def prose_requests(split: Split) -> list[str]:
    """Every (topic, form) request of the split, topics in list order."""
    topics = [
        t
        for i, t in enumerate(PROSE_TOPICS)
        if (i % PROSE_HELDOUT_EVERY == 0) == (split == "heldout")
    ]
    return [form.format(topic=t) for t in topics for form in PROSE_FORMS]


def code_requests(count: int, *, seed: int = 0) -> list[str]:
    """Requests to write stdlib-like functions, from documented top-level stdlib functions."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[str] = []
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            sentence = doc.strip().split("\n\n")[0].replace("\n", " ").split(". ")[0].rstrip(".")
            if len(sentence) < 15:
                continue
            args = ", ".join(a.arg for a in node.args.args)
            found.append(f"Write a Python function `{node.name}({args})`. {sentence}.")
    random.Random(f"code/{seed}").shuffle(found)
    return found[:count]
