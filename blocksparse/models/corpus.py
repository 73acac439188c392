"""A deterministic English sentence corpus for distillation and quality checks (no downloads).

Sentences are built from templates and vocabularies of eight topics (cooking, weather, sport,
computing, travel, music, health, animals), so pairs of sentences range from near-paraphrases
(same topic, same subject) to unrelated (different topics): the similarity scores of an encoder
over the corpus spread widely, which is what a rank correlation between two encoders needs.
The same seed always gives the same sentences in the same order. The ``"train"`` and
``"heldout"`` splits are disjoint sets of distinct sentences.

Example::

    >>> from blocksparse.models import corpus
    >>> train, held = corpus.sentences("train"), corpus.sentences("heldout")
    >>> len(train), len(held), len(set(train) | set(held)) == len(train) + len(held)
    (2000, 500, True)
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["TOPICS", "all_sentences", "sentences"]

#: topic -> (subjects, verb phrases, objects, endings). Every combination is a sentence.
TOPICS: dict[str, tuple[tuple[str, ...], ...]] = {
    "cooking": (
        ("The chef", "My grandmother", "A young cook", "The baker", "Our neighbour", "The students"),
        ("slowly stirred", "carefully tasted", "quickly chopped", "proudly served", "gently baked", "burned"),
        (
            "the tomato soup",
            "a loaf of bread",
            "the fresh pasta",
            "the chocolate cake",
            "a pot of rice",
            "the garlic and onions",
        ),
        (
            "for dinner.",
            "before the guests arrived.",
            "in the small kitchen.",
            "on Sunday morning.",
            "for the whole family.",
        ),
    ),
    "weather": (
        ("The storm", "A cold wind", "Heavy rain", "The morning fog", "A sudden snowfall", "The summer heat"),
        ("covered", "swept across", "flooded", "hid", "froze", "slowly moved over"),
        (
            "the mountain valley",
            "the city streets",
            "the quiet harbour",
            "the farmland",
            "the coastal road",
            "the old bridge",
        ),
        ("during the night.", "all afternoon.", "without any warning.", "for three days.", "early in the spring."),
    ),
    "sport": (
        ("The striker", "Our team", "The young goalkeeper", "The tennis player", "The coach", "The runner"),
        (
            "scored against",
            "trained hard for",
            "easily defeated",
            "lost narrowly to",
            "prepared a plan for",
            "celebrated a win over",
        ),
        (
            "the league champions",
            "the visiting side",
            "their old rivals",
            "the national team",
            "a stronger opponent",
            "the home crowd",
        ),
        (
            "in the final minute.",
            "at the stadium.",
            "after a long season.",
            "in front of the fans.",
            "in the second half.",
        ),
    ),
    "computing": (
        ("The programmer", "Our server", "The new laptop", "The database", "The engineer", "The compiler"),
        ("crashed while loading", "quickly processed", "slowly downloaded", "optimised", "rewrote", "failed to read"),
        (
            "the large dataset",
            "the software update",
            "the network logs",
            "the source code",
            "the user accounts",
            "the backup files",
        ),
        ("after midnight.", "in a few seconds.", "without any errors.", "during the release.", "on the cloud cluster."),
    ),
    "travel": (
        ("The tourists", "My brother", "The pilot", "A group of hikers", "The travel guide", "Our family"),
        ("flew to", "drove across", "explored", "took a train to", "got lost in", "booked a hotel in"),
        (
            "the ancient city",
            "the northern islands",
            "the desert canyon",
            "the capital",
            "the mountain village",
            "the old port town",
        ),
        ("last summer.", "for a week.", "on their honeymoon.", "with a small backpack.", "during the holidays."),
    ),
    "music": (
        ("The pianist", "The orchestra", "A street musician", "The choir", "The rock band", "My sister"),
        ("played", "rehearsed", "recorded", "performed", "wrote", "sang"),
        ("a quiet melody", "the famous symphony", "a new song", "an old folk tune", "the jazz standard", "a long solo"),
        ("at the concert hall.", "for the festival.", "in the studio.", "late at night.", "to a cheering crowd."),
    ),
    "health": (
        ("The doctor", "The nurse", "My father", "The patient", "The surgeon", "The pharmacist"),
        ("examined", "treated", "recommended", "prescribed", "explained", "monitored"),
        (
            "the broken arm",
            "a daily exercise routine",
            "the new medicine",
            "the high fever",
            "a healthy diet",
            "the blood pressure",
        ),
        (
            "at the hospital.",
            "after the accident.",
            "during the check-up.",
            "for several weeks.",
            "in the emergency room.",
        ),
    ),
    "animals": (
        ("The dog", "A small cat", "The old horse", "A flock of birds", "The fox", "The baby elephant"),
        ("chased", "slept next to", "played with", "ran away from", "watched", "followed"),
        ("the red ball", "the farmer", "a noisy squirrel", "the river", "the other animals", "the children"),
        ("in the garden.", "at the zoo.", "across the field.", "near the forest.", "all day long."),
    ),
}


def all_sentences(seed: int = 0) -> list[str]:
    """Every distinct sentence of the corpus (8 topics x 1080), in a fixed order shuffled by ``seed``."""
    out = []
    for subjects, verbs, objects, endings in TOPICS.values():
        for s, v, o, e in itertools.product(subjects, verbs, objects, endings):
            out.append(f"{s} {v} {o} {e}")
    assert len(set(out)) == len(out)  # the vocabularies never make two identical sentences
    order = np.random.default_rng(seed).permutation(len(out))
    return [out[i] for i in order]


def sentences(split: str = "train", n: int | None = None, *, seed: int = 0, train_size: int = 2000,
              heldout_size: int = 500) -> list[str]:  # fmt: skip
    """The first ``n`` sentences (default: all) of a split.

    Arguments:
        split: ``"train"`` (the first ``train_size`` sentences of the shuffled corpus) or
            ``"heldout"`` (the next ``heldout_size``): disjoint.
        n: how many to return, at most the split's size.
        seed: the shuffle of the corpus.
        train_size, heldout_size: the splits' sizes; together at most the corpus's 8640 sentences.
    """
    pool = all_sentences(seed)
    if train_size < 1 or heldout_size < 1 or train_size + heldout_size > len(pool):
        raise ValueError(
            f"Expected train_size >= 1, heldout_size >= 1 and train_size + heldout_size <= {len(pool)}. "
            f"Got train_size={train_size}, heldout_size={heldout_size}."
        )
    if split == "train":
        part = pool[:train_size]
    elif split == "heldout":
        part = pool[train_size : train_size + heldout_size]
    else:
        raise ValueError(f"Expected split 'train' or 'heldout'. Got {split!r}.")
    if n is None:
        return part
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(part):
        raise ValueError(f"Expected n an integer in [1, {len(part)}] (the {split} split's size). Got {n!r}.")
    return part[:n]
