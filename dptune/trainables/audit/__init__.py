"""``dptune audit``: a one-run empirical lower bound on ε (:mod:`.run`), its canaries and the
deliberately broken engines that are its known answers."""
