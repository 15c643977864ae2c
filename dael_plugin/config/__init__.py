"""The configuration room: the keys the plugin adds to Dassl's config (``TRAINER.DAEL`` /
``TRAINER.DAELDG``, ``USE_TF32``), their defaults, and the checks every engine runs on a
merged config. Plain yacs, in Dassl's conventions: ``add_dael_config(cfg)`` after
``get_cfg_default()`` and before merging files."""

from dael_plugin.config.execution import Execution, execution_from_cfg
from dael_plugin.config.keys import (
    TRAINER_NODES,
    add_dael_config,
    check_dael_cfg,
    check_run_values,
    hparams_from_cfg,
    trainer_node,
)

__all__ = [
    "TRAINER_NODES",
    "Execution",
    "add_dael_config",
    "check_dael_cfg",
    "check_run_values",
    "execution_from_cfg",
    "hparams_from_cfg",
    "trainer_node",
]
