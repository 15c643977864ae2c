"""What both engines share: the DAEL training step and its execution options (``step``,
``execution``), the divergence guard (``guard``), checkpoints (``checkpoint``), the run lock
(``runlock``), run records and provenance (``results``, ``records``), the one atomic writer
(``atomic``) and the launch counter used by the bench (``profiling``). Nothing here imports an
engine or a tool."""
