"""The results store of an experiment: where its files live (``layout``), writes that survive a crash
(``durable``), the rows of a trial (``records``), the Parquet store read through DuckDB
(``results_store``) and its read-only queries (``query``). No Ray, nothing of ``sweep`` or ``views``:
the analysis and a notebook read a store with this package alone."""
