"""The Dassl engine's test of the plugin's trainers (DAEL's, and any other plugin method's):
Dassl's evaluator, with each expert's and each class's accuracy beside it."""

from __future__ import annotations

import sys
from typing import List, Optional

import torch

from dael_plugin.engine.evaluate import evaluate_experts, report_experts
from dael_plugin.engine.loop import pick_eval_split


@torch.no_grad()
def dassl_test(trainer, split: Optional[str], predict_experts, expert_names: List[str]) -> float:
    """Dassl's test loop with Dassl's evaluator, plus each expert's own accuracy (``expert_names``)
    and each class's; unreadable images are left out. Returns the evaluator's first result."""
    trainer.set_model_mode("eval")
    trainer.evaluator.reset()
    split, data_loader = pick_eval_split(split or trainer.cfg.TEST.SPLIT, trainer.val_loader, trainer.test_loader)
    print(f"Evaluate on the *{split}* set")
    tally, _ = evaluate_experts(
        predict_experts, data_loader, trainer.device, trainer.bad_images, sys.stderr.isatty(), trainer.ensemble_mask
    )
    if tally.total:  # Dassl's evaluator sees the whole (gathered) set once: its argmax is the ensemble's
        yt, yp = tally.labels()
        trainer.evaluator.process(torch.nn.functional.one_hot(yp, trainer.num_classes).float(), yt)
    results = trainer.evaluator.evaluate()
    classnames = [trainer.lab2cname.get(i, str(i)) for i in range(trainer.num_classes)]
    trainer.per_class_accuracy, trainer.expert_accuracy = report_experts(
        tally, classnames, expert_names, lambda tag, v: trainer.write_scalar(tag, v, trainer.epoch), split
    )
    for k, v in results.items():
        trainer.write_scalar(f"{split}/{k}", v, trainer.epoch)
    return list(results.values())[0]
