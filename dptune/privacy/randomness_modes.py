"""The two randomness modes of a run and how they are named to users (standard library only:
the store's readers and the report use them without torch; ``trainables/engine/randomness.py`` draws).

- ``reproducible``: every stream derived from the run's seed. For research: a run replays bit for
  bit, but anyone with the seed can regenerate its noise, so its model is NOT for release.
- ``secure``: a fresh OS secret per run keys a CSPRNG; the model may be released.
"""
from __future__ import annotations

#: The modes; the first is the default (a sweep studies hyperparameters and wants its trials
#: replayable; what is released is rerun, or exported, in secure mode).
RANDOMNESS = ("reproducible", "secure")
#: How ``dptune train``, the store's readers and the report name each mode.
RANDOMNESS_LABELS = {"reproducible": "reproducible (seeded: NOT for release)",
                     "secure": "secure (secret CSPRNG: releasable)"}
