"""Numbers in the prose of docs/start/ and docs/index.md that pass by rule, not by data.

Read by tools/prose_numbers.py; the format and the rules are in tests/docs/prose_rules/README.md.
"""

PROSE_RULES: dict[str, list[tuple[str, str]]] = {
    "index.md": [
        ("with a vocabulary of 1024 tokens", "definition"),
    ],
    "start/approach.md": [
        ("a crash never leaves half a file", "not a number"),
        ("Run twice with one seed", "definition"),
    ],
    "start/course-map.md": [
        ("Three sessions of 90 minutes", "definition"),
        ("A workshop session is 90 minutes", "definition"),
        ("a few sittings of about 90 minutes each", "definition"),
    ],
    "start/guide.md": [
        ("how to spend the 90 minutes", "definition"),
        ("three sessions of 90 minutes", "definition"),
        ("at 16 bytes per parameter", "definition"),
        ("no index appears twice", "not a number"),
    ],
    "start/testing.md": [
        ('A sentence that says "the step took 12.5 s" or "halves the memory"', "example"),
        ('the words that state a ratio ("halves", "twice", "a third", "most of")', "example"),
    ],
    "start/overview.md": [
        ("cut short to 20 steps", "definition"),
        (
            "ln(1024) ≈ 6.93, the loss of a model that guesses evenly among its 1024 tokens",
            "arithmetic",
        ),
        ("20 steps already bring", "definition"),
        ("an even guess over 1024 tokens has loss ln(1024) ≈ 6.93", "arithmetic"),
    ],
}
