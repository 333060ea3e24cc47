"""dptune: hyperparameter search for differentially private training, on Ray Tune."""
__version__ = "0.1.0"
