"""The commands: ``train`` (``scripts/train.py``, ``dael-train``), ``sweep``, ``collect``,
``plots`` and ``demo``. Tools import the rest of the package; nothing imports a tool."""
