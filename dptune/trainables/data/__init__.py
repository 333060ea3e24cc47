"""The data: the catalog (:mod:`.catalog`, ``load_dataset``), where each set comes from and its size
without loading it, the embedded sets, public sets through HF ``datasets``, the splits and the
on-disk tensor cache."""
from ...lazy_names import lazy_names

__all__ = ["load_dataset"]
#: ``load_dataset`` (a public name of ``dptune.trainables``), imported on first use: a light submodule of this package loads
#: without the catalog's torch and model/data libraries
__getattr__ = lazy_names(__name__, {"load_dataset": ".catalog"})
