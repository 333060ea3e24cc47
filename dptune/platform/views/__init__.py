"""What a user asks of an experiment once it has run or while it runs: ``dptune status``
(``status``), ``dptune export`` (``export``), ``dptune audit`` (``audit_command``) and the per-sample
gradients of a checkpoint for ``dptune optimal-clip`` (``checkpoint_gradients``)."""
