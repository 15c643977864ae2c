"""DAEL as a Dassl trainer: a thin adapter over ``dael_plugin.core``.

One class serves ``--trainer DAEL`` and ``--trainer DAELDG``. It runs domain
adaptation when the dataset gives unlabeled target data (``train_u``) and
domain generalisation otherwise, reading ``cfg.TRAINER.<NAME>``.
"""
from __future__ import annotations

import os.path as osp
from typing import List, Optional, Tuple

import torch
from tqdm import tqdm

from dassl.data import DataManager
from dassl.engine import TrainerX, TrainerXU
from dassl.engine.trainer import SimpleNet
from dassl.optim import build_lr_scheduler, build_optimizer
from dassl.utils import count_num_param, load_checkpoint

from ..augment import build_views, check_names
from ..config import check_dael_cfg, hparams_from_cfg, trainer_node
from ..core import DAEL, build_heads
from ..errors import DAELConfigError
from .checks import check_dataset_cfg


def split_domains(domain: torch.Tensor, per_domain: int, num_domains: int) -> Tuple[List[int], torch.Tensor]:
    """Chunk sizes and per-sample expert index of a domain-balanced batch.

    ``domain`` is the loader's CPU tensor, so the checks cost no device sync.
    Dassl's reference silently takes each chunk's first label; a batch from a
    sampler that is not domain-balanced is refused here instead.
    """
    n = domain.numel()
    if n % per_domain != 0:
        raise DAELConfigError(
            f"a training batch of {n} images does not split into chunks of {per_domain} per domain; "
            "use DATALOADER.TRAIN_X.SAMPLER RandomDomainSampler with a divisible BATCH_SIZE"
        )
    blocks = domain.view(-1, per_domain)
    if not bool((blocks == blocks[:, :1]).all()) or int(domain.max()) >= num_domains:
        raise DAELConfigError(
            "a training batch is not made of contiguous single-domain chunks; DAEL needs a "
            "domain-balanced sampler: set DATALOADER.TRAIN_X.SAMPLER RandomDomainSampler"
        )
    return [per_domain] * blocks.shape[0], domain.long()


class DAELTrainer(TrainerXU):
    """Domain Adaptive Ensemble Learning (Zhou et al.), on Dassl's machinery."""

    def __init__(self, cfg):
        self.hparams = hparams_from_cfg(cfg)
        super().__init__(cfg)
        n_domain = cfg.DATALOADER.TRAIN_X.N_DOMAIN
        if n_domain <= 0:
            n_domain = self.num_source_domains
        self.split_batch = cfg.DATALOADER.TRAIN_X.BATCH_SIZE // n_domain
        self.expert_accuracy: List[float] = []

    def check_cfg(self, cfg):
        check_dael_cfg(cfg)
        check_dataset_cfg(cfg)
        node = trainer_node(cfg)
        name = str(cfg.TRAINER.NAME).upper()
        check_names(cfg.INPUT.TRANSFORMS, "INPUT.TRANSFORMS", dassl=True)
        check_names(node.STRONG_TRANSFORMS, f"TRAINER.{name}.STRONG_TRANSFORMS", dassl=True)

    def build_data_loader(self):
        cfg = self.cfg
        node = trainer_node(cfg)
        views = build_views(cfg, node.STRONG_TRANSFORMS, self.hparams.num_views, node, use_dassl=True)
        dm = DataManager(cfg, custom_tfm_train=views)
        self.train_loader_x = dm.train_loader_x
        self.train_loader_u = dm.train_loader_u
        self.val_loader = dm.val_loader
        self.test_loader = dm.test_loader
        self.num_classes = dm.num_classes
        self.num_source_domains = dm.num_source_domains
        self.lab2cname = dm.lab2cname
        self.dm = dm
        self.is_da = dm.train_loader_u is not None
        print(f"DAEL setting: {'domain adaptation (L_u on)' if self.is_da else 'domain generalisation (no L_u)'}")

    def build_model(self):
        cfg = self.cfg
        print("Building F")
        self.F = SimpleNet(cfg, cfg.MODEL, 0)
        self.F.to(self.device)
        print(f"# params: {count_num_param(self.F):,}")
        self.optim_F = build_optimizer(self.F, cfg.OPTIM)
        self.sched_F = build_lr_scheduler(self.optim_F, cfg.OPTIM)
        self.register_model("F", self.F, self.optim_F, self.sched_F)

        print("Building E")
        self.E = build_heads(self.F.fdim, self.num_classes, self.num_source_domains, self.hparams)
        self.E.to(self.device)
        print(f"# params: {count_num_param(self.E):,}")
        self.optim_E = build_optimizer(self.E, cfg.OPTIM)
        self.sched_E = build_lr_scheduler(self.optim_E, cfg.OPTIM)
        self.register_model("E", self.E, self.optim_E, self.sched_E)
        self.algorithm = DAEL(self.F, self.E, self.hparams)

    def run_epoch(self):
        if self.is_da:
            return TrainerXU.run_epoch(self)
        return TrainerX.run_epoch(self)

    def _views(self, batch) -> List[torch.Tensor]:
        keys = ["img", "img2", "img3"][: self.hparams.num_views]
        return [batch[k].to(self.device, non_blocking=True) for k in keys]

    def forward_backward(self, batch_x, batch_u: Optional[dict] = None):
        chunk_sizes, expert_idx = split_domains(batch_x["domain"], self.split_batch, self.num_source_domains)
        x_views = self._views(batch_x)
        labels = batch_x["label"].to(self.device, non_blocking=True)
        expert_idx = expert_idx.to(self.device, non_blocking=True)
        u_views = self._views(batch_u) if (self.is_da and batch_u is not None) else None
        out = self.algorithm.losses(x_views, labels, expert_idx, chunk_sizes, u_views)
        self.model_backward_and_update(out["loss"])
        keys = ["loss_x", "acc_x", "loss_cr"] + (["loss_u", "mask_u"] if self.is_da else [])
        # 0-dim tensors: Dassl's MetricMeter reads them on the host, outside this step.
        return {k: out[k].detach() for k in keys}

    def detect_anomaly(self, loss):
        # Dassl's check syncs the host each step; this one raises asynchronously on GPU.
        torch._assert_async(torch.isfinite(loss).all(), "Loss is infinite or NaN!")

    def after_epoch(self):
        # Step the schedulers once per epoch here rather than on a batch index
        # (Dassl's sampler length can differ from the real epoch length).
        self.update_lr()
        super().after_epoch()

    def model_inference(self, input):
        return self.algorithm.predict(input)

    @torch.no_grad()
    def test(self, split=None):
        """Dassl's test loop, plus each expert's own accuracy."""
        self.set_model_mode("eval")
        self.evaluator.reset()
        if split is None:
            split = self.cfg.TEST.SPLIT
        if split == "val" and self.val_loader is not None:
            data_loader = self.val_loader
        else:
            split = "test"
            data_loader = self.test_loader
        print(f"Evaluate on the *{split}* set")
        correct = torch.zeros(self.E.num_experts, device=self.device)
        total = 0
        for batch in tqdm(data_loader):
            input, label = self.parse_batch_test(batch)
            probs = self.algorithm.predict_experts(input)
            self.evaluator.process(probs.mean(1), label)
            correct += (probs.argmax(-1) == label.unsqueeze(1)).sum(0)
            total += label.shape[0]
        results = self.evaluator.evaluate()
        self.expert_accuracy = (100.0 * correct / max(total, 1)).tolist()
        names = list(self.cfg.DATASET.SOURCE_DOMAINS) if self.E.num_experts > 1 else ["single"]
        print("* expert accuracy: " + ", ".join(f"{n} {a:.2f}%" for n, a in zip(names, self.expert_accuracy)))
        for k, v in results.items():
            self.write_scalar(f"{split}/{k}", v, self.epoch)
        for n, a in zip(names, self.expert_accuracy):
            self.write_scalar(f"{split}/expert_{n}", a, self.epoch)
        return list(results.values())[0]

    def load_model(self, directory, epoch=None):
        load_dassl_checkpoints(self, directory, epoch)


def load_dassl_checkpoints(trainer, directory: str, epoch: Optional[int] = None) -> None:
    """Dassl's ``TrainerBase.load_model`` without its crash.

    Dassl formats ``val_result`` with ``:.1f``, which fails on checkpoints saved
    with ``val_result=None`` (every run without a validation split, i.e. the
    usual DA and DG runs). The CLI's ``--eval-only`` uses this for any Dassl
    trainer that does not override ``load_model``.
    """
    if not directory:
        print("Note that load_model() is skipped as no pretrained model is given")
        return
    model_file = "model-best.pth.tar" if epoch is None else f"model.pth.tar-{epoch}"
    for name in trainer.get_model_names():
        path = osp.join(directory, name, model_file)
        if not osp.exists(path):
            raise DAELConfigError(
                f"no checkpoint {path}; pass --model-dir <OUTPUT_DIR of a run> and --load-epoch <epoch>"
            )
        ckpt = load_checkpoint(path)
        print(f"Load {path} to {name} (epoch={ckpt['epoch']}, val_result={ckpt.get('val_result')})")
        trainer._models[name].load_state_dict(ckpt["state_dict"])
