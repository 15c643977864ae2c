"""DAEL as a Dassl trainer: the method the built-in engine runs (methods/dael.py), run on Dassl's
loop (dassl_adapter/method_trainer.py), and built as Dassl's own DAEL builds its model.

One class serves ``--trainer DAEL`` and ``--trainer DAELDG``. ``DAEL`` runs domain adaptation when
the dataset gives unlabeled target data (``train_u``) and domain generalisation otherwise;
``DAELDG`` always runs domain generalisation and never reads target training data.

What it keeps of Dassl's DAEL beyond another plugin method's trainer: F is Dassl's ``SimpleNet`` (``MODEL.HEAD``),
F and E have an optimiser and a scheduler each from Dassl's builders (``OPTIM.STAGED_LR`` and every
optimiser and schedule Dassl has), and Dassl's ``after_epoch`` runs between the method's hooks: its
evaluation under ``TEST.FINAL_MODEL best_val`` and its epoch files (``F/``, ``E/``), which
``--load-epoch`` and the best-val deployment read back, as Dassl-format checkpoints of Dassl's own
DAEL do. The "last" checkpoint, exact resume, records and the step are the method's.
"""

from __future__ import annotations

import os.path as osp
from typing import Optional

from dassl.engine.trainer import SimpleNet
from dassl.optim import build_lr_scheduler, build_optimizer
from yacs.config import CfgNode as CN

from dael_plugin.config import check_dael_cfg, trainer_node
from dael_plugin.dassl_adapter.checks import check_dataset_cfg
from dael_plugin.dassl_adapter.method_trainer import MethodTrainerXU
from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.engine import distributed
from dael_plugin.engine.hooks import DivergenceCheck, EpochRecords, HookBase, LastCheckpoint, StepSchedulers
from dael_plugin.errors import DAELConfigError
from dael_plugin.methods.dael import DAELBuiltin
from dael_plugin.transforms.host import check_transform_names

__all__ = ["DAELTrainer", "load_dassl_checkpoints"]


class DasslsDAEL(DAELBuiltin):
    """The DAEL method with Dassl's DAEL's model: F is Dassl's ``SimpleNet`` (backbone and
    ``MODEL.HEAD``), and F and E each have Dassl's optimiser and scheduler."""

    engine = "dassl"
    # Its "last" checkpoints hold "model"; those of the Dassl engine before it ran the method
    # hold "models" by name, read as well (load_run_state)
    resume_keys = ("data",)

    def __init__(self, cfg: CN, dassl_trainer: "DAELTrainer", **kwargs) -> None:
        self.dassl_trainer = dassl_trainer  # whose after_epoch runs between the hooks
        super().__init__(cfg, **kwargs)

    def build_hooks(self) -> list:
        # Dassl's own after_epoch (its evaluation and epoch files) after the divergence check and
        # before the epoch's record; the "last" checkpoint has no epoch files (Dassl's are the run's)
        self.checkpointer = LastCheckpoint()
        records = EpochRecords(self.selection) if self.selection is not None else None
        return [StepSchedulers(), DivergenceCheck(), DasslsAfterEpoch(self.dassl_trainer), records, self.checkpointer]

    def build_backbone(self):
        from dael_plugin.dassl_adapter.backbones import register_timm_backbone

        cfg = self.cfg  # a timm backbone's local weights, also under Dassl's own tools/train.py
        register_timm_backbone(
            cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.get("WEIGHTS", ""), tuple(int(v) for v in cfg.INPUT.SIZE)
        )
        f = SimpleNet(cfg, cfg.MODEL, 0)
        f.out_features = f.fdim
        return f

    def build_optimizers(self) -> dict:
        o, fuse, (f, e) = self.cfg.OPTIM, self.strategy.optimizer, (self.modules["F"], self.modules["E"])
        return {"F": fuse(build_optimizer(f, o)), "E": fuse(build_optimizer(e, *_expert_optim_args(e, o)))}

    def build_scheduler(self, optim):
        return build_lr_scheduler(optim, self.cfg.OPTIM)

    def saved_model(self, state: dict, path: str) -> dict:
        if "models" in state:  # the Dassl engine's checkpoints before it ran the method
            return {f"{n}.{k}": v for n, weights in state["models"].items() for k, v in weights.items()}
        return super().saved_model(state, path)

    def load_run_state(self, state: dict) -> None:
        if "models" in state:
            state = dict(state, model=self.saved_model(state, ""))
            gens = [ld.generator.manual_seed(self.seed).get_state() for ld in self._loaders()]
            state["data"] = dict(state["data"], loader_generators=gens)
        super().load_run_state(state)


class DasslsDAELDG(DasslsDAEL):
    uses_target = False


class DAELTrainer(MethodTrainerXU):
    """Domain Adaptive Ensemble Learning (Zhou et al.), on Dassl's machinery."""

    replaced_builtins: tuple = ()  # Dassl's own trainers this class replaced (set by register_into_dassl())

    def __init__(self, cfg: CN, eval_only: bool = False):
        if self.replaced_builtins:
            print(
                f"dael_plugin: this run uses dael_plugin's DAELTrainer, which replaced Dassl's built-in "
                f"trainer(s) {list(self.replaced_builtins)}"
            )
        super().__init__(cfg, eval_only=eval_only)

    @property
    def uses_target(self) -> bool:
        return self.method.uses_target

    def check_cfg(self, cfg: CN):
        check_dael_cfg(cfg)
        check_dataset_cfg(cfg)
        name = str(cfg.TRAINER.NAME).upper()
        check_transform_names(cfg.INPUT.TRANSFORMS, "INPUT.TRANSFORMS")
        check_transform_names(trainer_node(cfg).STRONG_TRANSFORMS, f"TRAINER.{name}.STRONG_TRANSFORMS")

    def build_method(self, splits: dict):
        cls = DasslsDAELDG if str(self.cfg.TRAINER.NAME).upper() == "DAELDG" else DasslsDAEL
        m = cls(self.cfg, self, eval_only=self.eval_only, splits=splits)
        print(f"DAEL setting: {'domain adaptation (L_u on)' if m.is_da else 'domain generalisation (no L_u)'}")
        return m

    # Dassl's names for the method's modules and optimisers
    F = property(lambda self: self.method.modules["F"])
    E = property(lambda self: self.method.modules["E"])
    optim_F = property(lambda self: self.method.optims["F"])
    optim_E = property(lambda self: self.method.optims["E"])
    algorithm = property(lambda self: self.method.algorithm)

    def save_model(self, epoch, directory, is_best=False, val_result=None, model_name=""):
        if distributed.world().is_main:  # under torchrun rank 0 alone writes
            super().save_model(epoch, directory, is_best=is_best, val_result=val_result, model_name=model_name)
        distributed.barrier()  # a "best" model is read back by every process after training

    def resume_model_if_exist(self, directory):
        if osp.isfile(osp.join(self.cfg.RESUME or directory, ckpt.LAST)):
            return super().resume_model_if_exist(directory)
        if any(osp.isfile(osp.join(directory, n, "checkpoint")) for n in self.get_model_names()):
            epoch = load_dassl_checkpoints(self, directory, None, resume=True)
            print(
                f"Resuming from Dassl-format checkpoints in {directory} (epoch {epoch}): they hold no RNG "
                "states, so this resume is not bitwise identical to an uninterrupted run"
            )
            return epoch
        return super().resume_model_if_exist(directory)

    def load_model(self, directory, epoch=None, name=None):
        """The last checkpoint, Dassl's epoch ``epoch`` files, or the file ``name`` (a protocol's
        ``model-best-<protocol>.pth.tar``) of ``directory``; returns its epoch count. Under
        ``TEST.FINAL_MODEL best_val``, without ``epoch`` or ``name``: the ``model-best.pth.tar`` files
        that Dassl's ``after_epoch`` saved at the best validation result, as Dassl's own
        ``load_model`` (its ``after_train`` deploys that model with ``load_model(OUTPUT_DIR)``)."""
        plain = name is None and epoch is None
        best = plain and self.cfg.TEST.FINAL_MODEL == "best_val"
        if best or not (name is not None or plain and osp.isfile(osp.join(directory, ckpt.LAST))):
            return load_dassl_checkpoints(self, directory, epoch)
        return super().load_model(directory, name=name)

    def model_inference(self, input):
        return self.method.algorithm.predict(input)


class DasslsAfterEpoch(HookBase):
    """Dassl's own ``after_epoch``: its evaluation (``TEST.FINAL_MODEL best_val``) and its epoch
    files (``TRAIN.CHECKPOINT_FREQ``), between the method's hooks."""

    def __init__(self, dassl_trainer) -> None:
        self.dassl_trainer = dassl_trainer

    def after_epoch(self) -> None:
        super(MethodTrainerXU, self.dassl_trainer).after_epoch()


def load_dassl_checkpoints(trainer, directory: str, epoch: Optional[int] = None, resume: bool = False) -> int:
    """Dassl's ``TrainerBase.load_model`` without its crash, with ``weights_only=True``.

    Dassl formats ``val_result`` with ``:.1f``, which fails on checkpoints saved
    with ``val_result=None`` (every run without a validation split, i.e. the
    usual DA and DG runs). The CLI's ``--eval-only`` uses this for any Dassl
    trainer that does not override ``load_model``. Checkpoints of Dassl's own
    DAEL load into the plugin's trainer: its experts are converted as they
    load (``ExpertHeads`` accepts ``linears.<k>.*``). Returns the epoch.
    """
    if not directory:
        raise DAELConfigError("no --model-dir given; pass the OUTPUT_DIR of a run")
    epoch_done = 0
    for name in trainer.get_model_names():
        folder = osp.join(directory, name)
        if resume or epoch is None:
            marker = osp.join(folder, "checkpoint")
            if resume and osp.isfile(marker):
                with open(marker) as f:
                    model_file = f.readline().strip()
            else:
                model_file = "model-best.pth.tar" if osp.isfile(osp.join(folder, "model-best.pth.tar")) else None
                if model_file is None and osp.isfile(marker):
                    with open(marker) as f:
                        model_file = f.readline().strip()
        else:
            model_file = f"model.pth.tar-{epoch}"
        path = osp.join(folder, model_file or "model-best.pth.tar")
        if not osp.exists(path):
            raise DAELConfigError(
                f"no checkpoint {path}; pass --model-dir <OUTPUT_DIR of a run> and --load-epoch <epoch>"
            )
        state = ckpt.load_checkpoint(path)
        ckpt.load_weights(trainer._models[name], state.get("state_dict", {}), path, what=f"model {name}")
        if resume:
            if state.get("optimizer") is not None and trainer._optims[name] is not None:
                trainer._optims[name].load_state_dict(state["optimizer"])
            if state.get("scheduler") is not None and trainer._scheds[name] is not None:
                ckpt.load_sched_state(trainer._scheds[name], state["scheduler"])
        epoch_done = int(state.get("epoch", 0))
        print(f"Load {path} to {name} (epoch={epoch_done}, val_result={state.get('val_result')})")
    return epoch_done


def _expert_optim_args(heads, optim_cfg: CN) -> tuple:
    """``build_optimizer``'s config and parameter groups for the experts, with ``OPTIM.STAGED_LR`` as
    Dassl's DAEL has it. Dassl stages the rates by child module: its experts are the child
    ``linears`` (K linear layers), at ``LR`` where ``OPTIM.NEW_LAYERS`` names it and at
    ``LR * BASE_LR_MULT`` otherwise. ``ExpertHeads`` holds the same weights with no child module,
    which Dassl's staging would leave out of every group (experts that never train)."""
    if not optim_cfg.STAGED_LR:
        return optim_cfg, None
    new = [optim_cfg.NEW_LAYERS] if isinstance(optim_cfg.NEW_LAYERS, str) else list(optim_cfg.NEW_LAYERS)
    lr = optim_cfg.LR if "linears" in new else optim_cfg.LR * optim_cfg.BASE_LR_MULT
    plain = optim_cfg.clone()  # the groups given: Dassl would warn that staged_lr is ignored
    plain.defrost()
    plain.STAGED_LR = False
    return plain, [{"params": list(heads.parameters()), "lr": lr}]
