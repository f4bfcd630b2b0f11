"""Text made up for tests: simple sentences from a small grammar, learnable in a few steps.

Tests that train on text use this instead of shipping a corpus. The grammar is small and its
words repeat, so a tiny model's loss falls well below the uniform one within a few dozen steps,
and one word is not ASCII, so UTF-8 handling is exercised.
"""

from __future__ import annotations

import random

__all__ = ["generated_text"]

_SUBJECTS = ("the cat", "a dog", "my friend", "the old king", "a small bird", "the baker")
_VERBS = ("sees", "likes", "chases", "finds", "helps", "paints")
_OBJECTS = ("the red ball", "a green tree", "the river", "a warm café", "the moon", "her hat")
_ENDINGS = (".", " today.", " again.", " in the morning.")


def generated_text(num_sentences: int, *, seed: int = 0) -> str:
    """`num_sentences` random sentences, one per line, the same for the same `seed`."""
    rng = random.Random(seed)
    lines = [
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}"
        for _ in range(num_sentences)
    ]
    return "\n".join(lines) + "\n"
