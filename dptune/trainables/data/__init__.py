"""The data: the catalog (:mod:`.catalog`, ``load_dataset``), where each set comes from and its size
without loading it, the embedded sets, public sets through HF ``datasets``, the splits and the
on-disk tensor cache."""
