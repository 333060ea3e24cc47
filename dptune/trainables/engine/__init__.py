"""The DP step: per-sample norms and clipped sums (the book-keeping engine and its layer rules),
clipping factors, noise, normalisation, denoising, data-parallel workers, Poisson sampling, where
the random numbers come from, and the optimizers of the privatised gradient (``DPEngine`` in
:mod:`.dp_engine`)."""
