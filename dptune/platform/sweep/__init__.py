"""A sweep on Ray Tune: the driver (``driver``: ``dptune sweep`` and ``dptune resume``), the searcher
of a plan's cells (``searcher``, ``cell_search``), early stopping (``schedulers``), the trial body
in its Ray process (``dp_trial``: a single trial's or a pack's run, also on the Ray Train workers of
``multi_worker``), starting or joining Ray
(``launcher``, ``ray_*``) and the driver's callbacks (``store_callback``, ``live_status``,
``progress``, ``trackers``)."""
