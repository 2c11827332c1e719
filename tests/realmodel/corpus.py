"""A seeded synthetic language with real structure: words spelled in tokens, a word-level Markov chain, sentences.

Within a word the next token is nearly determined (low entropy); at a word boundary the next word is drawn from a
Zipf-shaped successor distribution over dozens of words (high entropy), and some words have one dominant successor
(near-deterministic phrases). A model trained on it has the mix of near-certain and uncertain positions that real
text has, which is what makes precision, temperature and truncation mismatches look like they do on real models.
"""

from __future__ import annotations

import numpy as np

VOCAB = 256
SPACE, STOP = 1, 2  # word separator and sentence end; 0 is unused, 3.. spell words
FIRST_LETTER = 3
WORDS = 600
SEED = 20261201


class Language:
    """The lexicon and the word-level chain, fixed by ``SEED`` (one language for training and for prompts)."""

    def __init__(self, seed: int = SEED) -> None:
        rng = np.random.default_rng(seed)
        letters = np.arange(FIRST_LETTER, VOCAB)
        letter_p = 1.0 / np.arange(1, letters.size + 1) ** 0.7  # Zipf-like letter frequencies
        letter_p /= letter_p.sum()
        seen: set[tuple[int, ...]] = set()
        words: list[tuple[int, ...]] = []
        while len(words) < WORDS:
            word = tuple(int(t) for t in rng.choice(letters, size=int(rng.integers(1, 6)), p=letter_p))
            if word not in seen:
                seen.add(word)
                words.append(word)
        self.words = words
        self.successors: list[tuple[np.ndarray, np.ndarray]] = []
        for _ in range(WORDS):
            if rng.random() < 0.3:  # a fixed phrase: one successor takes most of the mass
                ids = rng.choice(WORDS, size=4, replace=False)
                p = np.array([0.94, 0.03, 0.02, 0.01])
            else:
                ids = rng.choice(WORDS, size=int(rng.integers(20, 120)), replace=False)
                p = 1.0 / np.arange(1, ids.size + 1) ** float(rng.uniform(0.8, 1.4))
                p /= p.sum()
            self.successors.append((ids, p))
        start = 1.0 / np.arange(1, WORDS + 1) ** 1.1
        self.start = start / start.sum()

    def tokens(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """A stream of at least ``n`` tokens of sentences (int64)."""
        out: list[int] = []
        while len(out) < n:
            word = int(rng.choice(WORDS, p=self.start))
            for _ in range(int(rng.integers(4, 16))):
                out.extend(self.words[word])
                out.append(SPACE)
                ids, p = self.successors[word]
                word = int(ids[np.searchsorted(np.cumsum(p), rng.random() * p.sum())])
            out[-1] = STOP
        return np.asarray(out[:n], dtype=np.int64)
