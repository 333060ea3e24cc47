"""dptune: hyperparameter search for differentially private training, on Ray Tune."""
__version__ = "0.1.0"


def open_store(path: str) -> "dptune.analysis.notebook.Results":  # noqa: F821
    """A results store for a notebook: its tables as DataFrames, its figures as matplotlib figures
    (:mod:`dptune.analysis.notebook`). Imported on first use, so ``import dptune`` stays light."""
    from .analysis.notebook import open_store as _open

    return _open(path)
