"""A sweep on Ray Tune: the driver (``driver``: ``dptune sweep`` and ``dptune resume``), the searcher
of a plan's cells (``searcher``, ``cell_search``), early stopping (``schedulers``), the trial bodies
in their Ray processes (``dp_trial``, ``pack_trial``, ``multi_worker``), starting or joining Ray
(``launcher``, ``ray_*``) and the driver's callbacks (``store_callback``, ``live_status``,
``progress``, ``trackers``)."""
